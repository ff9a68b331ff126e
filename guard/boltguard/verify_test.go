package boltguard_test

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/guard"
	"github.com/fence-dev/fence/guard/boltguard"
	"github.com/fence-dev/fence/guard/guardtest"
	"github.com/fence-dev/fence/signing"
)

// TestVerifierKeepsMark: a guard.Guard with a verifier over a Store
// accepts a token its key signed, and no unsigned, inflated, forged or
// foreign token moves the mark in the file.
func TestVerifierKeepsMark(t *testing.T) {
	ctx := context.Background()
	s, err := boltguard.Open(filepath.Join(t.TempDir(), "g.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	key := signing.NewKey(time.Now())
	g := guard.New(s, guard.WithVerifier(signing.NewKeySet(key.Public())), guard.WithLogger(slog.New(slog.DiscardHandler)))
	write := func(tok fence.Token) error {
		return g.Fence(ctx, "orders", guard.Write{Token: tok}, func(context.Context) error { return nil })
	}
	mark := func() uint64 {
		t.Helper()
		m, err := s.Highest("orders")
		if err != nil {
			t.Fatal(err)
		}
		return m.Token
	}
	genuine := key.Sign(fence.Token{Scope: "orders", Value: 5})
	if err := write(genuine); err != nil || mark() != 5 {
		t.Fatalf("genuine token: %v, mark %d; want accepted, mark 5", err, mark())
	}
	for name, tok := range guardtest.Forgeries(key, genuine, "billing") {
		if err := write(tok); !errors.Is(err, fence.ErrInvalid) {
			t.Errorf("%s token: %v, want an invalid-token error", name, err)
		}
		if m := mark(); m != 5 {
			t.Fatalf("after the %s token the mark is %d, want 5", name, m)
		}
	}
}
