package signing_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/signing"
)

// TestRefreshingBoundsFetches: tokens of made-up key IDs, each a new one,
// cost the service no request within the interval after the keys were
// fetched, however many there are. (A key rotated in since is published
// for longer than the interval before it signs: internal/server's
// TestMadeUpKeyIDDoesNotLockOutANewKey.)
func TestRefreshingBoundsFetches(t *testing.T) {
	f := signing.File{Keys: []signing.PublicKey{signing.NewKey(time.Now()).Public()}}
	var requests atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		json.NewEncoder(w).Encode(f)
	}))
	defer srv.Close()

	keys, err := signing.Refreshing(context.Background(), nil, srv.URL, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 100 {
		forged := signing.NewKey(time.Now()).Sign(fence.Token{Scope: "orders", Value: fence.MaxToken - uint64(i)})
		if err := keys.Verify(forged); !errors.Is(err, signing.ErrBadSignature) {
			t.Fatalf("token %d of a made-up key ID: %v", i, err)
		}
	}
	if n := requests.Load(); n != 1 {
		t.Fatalf("100 tokens of made-up key IDs: %d requests for the keys, want the first fetch only", n)
	}
}
