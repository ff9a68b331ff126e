package guard_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/guard"
	"github.com/fence-dev/fence/guard/guardtest"
	"github.com/fence-dev/fence/signing"
)

// TestVerifierKeepsMark: a guard with a verifier accepts a token its key
// signed, and no unsigned, inflated, forged or foreign token moves its
// mark, through Fence or Advance.
func TestVerifierKeepsMark(t *testing.T) {
	ctx := context.Background()
	key := signing.NewKey(time.Now())
	store := guard.NewMemoryStore()
	g := guard.New(store, guard.WithVerifier(signing.NewKeySet(key.Public())), guard.WithLogger(slog.New(slog.DiscardHandler)))
	write := func(tok fence.Token) error {
		return g.Fence(ctx, "orders", guard.Write{Token: tok}, func(context.Context) error { return nil })
	}
	genuine := key.Sign(fence.Token{Scope: "orders", Value: 5})
	if err := write(genuine); err != nil {
		t.Fatalf("genuine token: %v", err)
	}
	if m := store.Highest("orders"); m.Token != 5 {
		t.Fatalf("after the genuine token the mark is %d, want 5", m.Token)
	}
	for name, tok := range guardtest.Forgeries(key, genuine, "billing") {
		if err := write(tok); !errors.Is(err, fence.ErrInvalid) {
			t.Errorf("%s token: %v, want an invalid-token error", name, err)
		}
		if m := store.Highest("orders"); m.Token != 5 {
			t.Fatalf("after the %s token the mark is %d, want 5", name, m.Token)
		}
		if err := g.Advance(ctx, "orders", tok); !errors.Is(err, fence.ErrInvalid) {
			t.Errorf("Advance with the %s token: %v, want an invalid-token error", name, err)
		}
		if m := store.Highest("orders"); m.Token != 5 {
			t.Fatalf("after Advance with the %s token the mark is %d, want 5", name, m.Token)
		}
	}
}
