package guard_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/guard"
)

func noop(context.Context) error { return nil }

// BenchmarkMemoryStoreFence is the in-memory check on one scope,
// uncontended.
func BenchmarkMemoryStoreFence(b *testing.B) {
	s := guard.NewMemoryStore()
	w := guard.Write{Token: fence.Token{Scope: "orders", Value: 1}}
	ctx := context.Background()
	for b.Loop() {
		if err := s.Fence(ctx, w, false, noop); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkMemoryStoreFenceParallel checks writes from GOMAXPROCS
// goroutines, each on its own scope: scopes do not contend.
func BenchmarkMemoryStoreFenceParallel(b *testing.B) {
	s := guard.NewMemoryStore()
	var n atomic.Int64
	b.RunParallel(func(pb *testing.PB) {
		w := guard.Write{Token: fence.Token{Scope: fmt.Sprint("s", n.Add(1)), Value: 1}}
		ctx := context.Background()
		for pb.Next() {
			if err := s.Fence(ctx, w, false, noop); err != nil {
				b.Fatal(err)
			}
		}
	})
}
