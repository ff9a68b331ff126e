package grpcguard_test

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/fence-dev/fence/guard"
	"github.com/fence-dev/fence/guard/boltguard"
	"github.com/fence-dev/fence/guard/grpcguard"
)

// TestStreamsRefuseARepeatingStore: a store that may run a handler again
// (boltguard's Batched) cannot fence a stream, whose messages cannot be
// received twice; building the interceptor says so at once.
func TestStreamsRefuseARepeatingStore(t *testing.T) {
	s, err := boltguard.Open(filepath.Join(t.TempDir(), "g.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	scope := grpcguard.Methods("orders", "/shop.v1.Orders/Import")
	grpcguard.StreamServerInterceptor(guard.New(s), scope) // runs each handler once: accepted
	defer func() {
		if p, _ := recover().(string); !strings.Contains(p, "Batched") {
			t.Fatalf("StreamServerInterceptor over the Batched store: panic %q, want one that names the store", p)
		}
	}()
	grpcguard.StreamServerInterceptor(guard.New(s.Batched()), scope)
}
