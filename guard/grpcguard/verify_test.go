package grpcguard_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/guard"
	"github.com/fence-dev/fence/guard/grpcguard"
	"github.com/fence-dev/fence/guard/guardtest"
	"github.com/fence-dev/fence/signing"
)

// TestVerifierKeepsMark: the server interceptor over a guard with a
// verifier passes a token the key signed, and answers InvalidArgument to
// an unsigned, inflated, forged or foreign token, without running the
// handler or moving the mark.
func TestVerifierKeepsMark(t *testing.T) {
	key := signing.NewKey(time.Now())
	store := guard.NewMemoryStore()
	g := guard.New(store, guard.WithVerifier(signing.NewKeySet(key.Public())), guard.WithLogger(slog.New(slog.DiscardHandler)))
	reg := &register{value: map[string]string{}, log: map[string][]uint64{}}
	c := serveUnary(t, g, reg)
	write := func(tok fence.Token) error {
		return put(metadata.AppendToOutgoingContext(context.Background(), grpcguard.TokenKey, tok.String()), c, "x")
	}

	genuine := key.Sign(fence.Token{Scope: "orders", Value: 5})
	if err := write(genuine); err != nil || reg.calls.Load() != 1 || store.Highest("orders").Token != 5 {
		t.Fatalf("genuine token: %v, handler ran %d times, mark %d; want accepted, once, 5", err, reg.calls.Load(), store.Highest("orders").Token)
	}
	for name, tok := range guardtest.Forgeries(key, genuine, "billing") {
		if err := write(tok); status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s token: %v, want InvalidArgument", name, err)
		}
		if m := store.Highest("orders"); m.Token != 5 || reg.calls.Load() != 1 {
			t.Fatalf("after the %s token the mark is %d and the handler ran %d times, want 5 and once", name, m.Token, reg.calls.Load())
		}
	}
}
