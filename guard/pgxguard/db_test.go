package pgxguard_test

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/guard"
	"github.com/fence-dev/fence/guard/pgxguard"
)

// TestMain checks that every test closes the pools it opens.
func TestMain(m *testing.M) {
	skipExamplesWithoutServer() // example_server_test.go
	goleak.VerifyTestMain(m)
}

var ctx = context.Background()

var quiet = guard.WithLogger(slog.New(slog.DiscardHandler))

func wr(scope string, token, seq uint64) guard.Write {
	return guard.Write{Token: fence.Token{Scope: scope, Value: token}, Seq: seq}
}

// dsn returns the test server's address, named by FENCE_TEST_POSTGRES
// (default: the server of `make services`, scripts/services.env). A test
// that cannot reach it skips, except in CI, where it fails.
func dsn(t testing.TB) string {
	t.Helper()
	dsn := os.Getenv("FENCE_TEST_POSTGRES")
	if dsn == "" {
		dsn = "postgres://fence:fence@127.0.0.1:54329/fence?sslmode=disable"
	}
	pool := open(t, dsn)
	defer pool.Close()
	c, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := pool.Ping(c); err != nil {
		msg := fmt.Sprintf("PostgreSQL at %s is unreachable: %v", dsn, err)
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg + " (run `make services`, or set FENCE_TEST_POSTGRES)")
	}
	return dsn
}

// open returns a pool on dsn.
func open(t testing.TB, dsn string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatalf("pgxpool.New(%q): %v", dsn, err)
	}
	return pool
}

// newPool returns a pool on the test server, closed when the test ends,
// and a table name no other test run uses; the tables of that name and
// the given suffixes are dropped when the test ends.
func newPool(t testing.TB, suffixes ...string) (*pgxpool.Pool, string) {
	t.Helper()
	d := dsn(t)
	name := fmt.Sprintf("pgxguard_test_%d_%08x", time.Now().UnixNano()%1e9, rand.Uint32())
	pool := open(t, d)
	t.Cleanup(func() {
		for _, s := range append([]string{""}, suffixes...) {
			if _, err := pool.Exec(ctx, "DROP TABLE IF EXISTS "+name+s); err != nil {
				t.Errorf("drop %s%s: %v", name, s, err)
			}
		}
		pool.Close()
	})
	return pool, name
}

// newStore returns a Store on pool with its table created.
func newStore(t testing.TB, pool pgxguard.DB, table string, opts ...guard.Option) *pgxguard.Store {
	t.Helper()
	s, err := pgxguard.New(pool, table, opts...)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.CreateTable(ctx); err != nil {
		t.Fatal(err)
	}
	return s
}

func mustExec(t testing.TB, pool *pgxpool.Pool, query string, args ...any) {
	t.Helper()
	if _, err := pool.Exec(ctx, query, args...); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
}
