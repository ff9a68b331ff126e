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
	"github.com/fence-dev/fence/signing"
)

// forgeries returns what a verifying guard of genuine's scope must refuse:
// an unsigned token of 2^63−1, genuine inflated to it, a token of it signed
// by another key, genuine re-labelled for scope other, and a genuine token
// of key for other.
func forgeries(key signing.PrivateKey, genuine fence.Token, other string) map[string]fence.Token {
	inflated, relabelled := genuine, genuine
	inflated.Value = fence.MaxToken
	relabelled.Scope = other
	return map[string]fence.Token{
		"unsigned":              {Scope: genuine.Scope, Value: fence.MaxToken},
		"inflated":              inflated,
		"signed by another key": signing.NewKey(time.Now()).Sign(fence.Token{Scope: genuine.Scope, Value: fence.MaxToken, LeaseID: genuine.LeaseID}),
		"re-labelled":           relabelled,
		"of another scope":      key.Sign(fence.Token{Scope: other, Value: fence.MaxToken, LeaseID: fence.NewLeaseID()}),
	}
}

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
	genuine := key.Sign(fence.Token{Scope: "orders", Value: 5, LeaseID: fence.NewLeaseID()})
	if err := write(genuine); err != nil || mark() != 5 {
		t.Fatalf("genuine token: %v, mark %d; want accepted, mark 5", err, mark())
	}
	for name, tok := range forgeries(key, genuine, "billing") {
		if err := write(tok); !errors.Is(err, fence.ErrInvalid) {
			t.Errorf("%s token: %v, want an invalid-token error", name, err)
		}
		if m := mark(); m != 5 {
			t.Fatalf("after the %s token the mark is %d, want 5", name, m)
		}
	}
}
