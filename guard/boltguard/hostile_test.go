package boltguard_test

import (
	"context"
	"errors"
	"path/filepath"
	"testing"

	"go.etcd.io/bbolt"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/guard"
	"github.com/fence-dev/fence/guard/boltguard"
)

// TestUpdateRefusesMalformedTokens calls Update directly, as the package
// documents, with tokens no service issues. Each is refused as invalid,
// the write does not run and the mark stays where it was: a token of
// 2^64-1 recorded once would refuse every honest writer of the scope for
// good.
func TestUpdateRefusesMalformedTokens(t *testing.T) {
	s, err := boltguard.Open(filepath.Join(t.TempDir(), "g.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	ctx := context.Background()
	noop := func(*bbolt.Tx) error { return nil }
	if err := s.Update(ctx, "orders", guard.Write{Token: fence.Token{Scope: "orders", Value: 5}}, false, noop); err != nil {
		t.Fatal(err)
	}
	for _, w := range []guard.Write{
		{Token: fence.Token{Scope: "orders", Value: 0}},
		{Token: fence.Token{Scope: "orders", Value: fence.MaxToken + 1}},
		{Token: fence.Token{Scope: "orders", Value: 1<<64 - 1}},
		{Token: fence.Token{Scope: "orders", Value: 0}, Seq: 1<<64 - 1},
		{Token: fence.Token{Scope: "", Value: 6}},
	} {
		ran := false
		err := s.Update(ctx, "orders", w, false, func(*bbolt.Tx) error { ran = true; return nil })
		if ran || !errors.Is(err, fence.ErrInvalid) {
			t.Errorf("Update(%+v): ran %v, err %v; want ErrInvalid and nothing run", w, ran, err)
		}
	}
	for scope, want := range map[string]guard.Mark{"orders": {Token: 5}, "": {}} {
		if m, err := s.Highest(scope); err != nil || m != want {
			t.Errorf("Highest(%q) = %+v, %v; want %+v", scope, m, err, want)
		}
	}
}

// TestUpdateRefusesAnotherScopesToken: Update is told which scope the
// write is for, so a genuine token of another scope cannot pass for it,
// and neither scope's mark moves.
func TestUpdateRefusesAnotherScopesToken(t *testing.T) {
	s, err := boltguard.Open(filepath.Join(t.TempDir(), "g.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	ctx := context.Background()
	ran := false
	err = s.Update(ctx, "orders", guard.Write{Token: fence.Token{Scope: "billing", Value: 9}}, false, func(*bbolt.Tx) error { ran = true; return nil })
	if ran || !errors.Is(err, guard.ErrWrongScope) {
		t.Fatalf("a billing token for orders: ran %v, err %v; want ErrWrongScope and nothing run", ran, err)
	}
	for _, scope := range []string{"orders", "billing"} {
		if m, err := s.Highest(scope); err != nil || m != (guard.Mark{}) {
			t.Errorf("Highest(%q) = %+v, %v; want no mark", scope, m, err)
		}
	}
}
