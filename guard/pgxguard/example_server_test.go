package pgxguard_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// postgresDSN is the server the examples write to, found as the tests find
// theirs: FENCE_TEST_POSTGRES, or the server of `make services`.
func postgresDSN() string {
	if dsn := os.Getenv("FENCE_TEST_POSTGRES"); dsn != "" {
		return dsn
	}
	return "postgres://fence:fence@127.0.0.1:54329/fence?sslmode=disable"
}

// skipExamplesWithoutServer makes the examples, whose output is what a
// real server answers, skip like the tests when PostgreSQL is unreachable;
// in CI they run, and fail. An example cannot skip itself, so this adds
// ^Example to -test.skip before the tests start. Called by TestMain.
func skipExamplesWithoutServer() {
	flag.Parse()
	if os.Getenv("CI") == "true" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, postgresDSN())
	if err == nil {
		err = conn.Ping(ctx)
		conn.Close(ctx)
	}
	if err == nil {
		return
	}
	skip := flag.Lookup("test.skip").Value.String()
	if strings.Contains(skip, "/") {
		return // cannot join a pattern with subtests; let the examples fail
	}
	if skip != "" {
		skip += "|"
	}
	_ = flag.Set("test.skip", skip+"^Example")
	fmt.Fprintf(os.Stderr, "pgxguard: skipping the examples: PostgreSQL at %s is unreachable: %v (run `make services`, or set FENCE_TEST_POSTGRES)\n", postgresDSN(), err)
}
