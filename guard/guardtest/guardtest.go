// Package guardtest is the conformance suite every guard.Store must pass,
// in the manner of testing/fstest: call Run from a test of the store's own
// package with a way to open (and, for durable stores, reopen) it.
package guardtest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/guard"
)

// Harness tells Run how to get stores.
type Harness struct {
	// Open returns a new, empty store. Run calls it once per subtest; scope
	// names are unique to each subtest, so stores may share a backend.
	Open func(t *testing.T) guard.Store
	// Reopen closes s and opens the same data again, as after a restart of
	// the guarded resource. Nil for a store that does not survive restarts
	// (guard.MemoryStore).
	Reopen func(t *testing.T, s guard.Store) guard.Store
}

var unique struct {
	mu sync.Mutex
	n  int
}

// scope returns a scope name no other subtest of this process uses.
func scope(t *testing.T) string {
	unique.mu.Lock()
	defer unique.mu.Unlock()
	unique.n++
	return fmt.Sprintf("guardtest/%d/%d", rand.Uint32(), unique.n)
}

func tok(scope string, v uint64) guard.Write {
	return guard.Write{Token: fence.Token{Scope: scope, Value: v}}
}

// write fences one write, recording whether apply ran.
func write(t *testing.T, s guard.Store, w guard.Write, strict bool) (applied bool, err error) {
	t.Helper()
	err = s.Fence(context.Background(), w, strict, func(context.Context) error {
		applied = true
		return nil
	})
	if err != nil && applied {
		t.Fatalf("Fence(%v) returned %v after calling apply", w, err)
	}
	return applied, err
}

func mustAccept(t *testing.T, s guard.Store, w guard.Write, strict bool) {
	t.Helper()
	if applied, err := write(t, s, w, strict); err != nil || !applied {
		t.Fatalf("write token %d seq %d: applied %v, err %v; want accepted", w.Token.Value, w.Seq, applied, err)
	}
}

func mustRefuse(t *testing.T, s guard.Store, w guard.Write, strict bool, highest uint64) {
	t.Helper()
	applied, err := write(t, s, w, strict)
	var stale *guard.StaleError
	if applied || !errors.As(err, &stale) || !errors.Is(err, fence.ErrStale) {
		t.Fatalf("write token %d seq %d: applied %v, err %v; want a StaleError", w.Token.Value, w.Seq, applied, err)
	}
	if stale.Scope != w.Token.Scope || stale.Presented != w.Token.Value || stale.Highest != highest {
		t.Fatalf("StaleError %+v, want scope %q presented %d highest %d", stale, w.Token.Scope, w.Token.Value, highest)
	}
}

// Run runs the conformance suite.
func Run(t *testing.T, h Harness) {
	t.Run("Order", func(t *testing.T) {
		s, sc := h.Open(t), scope(t)
		mustAccept(t, s, tok(sc, 41), false)
		mustAccept(t, s, tok(sc, 42), false)
		mustRefuse(t, s, tok(sc, 41), false, 42)
		mustAccept(t, s, tok(sc, 42), false) // the current epoch may write again
		mustRefuse(t, s, tok(sc, 1), false, 42)
		mustAccept(t, s, tok(sc, fence.MaxToken), false)
		mustRefuse(t, s, tok(sc, fence.MaxToken-1), false, fence.MaxToken)
	})
	t.Run("ScopesAreIndependent", func(t *testing.T) {
		s, a, b := h.Open(t), scope(t), scope(t)
		mustAccept(t, s, tok(a, 100), false)
		mustAccept(t, s, tok(b, 1), false)
		mustRefuse(t, s, tok(a, 99), false, 100)
	})
	t.Run("FailedApplyRecordsNothing", func(t *testing.T) {
		s, sc := h.Open(t), scope(t)
		mustAccept(t, s, tok(sc, 10), false)
		boom := errors.New("boom")
		err := s.Fence(context.Background(), tok(sc, 50), false, func(context.Context) error { return boom })
		if !errors.Is(err, boom) {
			t.Fatalf("Fence with a failing apply = %v, want the apply's error", err)
		}
		mustAccept(t, s, tok(sc, 45), false)
	})
	t.Run("Sequence", func(t *testing.T) {
		s, sc := h.Open(t), scope(t)
		seq := func(v, n uint64) guard.Write { w := tok(sc, v); w.Seq = n; return w }
		mustAccept(t, s, seq(12, 1), false)
		mustAccept(t, s, seq(12, 2), false)
		mustAccept(t, s, seq(12, 2), false) // not strict: the same sequence passes
		mustRefuse(t, s, seq(12, 1), false, 12)
		strict := scope(t)
		sseq := func(v, n uint64) guard.Write { w := tok(strict, v); w.Seq = n; return w }
		mustAccept(t, s, sseq(12, 1), true)
		mustAccept(t, s, sseq(12, 2), true)
		mustRefuse(t, s, sseq(12, 2), true, 12)
		mustRefuse(t, s, sseq(12, 1), true, 12)
		mustAccept(t, s, sseq(13, 1), true) // a new epoch starts its own sequence
		mustRefuse(t, s, sseq(12, 9), true, 13)
	})
	t.Run("TokensBeyondFloat64", func(t *testing.T) {
		// As doubles, 2^53 == 2^53+1 and 2^63-2 == 2^63-1: a store that
		// compared or kept tokens as floating point would accept the
		// older one, or record a rounded mark.
		s := h.Open(t)
		for _, p := range [][2]uint64{{1 << 53, 1<<53 + 1}, {fence.MaxToken - 1, fence.MaxToken}} {
			sc := scope(t)
			mustAccept(t, s, tok(sc, p[0]), false)
			mustAccept(t, s, tok(sc, p[1]), false)
			mustRefuse(t, s, tok(sc, p[0]), false, p[1])
		}
	})
	t.Run("MatchesCheck", func(t *testing.T) {
		s := h.Open(t)
		MatchesCheck(t, func(w guard.Write, strict bool) error {
			applied, err := write(t, s, w, strict)
			if err == nil && !applied {
				t.Fatalf("write %+v: accepted, but apply did not run", w)
			}
			return err
		})
	})
	t.Run("GuardRefusesMalformedAndForeignTokens", func(t *testing.T) { hostile(t, h.Open(t)) })
	t.Run("Concurrent", func(t *testing.T) { concurrent(t, h.Open(t)) })
	if _, ok := h.Open(t).(guard.Lister); ok {
		t.Run("Lists", func(t *testing.T) { lists(t, h) })
	}
	if h.Reopen != nil {
		t.Run("SurvivesRestart", func(t *testing.T) {
			s, sc := h.Open(t), scope(t)
			mustAccept(t, s, tok(sc, 42), false)
			s = h.Reopen(t, s)
			mustRefuse(t, s, tok(sc, 41), false, 42)
			mustAccept(t, s, tok(sc, 42), false)
		})
	}
}

// lists checks a guard.Lister: it names exactly the scopes under a prefix
// that have a mark, whatever characters they hold, before and after a
// restart.
func lists(t *testing.T, h Harness) {
	s := h.Open(t)
	p := scope(t) + "/é/"
	want := []string{p + "a", p + "b/c", p + `*?[x]\{y}`, p + "é"}
	for _, sc := range want {
		mustAccept(t, s, tok(sc, 7), false)
	}
	// Near misses: a sibling, the prefix in capitals, a longer name that
	// shares the prefix but one byte, and a scope whose only write failed.
	for _, sc := range []string{p[:len(p)-1] + "x/a", strings.ToUpper(p) + "a"} {
		mustAccept(t, s, tok(sc, 7), false)
	}
	err := s.Fence(context.Background(), tok(p+"failed", 7), false, func(context.Context) error { return errors.New("boom") })
	if err == nil {
		t.Fatal("Fence with a failing apply succeeded")
	}
	check := func(s guard.Store) {
		t.Helper()
		got, err := s.(guard.Lister).Scopes(context.Background(), p)
		if err != nil {
			t.Fatalf("Scopes(%q): %v", p, err)
		}
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Errorf("Scopes(%q) = %q, want %q", p, got, want)
		}
	}
	check(s)
	if h.Reopen != nil {
		check(h.Reopen(t, s))
	}
}

// MatchesCheck presents random writes through write, to a new scope for
// each strictness, and compares every outcome with guard.Check on a model
// mark kept by guard.Next: a store's rule must be guard.Check's, refusal
// for refusal, down to the mark its StaleError reports. write must fence
// w with the given strictness and return nil if and only if w was
// applied. Run calls it on a Store's Fence; call it for a fenced writer
// that is not a Store.
func MatchesCheck(t *testing.T, write func(w guard.Write, strict bool) error) {
	t.Helper()
	for _, strict := range []bool{false, true} {
		sc := scope(t)
		var model guard.Mark
		for range 200 {
			w := tok(sc, 1+rand.Uint64N(4))
			w.Seq = rand.Uint64N(4)
			want := guard.Check(sc, model, w, strict)
			err := write(w, strict)
			if want == nil {
				if err != nil {
					t.Fatalf("strict %v: write %+v over %+v: %v, want accepted", strict, w, model, err)
				}
				model = guard.Next(model, w)
				continue
			}
			var stale *guard.StaleError
			if !errors.As(err, &stale) || *stale != *want.(*guard.StaleError) {
				t.Fatalf("strict %v: write %+v over %+v: %v, want %v", strict, w, model, err, want)
			}
		}
	}
}

// hostile presents, through a guard.Guard over s, tokens no writer should
// hold: malformed values, a token of another scope (a greater one, which
// would lock the scope's writers out if it were recorded), a token without
// a scope. Each is refused before s is touched, and both scopes' marks stay
// exactly where they were.
func hostile(t *testing.T, s guard.Store) {
	a, b := scope(t), scope(t)
	mustAccept(t, s, tok(a, 5), false)
	mustAccept(t, s, tok(b, 3), false)
	g := guard.New(s)
	for _, c := range []struct {
		name  string
		scope string
		w     guard.Write
		want  error
	}{
		{"token 0", a, tok(a, 0), fence.ErrInvalid},
		{"token 2^63", a, tok(a, fence.MaxToken+1), fence.ErrInvalid},
		{"token 2^64-1", a, tok(a, 1<<64-1), fence.ErrInvalid},
		{"token of another scope", a, tok(b, fence.MaxToken), guard.ErrWrongScope},
		{"token of another scope, the other way", b, tok(a, fence.MaxToken), guard.ErrWrongScope},
		{"token without a scope", a, tok("", fence.MaxToken), guard.ErrWrongScope},
	} {
		applied := false
		err := g.Fence(context.Background(), c.scope, c.w, func(context.Context) error {
			applied = true
			return nil
		})
		if applied || !errors.Is(err, c.want) {
			t.Errorf("%s: applied %v, err %v; want %v and nothing applied", c.name, applied, err, c.want)
		}
	}
	mustAccept(t, s, tok(a, 5), false)
	mustRefuse(t, s, tok(a, 4), false, 5)
	mustAccept(t, s, tok(b, 3), false)
	mustRefuse(t, s, tok(b, 2), false, 3)
}

// concurrent has many goroutines present random older and newer tokens for
// a few scopes at once. The writes each scope applied must be in
// non-decreasing token order, and the last one must carry the highest
// token presented: invariant 6 under interleavings.
func concurrent(t *testing.T, s guard.Store) {
	const (
		workers = 32
		writes  = 50
		scopes  = 3
	)
	names := make([]string, scopes)
	for i := range names {
		names[i] = scope(t)
	}
	var (
		mu        sync.Mutex
		applied   = map[string][]uint64{}
		presented = map[string]uint64{}
		wg        sync.WaitGroup
	)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range writes {
				sc := names[rand.IntN(scopes)]
				v := uint64(1 + rand.IntN(100))
				mu.Lock()
				presented[sc] = max(presented[sc], v)
				mu.Unlock()
				err := s.Fence(context.Background(), tok(sc, v), false, func(context.Context) error {
					mu.Lock()
					applied[sc] = append(applied[sc], v)
					mu.Unlock()
					return nil
				})
				if err != nil && !errors.Is(err, fence.ErrStale) {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	for _, sc := range names {
		log := applied[sc]
		for i := 1; i < len(log); i++ {
			if log[i] < log[i-1] {
				t.Fatalf("%s: applied token %d after %d", sc, log[i], log[i-1])
			}
		}
		if len(log) > 0 && log[len(log)-1] != presented[sc] {
			t.Fatalf("%s: last applied token %d, but %d was presented", sc, log[len(log)-1], presented[sc])
		}
	}
}
