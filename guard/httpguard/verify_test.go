package httpguard_test

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/guard"
	"github.com/fence-dev/fence/guard/guardtest"
	"github.com/fence-dev/fence/guard/httpguard"
	"github.com/fence-dev/fence/signing"
)

// TestVerifierKeepsMark: Middleware over a guard with a verifier passes a
// token the key signed, and answers 400 to an unsigned, inflated, forged
// or foreign token, without running the handler or moving the mark.
func TestVerifierKeepsMark(t *testing.T) {
	key := signing.NewKey(time.Now())
	store := guard.NewMemoryStore()
	g := guard.New(store, guard.WithVerifier(signing.NewKeySet(key.Public())), guard.WithLogger(slog.New(slog.DiscardHandler)))
	var ran atomic.Int64
	srv := httptest.NewServer(mustMiddleware(t, g, "orders")(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ran.Add(1)
		w.WriteHeader(http.StatusNoContent)
	})))
	defer srv.Close()
	write := func(tok fence.Token) int {
		t.Helper()
		resp, p := put(t, srv.URL, map[string]string{httpguard.TokenHeader: tok.String()}, "x")
		if resp.StatusCode == http.StatusBadRequest && p.Detail == "" {
			t.Errorf("token %s: 400 without a detail", tok)
		}
		return resp.StatusCode
	}
	genuine := key.Sign(fence.Token{Scope: "orders", Value: 5})
	if code := write(genuine); code != http.StatusNoContent || ran.Load() != 1 || store.Highest("orders").Token != 5 {
		t.Fatalf("genuine token: status %d, handler ran %d times, mark %d; want 204, once, 5", code, ran.Load(), store.Highest("orders").Token)
	}
	for name, tok := range guardtest.Forgeries(key, genuine, "billing") {
		if code := write(tok); code != http.StatusBadRequest {
			t.Errorf("%s token: status %d, want 400", name, code)
		}
		if m := store.Highest("orders"); m.Token != 5 || ran.Load() != 1 {
			t.Fatalf("after the %s token the mark is %d and the handler ran %d times, want 5 and once", name, m.Token, ran.Load())
		}
	}
}
