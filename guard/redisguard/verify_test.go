package redisguard_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/guard"
	"github.com/fence-dev/fence/guard/redisguard"
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

// TestVerifierKeepsMark: Guard with WithVerifier, and a guard.Guard with
// guard.WithVerifier over a Store, accept a token their key signed, and no
// unsigned, inflated, forged or foreign token moves the mark in Redis.
func TestVerifierKeepsMark(t *testing.T) {
	rdb := testRedis(t)
	key := signing.NewKey(time.Now())
	keys := signing.NewKeySet(key.Public())
	quiet := slog.New(slog.DiscardHandler)
	g := redisguard.New(rdb, redisguard.WithVerifier(keys), redisguard.WithLogger(quiet))
	store := redisguard.NewStore(rdb)
	sg := guard.New(store, guard.WithVerifier(keys), guard.WithLogger(quiet))
	for _, p := range []struct {
		name string
		// scoped: the write is for sc whatever its token's scope. Guard's
		// writes are tied to sc by the key's hash tag.
		scoped  bool
		write   func(sc string, tok fence.Token) error
		highest func(ctx context.Context, sc string) (guard.Mark, error)
	}{
		{"Guard.Set", true, func(sc string, tok fence.Token) error {
			return g.Set(ctx, guard.Write{Token: tok}, redisguard.Key(sc, "v"), "x", 0)
		}, g.Highest},
		{"Store", true, func(sc string, tok fence.Token) error {
			return sg.Fence(ctx, sc, guard.Write{Token: tok}, func(context.Context) error { return nil })
		}, store.Highest},
	} {
		t.Run(p.name, func(t *testing.T) {
			sc, other := newScope(t, rdb), newScope(t, rdb)
			mark := func() uint64 {
				t.Helper()
				m, err := p.highest(ctx, sc)
				if err != nil {
					t.Fatal(err)
				}
				return m.Token
			}
			genuine := key.Sign(fence.Token{Scope: sc, Value: 5, LeaseID: fence.NewLeaseID()})
			if err := p.write(sc, genuine); err != nil || mark() != 5 {
				t.Fatalf("genuine token: %v, mark %d; want accepted, mark 5", err, mark())
			}
			for name, tok := range forgeries(key, genuine, other) {
				err := p.write(sc, tok)
				if !errors.Is(err, fence.ErrInvalid) && (p.scoped || name != "of another scope") {
					t.Errorf("%s token: %v, want an invalid-token error", name, err)
				}
				if m := mark(); m != 5 {
					t.Fatalf("after the %s token the mark is %d, want 5", name, m)
				}
			}
		})
	}
}
