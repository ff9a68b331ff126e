package guard

import (
	"context"
	"sync"
)

// MemoryStore keeps the highest marks in memory. It is correct only when
// the guarded data is itself in memory and dies with the process: data that
// survives a restart needs a store that survives with it (boltguard, the SQL
// and Redis adapters). It is safe for concurrent use; scopes do not contend.
type MemoryStore struct {
	scopes sync.Map // scope → *memScope
}

type memScope struct {
	mu      sync.Mutex
	highest Mark
}

// NewMemoryStore returns an empty MemoryStore.
func NewMemoryStore() *MemoryStore { return &MemoryStore{} }

// Fence implements Store.
func (m *MemoryStore) Fence(ctx context.Context, w Write, strict bool, apply func(ctx context.Context) error) error {
	v, ok := m.scopes.Load(w.Token.Scope)
	if !ok {
		v, _ = m.scopes.LoadOrStore(w.Token.Scope, &memScope{})
	}
	s := v.(*memScope)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := Check(w.Token.Scope, s.highest, w, strict); err != nil {
		return err
	}
	if err := apply(ctx); err != nil {
		return err
	}
	s.highest = Next(s.highest, w)
	return nil
}

// Highest returns the highest mark accepted for scope.
func (m *MemoryStore) Highest(scope string) Mark {
	v, ok := m.scopes.Load(scope)
	if !ok {
		return Mark{}
	}
	s := v.(*memScope)
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.highest
}
