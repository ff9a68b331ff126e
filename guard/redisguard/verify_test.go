package redisguard_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/guard"
	"github.com/fence-dev/fence/guard/guardtest"
	"github.com/fence-dev/fence/guard/redisguard"
	"github.com/fence-dev/fence/signing"
)

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
		name    string
		write   func(sc string, tok fence.Token) error
		highest func(ctx context.Context, sc string) (guard.Mark, error)
	}{
		{"Guard.Set", func(sc string, tok fence.Token) error {
			return g.Set(ctx, guard.Write{Token: tok}, redisguard.Key(sc, "v"), "x", 0)
		}, g.Highest},
		{"Store", func(sc string, tok fence.Token) error {
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
			genuine := key.Sign(fence.Token{Scope: sc, Value: 5})
			if err := p.write(sc, genuine); err != nil || mark() != 5 {
				t.Fatalf("genuine token: %v, mark %d; want accepted, mark 5", err, mark())
			}
			for name, tok := range guardtest.Forgeries(key, genuine, other) {
				err := p.write(sc, tok)
				if !errors.Is(err, fence.ErrInvalid) {
					t.Errorf("%s token: %v, want an invalid-token error", name, err)
				}
				if m := mark(); m != 5 {
					t.Fatalf("after the %s token the mark is %d, want 5", name, m)
				}
			}
		})
	}
}
