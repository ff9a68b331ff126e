package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/guard/httpguard"
	"github.com/fence-dev/fence/signing"
)

// TestResourceGuards: the fenced resource of every store refuses forged,
// unsigned and stale tokens, and the plain one, the baseline, stores
// whatever comes. A fenced/plain ratio means nothing if the fenced side
// does not check. PostgreSQL and Redis are tried when make services'
// environment names them.
func TestResourceGuards(t *testing.T) {
	key := signing.NewKey(time.Now())
	keys := signing.NewKeySet(key.Public())
	sign := func(v uint64) fence.Token { return key.Sign(fence.Token{Scope: "gw/0", Value: v}) }
	current := sign(2)
	forged := current
	forged.Value = 3
	requests := []struct {
		name          string
		tok           string
		fenced, plain int
	}{
		{"current", current.String(), http.StatusNoContent, http.StatusNoContent},
		{"current again", current.String(), http.StatusNoContent, http.StatusNoContent},
		{"forged", forged.String(), http.StatusBadRequest, http.StatusNoContent},
		{"unsigned", current.Unsigned().String(), http.StatusBadRequest, http.StatusNoContent},
		{"stale", sign(1).String(), http.StatusConflict, http.StatusNoContent},
	}
	stores := map[string]func(t *testing.T) (string, string){
		storeBolt:   func(*testing.T) (string, string) { return "", "" },
		storeSQLite: func(*testing.T) (string, string) { return "", "" },
		storePostgres: func(t *testing.T) (string, string) {
			dsn := os.Getenv("FENCE_TEST_POSTGRES")
			if dsn == "" {
				skipOrFail(t, "FENCE_TEST_POSTGRES not set (make services)")
			}
			return dsn, ""
		},
		storePostgresRow: func(t *testing.T) (string, string) {
			dsn := os.Getenv("FENCE_TEST_POSTGRES")
			if dsn == "" {
				skipOrFail(t, "FENCE_TEST_POSTGRES not set (make services)")
			}
			return dsn, ""
		},
		storeRedis: func(t *testing.T) (string, string) {
			url := os.Getenv("FENCE_TEST_REDIS")
			if url == "" {
				skipOrFail(t, "FENCE_TEST_REDIS not set (make services)")
			}
			return "", url
		},
	}
	for store, servers := range stores {
		for _, guarded := range []bool{true, false} {
			name := store + "/plain"
			if guarded {
				name = store + "/fenced"
			}
			t.Run(name, func(t *testing.T) {
				pg, redis := servers(t)
				var ks *signing.KeySet
				if guarded {
					ks = keys
				}
				h, closeStore, err := resourceHandler(context.Background(), store, ks, t.TempDir(), pg, redis)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(closeStore)
				srv := routes(h)
				for _, r := range requests {
					req := httptest.NewRequest(http.MethodPost, "/write/gw/0", strings.NewReader(r.name))
					req.Header.Set(httpguard.TokenHeader, r.tok)
					rec := httptest.NewRecorder()
					srv.ServeHTTP(rec, req)
					want := r.plain
					if guarded {
						want = r.fenced
					}
					if rec.Code != want {
						t.Errorf("%s token: %d %s, want %d", r.name, rec.Code, strings.TrimSpace(rec.Body.String()), want)
					}
				}
			})
		}
	}
}

// skipOrFail skips a test whose server is missing, except in CI, where
// make test starts every server and a missing one is a failure.
func skipOrFail(t *testing.T, msg string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}
