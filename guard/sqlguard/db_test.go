package sqlguard_test

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib"
	_ "modernc.org/sqlite"

	"github.com/fence-dev/fence/guard/sqlguard"
)

var dialects = []sqlguard.Dialect{sqlguard.Postgres, sqlguard.MySQL, sqlguard.SQLite}

// eachDialect runs f as a subtest per dialect.
func eachDialect(t *testing.T, f func(t *testing.T, d sqlguard.Dialect)) {
	for _, d := range dialects {
		t.Run(d.String(), func(t *testing.T) { f(t, d) })
	}
}

// skipOrFail skips a test that needs a database server when it is
// missing, except in CI, where a missing server is a failure.
func skipOrFail(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg + " (run `make services`, or set FENCE_TEST_POSTGRES and FENCE_TEST_MYSQL)")
}

// source is where a test's databases come from.
type source struct {
	dialect     sqlguard.Dialect
	driver, dsn string
}

// sqliteDSN makes the modernc driver begin every transaction with BEGIN
// IMMEDIATE and wait for the write lock rather than fail with SQLITE_BUSY:
// the set-up the package documentation asks for.
func sqliteDSN(path string) string {
	return "file:" + path + "?_txlock=immediate&_busy_timeout=10000&_journal_mode=WAL"
}

// newSource returns the shared test server of dialect d, named by
// FENCE_TEST_POSTGRES or FENCE_TEST_MYSQL (defaults: scripts/services.env),
// or for SQLite a new file of the test's own.
func newSource(t testing.TB, d sqlguard.Dialect) source {
	t.Helper()
	var src source
	switch d {
	case sqlguard.Postgres:
		src = source{d, "pgx", env("FENCE_TEST_POSTGRES", "postgres://fence:fence@127.0.0.1:54329/fence?sslmode=disable")}
	case sqlguard.MySQL:
		src = source{d, "mysql", env("FENCE_TEST_MYSQL", "fence:fence@tcp(127.0.0.1:33069)/fence")}
	default:
		return source{d, "sqlite", sqliteDSN(filepath.Join(t.TempDir(), "fence.db"))}
	}
	db, err := sql.Open(src.driver, src.dsn)
	if err != nil {
		t.Fatalf("%s %q: %v", d, src.dsn, err)
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		skipOrFail(t, "%s at %s is unreachable: %v", d, src.dsn, err)
	}
	return src
}

func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// open opens a database of src, closed when the test ends.
func (src source) open(t testing.TB) *sql.DB {
	t.Helper()
	db, err := sql.Open(src.driver, src.dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// name returns a table name no other test run uses, and drops the tables
// of that name and the given suffixes when the test ends, so tests of
// several packages and runs can share a server.
func (src source) name(t testing.TB, suffixes ...string) string {
	t.Helper()
	n := fmt.Sprintf("sqlguard_test_%d_%08x", time.Now().UnixNano()%1e9, rand.Uint32())
	if src.dialect == sqlguard.SQLite {
		return n // in the test's own file
	}
	t.Cleanup(func() {
		db, err := sql.Open(src.driver, src.dsn)
		if err != nil {
			t.Error(err)
			return
		}
		defer db.Close()
		for _, s := range append([]string{""}, suffixes...) {
			if _, err := db.Exec("DROP TABLE IF EXISTS " + n + s); err != nil {
				t.Errorf("drop %s%s: %v", n, s, err)
			}
		}
	})
	return n
}

// newDB opens a database of dialect d and names a table of the test's
// own, dropped with its suffixed companions when the test ends.
func newDB(t testing.TB, d sqlguard.Dialect, suffixes ...string) (*sql.DB, string) {
	t.Helper()
	src := newSource(t, d)
	return src.open(t), src.name(t, suffixes...)
}

// newStore returns a Store on db with its table created, closed when the
// test ends.
func newStore(t testing.TB, db *sql.DB, d sqlguard.Dialect, opts ...sqlguard.Option) *sqlguard.Store {
	t.Helper()
	s, err := sqlguard.New(db, d, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if err := s.CreateTable(context.Background()); err != nil {
		t.Fatal(err)
	}
	return s
}

// valueTable is the DDL of a table of one value per scope; logTable of a
// log of applied writes in insertion order.
func valueTable(name string) string {
	return "CREATE TABLE " + name + " (scope VARCHAR(256) PRIMARY KEY, token BIGINT NOT NULL, val VARCHAR(64) NOT NULL)"
}

func logTable(d sqlguard.Dialect, name string) string {
	id := map[sqlguard.Dialect]string{
		sqlguard.Postgres: "id bigserial PRIMARY KEY",
		sqlguard.MySQL:    "id BIGINT AUTO_INCREMENT PRIMARY KEY",
		sqlguard.SQLite:   "id INTEGER PRIMARY KEY AUTOINCREMENT",
	}[d]
	return "CREATE TABLE " + name + " (" + id + ", scope VARCHAR(256) NOT NULL, token BIGINT NOT NULL)"
}

// upsertValue sets the value of a scope: arguments scope, token, value.
func upsertValue(d sqlguard.Dialect, table string) string {
	switch d {
	case sqlguard.MySQL:
		return "INSERT INTO " + table + " (scope, token, val) VALUES (?, ?, ?) ON DUPLICATE KEY UPDATE token = VALUES(token), val = VALUES(val)"
	case sqlguard.Postgres:
		return "INSERT INTO " + table + " (scope, token, val) VALUES ($1, $2, $3) ON CONFLICT (scope) DO UPDATE SET token = excluded.token, val = excluded.val"
	}
	return "INSERT INTO " + table + " (scope, token, val) VALUES (?1, ?2, ?3) ON CONFLICT (scope) DO UPDATE SET token = excluded.token, val = excluded.val"
}

// insertLog appends to a log table: arguments scope, token.
func insertLog(d sqlguard.Dialect, table string) string {
	if d == sqlguard.Postgres {
		return "INSERT INTO " + table + " (scope, token) VALUES ($1, $2)"
	}
	return "INSERT INTO " + table + " (scope, token) VALUES (?, ?)"
}

func mustExec(t testing.TB, db *sql.DB, query string, args ...any) {
	t.Helper()
	if _, err := db.Exec(query, args...); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
}
