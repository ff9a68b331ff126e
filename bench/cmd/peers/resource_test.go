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
// does not check. PostgreSQL, Redis and the S3 server are tried when make
// services' environment names them.
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
	// fromEnv gives a store the server that the environment variable name
	// (make services') holds.
	fromEnv := func(name string, with func(string) sharedServers) func(*testing.T) sharedServers {
		return func(t *testing.T) sharedServers {
			v := os.Getenv(name)
			if v == "" {
				skipOrFail(t, name+" not set (make services)")
			}
			return with(v)
		}
	}
	pg := fromEnv("FENCE_TEST_POSTGRES", func(v string) sharedServers { return sharedServers{postgres: v} })
	stores := map[string]func(t *testing.T) sharedServers{
		storeBolt:        func(*testing.T) sharedServers { return sharedServers{} },
		storeSQLite:      func(*testing.T) sharedServers { return sharedServers{} },
		storePostgres:    pg,
		storePostgresRow: pg,
		storeRedis:       fromEnv("FENCE_TEST_REDIS", func(v string) sharedServers { return sharedServers{redis: v} }),
		storeS3:          fromEnv("FENCE_TEST_S3", func(v string) sharedServers { return sharedServers{s3: v} }),
	}
	for store, servers := range stores {
		for _, guarded := range []bool{true, false} {
			name := store + "/plain"
			if guarded {
				name = store + "/fenced"
			}
			t.Run(name, func(t *testing.T) {
				srv := servers(t)
				var ks *signing.KeySet
				if guarded {
					ks = keys
				}
				h, closeStore, err := resourceHandler(context.Background(), store, ks, t.TempDir(), srv)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(closeStore)
				mux := routes(h)
				for _, r := range requests {
					req := httptest.NewRequest(http.MethodPost, "/write/gw/0", strings.NewReader(r.name))
					req.Header.Set(httpguard.TokenHeader, r.tok)
					rec := httptest.NewRecorder()
					mux.ServeHTTP(rec, req)
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
