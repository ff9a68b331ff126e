package client_test

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/client"
	"github.com/fence-dev/fence/internal/server"
)

// startAuthServer runs a service whose auth file lets the bearer token
// "orders-secret" work on the scopes under "orders/" only.
func startAuthServer(t *testing.T) *server.Server {
	t.Helper()
	dir := t.TempDir()
	sum := sha256.Sum256([]byte("orders-secret"))
	authFile := filepath.Join(dir, "auth.json")
	if err := os.WriteFile(authFile, fmt.Appendf(nil, `{
		"tokens": [{"identity": "orders-svc", "sha256": "%x"}],
		"rules": [{"identity": "orders-svc", "prefix": "orders/", "allow": ["acquire", "renew", "release", "get", "list"]}]
	}`, sum), 0o600); err != nil {
		t.Fatal(err)
	}
	return client.StartServer(t, func(cfg *server.Config) { cfg.AuthFile = authFile })
}

// TestErrorsMatchSentinels: a call without credentials, one outside the
// caller's rules and one the service does not know fail with errors that
// match fence.ErrUnauthenticated, fence.ErrPermissionDenied and
// fence.ErrUnimplemented, alone and as an item of a batch, and keep the
// service's words (issue 33, item 14).
func TestErrorsMatchSentinels(t *testing.T) {
	s := startAuthServer(t)
	ctx := testContext(t)
	check := func(what string, err, want error) {
		t.Helper()
		if !errors.Is(err, want) {
			t.Errorf("%s: %v; want an error matching %v", what, err, want)
		}
	}

	anonymous := newClient(t, s.Addr())
	_, err := anonymous.Acquire(ctx, "orders/1")
	check("acquire without credentials", err, fence.ErrUnauthenticated)
	_, err = anonymous.Get(ctx, "orders/1")
	check("get without credentials", err, fence.ErrUnauthenticated)

	orders := newClient(t, s.Addr(), client.WithBearerToken("orders-secret"))
	_, err = orders.Acquire(ctx, "billing/1")
	check("acquire outside the rules", err, fence.ErrPermissionDenied)
	l, err := orders.Grant(ctx, "orders/1", client.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	rs, err := orders.RenewBatch(ctx, []client.Renewal{{Scope: "orders/1", ID: l.ID}, {Scope: "billing/1", ID: l.ID}})
	if err != nil {
		t.Fatal(err)
	}
	if rs[0].Err != nil {
		t.Errorf("renewal of orders/1 in a batch: %v", rs[0].Err)
	}
	check("renewal outside the rules in a batch", rs[1].Err, fence.ErrPermissionDenied)

	// A service without RenewBatch answers 404, as one older than the call
	// does.
	srv, _ := start(t)
	rc := newRPCCounter(0)
	rc.refuse = map[string]bool{"RenewBatch": true}
	old := srv.Client(client.WithHTTPClient(&http.Client{Transport: rc}))
	t.Cleanup(func() { old.Close() })
	g, err := old.Grant(ctx, "orders/1")
	if err != nil {
		t.Fatal(err)
	}
	_, err = old.RenewBatch(ctx, []client.Renewal{{Scope: "orders/1", ID: g.ID}})
	check("RenewBatch of a service without it", err, fence.ErrUnimplemented)
}
