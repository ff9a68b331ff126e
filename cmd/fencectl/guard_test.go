package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/redis/go-redis/v9"

	"github.com/fence-dev/fence/guard/redisguard"
)

// ctl runs fencectl in this process and returns its exit status, stdout
// and stderr.
func ctl(args ...string) (int, string, string) {
	var stdout, stderr strings.Builder
	code := execute(context.Background(), args, strings.NewReader(""), &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

// TestGuardInstallErrors: an unknown scheme and a MySQL URL without a
// database are usage errors, a server that does not answer an error, and
// --print connects to nothing.
func TestGuardInstallErrors(t *testing.T) {
	for _, c := range []struct {
		url    string
		status int
		stderr string
	}{
		{"mongodb://127.0.0.1/x", exitUsage, `unknown scheme "mongodb": want postgres://, mysql:// or redis://`},
		{"127.0.0.1:5432", exitUsage, "URL"},
		{"mysql://u:secret@127.0.0.1:1", exitUsage, "name the database in the URL"},
		{"postgres://u:secret@127.0.0.1:1/db", exitError, "cannot reach the server"},
		{"mysql://u:secret@127.0.0.1:1/db", exitError, "cannot reach the server"},
		{"redis://:secret@127.0.0.1:1", exitError, "cannot reach the server"},
		{"postgres://u@127.0.0.1:1/db?password=secret", exitError, "password=xxxxx"},
		{"postgres://u@127.0.0.1:1/db?sslpassword=secret&password=secret", exitError, "cannot reach the server"},
		{"mysql://u@127.0.0.1:1/db?password=secret", exitError, "cannot reach the server"},
		{"redis://127.0.0.1:1?password=secret", exitError, "password=xxxxx"},
		{"mongodb://127.0.0.1/x?password=secret", exitUsage, `unknown scheme "mongodb"`},
		{"postgres://u:secret%zz@127.0.0.1/db", exitUsage, `URL: invalid URL escape "%zz"`},
	} {
		code, _, stderr := ctl("guard", "install", c.url)
		if code != c.status || !strings.Contains(stderr, c.stderr) || strings.Contains(stderr, "secret") {
			t.Errorf("install %s: status %d, stderr %q; want %d and %q, without the password", c.url, code, stderr, c.status, c.stderr)
		}
	}
	for url, want := range map[string]string{
		"postgres://127.0.0.1:1/db": "CREATE OR REPLACE FUNCTION fence_advance(scope text, token bigint, seq bigint DEFAULT 0)",
		"mysql://":                  "CREATE PROCEDURE fence_advance(",
		"redis://127.0.0.1:1":       "#!lua name=" + redisguard.LibraryName + "\n",
	} {
		code, stdout, stderr := ctl("guard", "install", "--print", url)
		if code != exitOK || !strings.Contains(stdout, want) {
			t.Errorf("install --print %s: status %d, stderr %q, stdout without %q", url, code, stderr, want)
		}
	}
}

// TestGuardInstallNoSchema: in a PostgreSQL database where search_path
// names no schema that exists, install says what to do (create the schema,
// name it in the URL's search_path) instead of only PostgreSQL's "no
// schema has been selected to create in", and installs once the user does
// as told.
func TestGuardInstallNoSchema(t *testing.T) {
	name := fmt.Sprintf("fencectl_noschema_%08x", rand.Uint32())
	dsn := needServer(t, "FENCE_TEST_POSTGRES", "postgres://fence:fence@127.0.0.1:54329/fence?sslmode=disable", pingSQL("pgx"))
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("options", "-csearch_path="+name) // a schema that does not exist yet
	u.RawQuery = q.Encode()

	code, _, stderr := ctl("guard", "install", u.String())
	if code != exitError {
		t.Fatalf("install with no usable schema: status %d, want %d: %s", code, exitError, stderr)
	}
	for _, want := range []string{"SQLSTATE 3F000", "create the schema first: CREATE SCHEMA fence", "?options=-csearch_path%3Dfence", "ALTER ROLE"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("install with no usable schema: stderr lacks %q:\n%s", want, stderr)
		}
	}
	if strings.Contains(stderr, "fence:fence@") {
		t.Errorf("stderr shows the password: %s", stderr)
	}

	// As told: create the schema; the URL already names it.
	admin, _ := sql.Open("pgx", dsn)
	t.Cleanup(func() { admin.Close() })
	if _, err := admin.Exec("CREATE SCHEMA " + name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Exec("DROP SCHEMA " + name + " CASCADE") })
	if code, _, stderr := ctl("guard", "install", u.String()); code != exitOK {
		t.Fatalf("install after CREATE SCHEMA: status %d: %s", code, stderr)
	}
	var n int
	if err := admin.QueryRow("SELECT count(*) FROM pg_proc p JOIN pg_namespace s ON s.oid = p.pronamespace WHERE s.nspname = $1 AND p.proname = 'fence_advance'", name).Scan(&n); err != nil || n != 1 {
		t.Errorf("fence_advance in schema %s: %d, %v; want 1", name, n, err)
	}
}

// needServer returns the test server named by the environment variable
// (default def), or skips the test: always under -short (make test-short
// runs no servers), and when the server is missing, except in CI, where a
// missing server is a failure.
func needServer(t *testing.T, name, def string, ping func(string) error) string {
	t.Helper()
	if testing.Short() {
		t.Skip("needs the servers of `make services`")
	}
	v := os.Getenv(name)
	if v == "" {
		v = def
	}
	if err := ping(v); err != nil {
		msg := fmt.Sprintf("%s=%q is unreachable: %v", name, v, err)
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg + " (run `make services`)")
	}
	return v
}

// postgresSchema makes a schema of the test's own in the PostgreSQL of
// `make services`, dropped at the end, and returns a connection and a URL
// whose search_path names it first (a startup parameter: where install
// puts the guard).
func postgresSchema(t *testing.T, name string) (*sql.DB, *url.URL) {
	t.Helper()
	dsn := needServer(t, "FENCE_TEST_POSTGRES", "postgres://fence:fence@127.0.0.1:54329/fence?sslmode=disable", pingSQL("pgx"))
	admin, _ := sql.Open("pgx", dsn)
	t.Cleanup(func() { admin.Close() })
	if _, err := admin.Exec("CREATE SCHEMA " + name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Exec("DROP SCHEMA " + name + " CASCADE") })
	u, _ := url.Parse(dsn)
	q := u.Query()
	q.Set("options", "-csearch_path="+name)
	u.RawQuery = q.Encode()
	return admin, u
}

// mysqlDatabase makes a database of the test's own in the MySQL of `make
// services`, dropped at the end, and returns a connection, the server's
// DSN and a mysql:// URL of the new database.
func mysqlDatabase(t *testing.T, name string) (*sql.DB, *mysql.Config, string) {
	t.Helper()
	dsn := needServer(t, "FENCE_TEST_MYSQL", "fence:fence@tcp(127.0.0.1:33069)/fence", pingSQL("mysql"))
	admin, _ := sql.Open("mysql", dsn)
	t.Cleanup(func() { admin.Close() })
	if _, err := admin.Exec("CREATE DATABASE " + name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Exec("DROP DATABASE " + name) })
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	return admin, cfg, (&url.URL{Scheme: "mysql", User: url.UserPassword(cfg.User, cfg.Passwd), Host: cfg.Addr, Path: "/" + name}).String()
}

// redisServer returns the URL of the Redis of `make services`.
func redisServer(t *testing.T) string {
	t.Helper()
	return needServer(t, "FENCE_TEST_REDIS", "redis://127.0.0.1:63799/0", func(u string) error {
		opt, err := redis.ParseURL(u)
		if err != nil {
			return err
		}
		rdb := redis.NewClient(opt)
		defer rdb.Close()
		return rdb.Ping(context.Background()).Err()
	})
}

func pingSQL(driver string) func(string) error {
	return func(dsn string) error {
		db, err := sql.Open(driver, dsn)
		if err != nil {
			return err
		}
		defer db.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return db.PingContext(ctx)
	}
}

// TestGuardInstall installs the guard twice in each server of `make
// services`, into a schema or database of the test's own on the SQL ones,
// and checks that it is there.
func TestGuardInstall(t *testing.T) {
	name := fmt.Sprintf("fencectl_guard_%08x", rand.Uint32())
	// installTwice installs at u twice, and returns what the second said.
	installTwice := func(t *testing.T, u string) string {
		t.Helper()
		var out string
		for range 2 {
			code, stdout, stderr := ctl("guard", "install", u)
			if code != exitOK {
				t.Fatalf("install %s: status %d: %s", u, code, stderr)
			}
			out = stdout
		}
		return out
	}
	version := func(t *testing.T, driver, dsn string) {
		t.Helper()
		db, err := sql.Open(driver, dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		var v int
		if err := db.QueryRow("SELECT fence_guard_version()").Scan(&v); err != nil || v != 1 {
			t.Fatalf("fence_guard_version() = %d, %v; want 1", v, err)
		}
	}

	t.Run("postgres", func(t *testing.T) {
		_, u := postgresSchema(t, name)
		q := u.Query()
		out := installTwice(t, u.String())
		if !strings.Contains(out, "fence_advance(scope text, token bigint, seq bigint DEFAULT 0)") || strings.Contains(out, ":fence@") {
			t.Errorf("install said %q", out)
		}
		version(t, "pgx", u.String())

		// The password as a query parameter is redacted as the userinfo's.
		pass, _ := u.User.Password()
		q.Set("password", pass)
		u.User, u.RawQuery = url.User(u.User.Username()), q.Encode()
		code, stdout, stderr := ctl("guard", "install", "-o", "json", u.String())
		var got guardInstallJSON
		if err := json.Unmarshal([]byte(stdout), &got); code != exitOK || err != nil {
			t.Fatalf("install -o json with ?password=: status %d, %v: %s %s", code, err, stdout, stderr)
		}
		if strings.Contains(stdout, "password="+url.QueryEscape(pass)) || !strings.Contains(got.URL, "password=xxxxx") {
			t.Errorf("install -o json with ?password=: url %q; want the password as xxxxx", got.URL)
		}
	})

	t.Run("mysql", func(t *testing.T) {
		_, cfg, u := mysqlDatabase(t, name)
		out := installTwice(t, u)
		if !strings.Contains(out, "procedure fence_advance(scope, token, seq)") {
			t.Errorf("install said %q", out)
		}
		cfg.DBName = name
		version(t, "mysql", cfg.FormatDSN())
	})

	t.Run("redis", func(t *testing.T) {
		u := redisServer(t)
		out := installTwice(t, u)
		if !strings.Contains(out, "function library "+redisguard.LibraryName+": fence_set, fence_del, fence_hset, fence_incrby, fence_advance") {
			t.Errorf("install said %q", out)
		}
		opt, _ := redis.ParseURL(u)
		rdb := redis.NewClient(opt)
		defer rdb.Close()
		libs, err := rdb.FunctionList(context.Background(), redis.FunctionListQuery{LibraryNamePattern: redisguard.LibraryName}).Result()
		if err != nil || len(libs) != 1 {
			t.Fatalf("FUNCTION LIST %s: %+v, %v; want the library", redisguard.LibraryName, libs, err)
		}
		var names []string
		for _, f := range libs[0].Functions {
			names = append(names, f.Name)
		}
		slices.Sort(names)
		if want := []string{"fence_advance", "fence_del", "fence_hset", "fence_incrby", "fence_set"}; !slices.Equal(names, want) {
			t.Fatalf("FUNCTION LIST %s: functions %q, want %q", redisguard.LibraryName, names, want)
		}
	})
}
