package signing_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/client"
	"github.com/fence-dev/fence/fencetest"
	"github.com/fence-dev/fence/guard"
	"github.com/fence-dev/fence/signing"
)

// TestServiceSignsAndGuardVerifies runs a signing service and a guard that
// fetched its keys: the service's tokens pass, and no forged, inflated,
// foreign or unsigned token moves the guard's mark; after a key rotation
// both the new tokens and the ones signed before still pass.
func TestServiceSignsAndGuardVerifies(t *testing.T) {
	// A new key signs at once here: this test is of a guard meeting a key
	// it has not fetched yet (keys_test.go in internal/server has the
	// publish window).
	srv := fencetest.NewServer(fencetest.WithSigning(), fencetest.WithKeyPublishDelay(0))
	defer srv.Close()
	c := srv.Client()
	defer c.Close()
	ctx := context.Background()

	keys, err := signing.Refreshing(ctx, nil, srv.Addr, 0)
	if err != nil {
		t.Fatal(err)
	}
	store := guard.NewMemoryStore()
	g := guard.New(store, guard.WithVerifier(keys))
	write := func(tok fence.Token) error {
		return g.Fence(ctx, tok.Scope, guard.Write{Token: tok}, func(context.Context) error { return nil })
	}

	l1, err := c.Acquire(ctx, "orders")
	if err != nil {
		t.Fatal(err)
	}
	tok1 := l1.Token()
	if !tok1.Signed() || tok1.Scope != "orders" || tok1.Value != l1.Token().Value || strings.Contains(tok1.String(), l1.ID().String()) {
		t.Fatalf("the service's token is not signed, or carries the lease ID: %s", tok1)
	}
	if err := write(tok1); err != nil {
		t.Fatalf("the service's own token: %v", err)
	}
	if renewed, err := c.Renew(ctx, "orders", l1.ID()); err != nil || renewed.FencingToken() != tok1 {
		t.Fatalf("a renewal answered %+v, %v; want the same signed token", renewed.FencingToken(), err)
	}

	inflated := tok1
	inflated.Value = fence.MaxToken
	foreign := tok1
	foreign.Scope = "billing"
	forged := signing.NewKey(time.Now()).Sign(fence.Token{Scope: "orders", Value: fence.MaxToken})
	for name, tok := range map[string]fence.Token{
		"inflated":           inflated,
		"unsigned":           fence.Token{Scope: "orders", Value: fence.MaxToken},
		"signed by a forger": forged,
	} {
		if err := write(tok); !errors.Is(err, fence.ErrInvalid) {
			t.Errorf("%s token %s: %v, want an invalid-token error", name, tok, err)
		}
	}
	if err := g.Fence(ctx, "orders", guard.Write{Token: foreign}, func(context.Context) error { return nil }); !errors.Is(err, fence.ErrInvalid) {
		t.Errorf("a token re-labelled for another scope: %v", err)
	}
	if err := write(foreign); !errors.Is(err, signing.ErrBadSignature) {
		t.Errorf("a token re-labelled for another scope, at that scope's guard: %v", err)
	}
	if m := store.Highest("orders"); m.Token != tok1.Value {
		t.Fatalf("the mark moved to %d; only token %d was genuine", m.Token, tok1.Value)
	}

	// Rotate: new grants carry the new key, the guard learns it by
	// refetching, and the old token still verifies during the grace period.
	keep, err := c.Grant(ctx, "keep")
	if err != nil {
		t.Fatal(err)
	}
	rot, err := c.RotateSigningKey(ctx)
	if err != nil {
		t.Fatal(err)
	}
	kid := rot.KeyID
	if err := l1.Release(ctx); err != nil {
		t.Fatal(err)
	}
	l2, err := c.Acquire(ctx, "orders", client.WithHolder("b"))
	if err != nil {
		t.Fatal(err)
	}
	if l2.Token().KeyID != kid || kid == tok1.KeyID {
		t.Fatalf("after rotating to %q the token is signed by %q (before: %q)", kid, l2.Token().KeyID, tok1.KeyID)
	}
	if err := write(l2.Token()); err != nil {
		t.Fatalf("a token of the new key: %v", err)
	}
	if err := keys.Verify(tok1); err != nil {
		t.Fatalf("a token of the old key during its grace period: %v", err)
	}
	// A lease granted before the rotation and renewed after it gets its
	// token signed with the new key, not the old signature again.
	r, err := c.Renew(ctx, "keep", keep.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got := r.FencingToken(); got.KeyID != kid || got.Value != keep.Token || keys.Verify(got) != nil {
		t.Fatalf("renewal after the rotation: %+v (verify: %v); want token %d signed by %s", got, keys.Verify(got), keep.Token, kid)
	}
	if err := write(tok1); !errors.As(err, new(*guard.StaleError)) {
		t.Fatalf("the old holder's write after the new one: %v, want stale", err)
	}
}
