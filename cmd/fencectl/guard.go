package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"
	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"

	"github.com/fence-dev/fence/guard/redisguard"
	"github.com/fence-dev/fence/guard/sqlguard"
)

// installTimeout bounds connecting and installing, so that a server that
// never answers ends the command with an error.
const installTimeout = 30 * time.Second

// guardInstallJSON is guard install's -o json output.
type guardInstallJSON struct {
	URL       string   `json:"url"` // without its password
	Kind      string   `json:"kind"`
	Installed []string `json:"installed"`
}

func (a *app) newGuardCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "guard",
		Short: "Install fence's guard inside PostgreSQL, MySQL, MariaDB or Redis, for writers in any language, and follow the service there",
		Args:  groupArgs,
		RunE:  func(cmd *cobra.Command, args []string) error { return cmd.Help() },
	}
	cmd.AddCommand(a.newGuardInstallCmd(), a.newGuardFollowCmd())
	return cmd
}

func (a *app) newGuardInstallCmd() *cobra.Command {
	var print bool
	cmd := &cobra.Command{
		Use:   "install URL",
		Short: "Install the guard's functions in the database or Redis at URL",
		Long: `Install puts fence's guard inside the database or Redis at URL, so that a
writer in any language can fence its writes with one call in its own
transaction (SQL) or one FCALL (Redis). The marks live where the Go guards
keep them (sqlguard's table fence_tokens, redisguard's keys fence:{SCOPE}),
so Go and other writers of a scope share one mark.

  postgres://USER:PASSWORD@HOST:PORT/DB   the table fence_tokens, the functions
                                          fence_advance(scope, token, seq) and
                                          fence_row_token() (a trigger function),
                                          in the schema search_path names first:
                                          give it one of its own (CREATE SCHEMA
                                          fence, then ?options=-csearch_path%3Dfence
                                          in the URL) and call
                                          SCHEMA.fence_advance with bigint
                                          arguments (docs/protocol.md)
  mysql://USER:PASSWORD@HOST:PORT/DB      the table fence_tokens and the
                                          procedures fence_advance(scope, token,
                                          seq), fence_row_token(scope, old, new),
                                          fence_row_insert and fence_row_delete
  redis://[:PASSWORD@]HOST:PORT[/DB]      the Redis 7 function library ` + redisguard.LibraryName + `:
                                          fence_set, fence_del, fence_hset,
                                          fence_incrby, fence_advance (the
                                          check alone, no write)

postgresql://, mariadb:// and rediss:// (TLS) work too. Installing again
replaces the functions and keeps the marks. A stale token fails with
SQLSTATE FN409 (SQL) or an error starting with STALE (Redis); docs/protocol.md,
"Guards inside the database", has the calls and the errors. With --print,
install prints the SQL or Lua instead, for psql, the mysql client or
redis-cli -x FUNCTION LOAD REPLACE, and connects to nothing.`,
		Example: `  fencectl guard install 'postgres://app:secret@db.internal:5432/shop'
  fencectl guard install 'mysql://app:secret@db.internal:3306/shop'
  fencectl guard install redis://127.0.0.1:6379
  fencectl guard install --print postgres:// | psql "$DATABASE_URL"`,
		Args: exactArgs("URL"),
		RunE: a.run(func(cmd *cobra.Command, args []string) error {
			t, err := parseGuardTarget(args[0])
			if err != nil {
				return usage(err)
			}
			if print {
				_, err := io.WriteString(a.stdout, t.script)
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), installTimeout)
			defer cancel()
			if err := t.install(ctx); err != nil {
				return hintedError{redactedError{fmt.Errorf("install the guard in %s: %w", redactURL(t.url), err), secrets(t.url)}, installHint(err)}
			}
			out := guardInstallJSON{URL: redactURL(t.url), Kind: t.kind, Installed: t.installed}
			return a.emit(out, func(w io.Writer) {
				fmt.Fprintf(w, "installed fence's guard in %s:\n", out.URL)
				for _, s := range out.Installed {
					fmt.Fprintf(w, "  %s\n", s)
				}
			})
		}),
	}
	cmd.Flags().BoolVar(&print, "print", false, "print the SQL or Lua that install runs, and connect to nothing")
	return cmd
}

// guardTarget is where guard install puts the guard, and what.
type guardTarget struct {
	url       *url.URL
	kind      string // postgres, mysql or redis
	script    string // the SQL or the Lua library
	installed []string
	install   func(ctx context.Context) error
}

func parseGuardTarget(raw string) (*guardTarget, error) {
	u, err := url.Parse(raw)
	if err != nil {
		// Not url.Parse's error, which quotes the URL whole, password and
		// all.
		if ue, ok := errors.AsType[*url.Error](err); ok {
			err = ue.Err
		}
		return nil, fmt.Errorf("URL: %w", err)
	}
	t := &guardTarget{url: u}
	switch u.Scheme {
	case "postgres", "postgresql":
		t.kind = "postgres"
		t.installed = []string{
			"table fence_tokens (scope, token, seq)",
			"function fence_advance(scope text, token bigint, seq bigint DEFAULT 0)",
			"trigger function fence_row_token()",
			"function fence_guard_version() = 1",
		}
		t.install = func(ctx context.Context) error { return installSQL(ctx, "pgx", raw, sqlguard.Postgres) }
		t.script, err = sqlguard.Postgres.InstallSQL()
	case "mysql", "mariadb":
		t.kind = "mysql"
		t.installed = []string{
			"table fence_tokens (scope, token, seq)",
			"procedure fence_advance(scope, token, seq)",
			"procedure fence_row_token(scope, old_token, new_token)",
			"procedures fence_row_insert(scope, new_token), fence_row_delete(scope, old_token)",
			"function fence_guard_version() = 1",
		}
		dsn, dsnErr := mysqlDSN(u)
		t.install = func(ctx context.Context) error {
			if dsnErr != nil {
				return usage(dsnErr) // not for --print, which connects to nothing
			}
			return installSQL(ctx, "mysql", dsn, sqlguard.MySQL)
		}
		t.script, err = sqlguard.MySQL.InstallSQL()
	case "redis", "rediss":
		t.kind = "redis"
		t.installed = []string{"function library " + redisguard.LibraryName + ": fence_set, fence_del, fence_hset, fence_incrby, fence_advance"}
		t.install = func(ctx context.Context) error { return installRedis(ctx, raw) }
		t.script = redisguard.Library()
	default:
		return nil, fmt.Errorf("URL %q: unknown scheme %q: want postgres://, mysql:// or redis://", redactURL(u), u.Scheme)
	}
	return t, err
}

// secretParam reports whether a URL's query parameter of this name holds a
// secret: password= (PostgreSQL, MySQL, Redis), sslpassword= (the
// passphrase of PostgreSQL's client key), and the like.
func secretParam(name string) bool {
	name = strings.ToLower(name)
	for _, s := range []string{"pass", "pwd", "secret", "token"} {
		if strings.Contains(name, s) {
			return true
		}
	}
	return false
}

// redactURL is u.Redacted, which replaces the password of the userinfo
// with "xxxxx", that also replaces the values of query parameters that
// hold secrets (secretParam).
func redactURL(u *url.URL) string {
	r := *u
	if r.RawQuery != "" {
		q := r.Query()
		for k, vs := range q {
			if secretParam(k) {
				for i := range vs {
					vs[i] = "xxxxx"
				}
			}
		}
		r.RawQuery = q.Encode()
	}
	return r.Redacted()
}

// secrets returns the passwords u holds, in the userinfo and in query
// parameters that hold secrets.
func secrets(u *url.URL) []string {
	var out []string
	if p, ok := u.User.Password(); ok && p != "" {
		out = append(out, p)
	}
	for k, vs := range u.Query() {
		if secretParam(k) {
			for _, v := range vs {
				if v != "" {
					out = append(out, v)
				}
			}
		}
	}
	return out
}

// redactedError is an error whose text has the secrets replaced with
// "xxxxx": a driver's error may quote the connection string it was given.
type redactedError struct {
	err     error
	secrets []string
}

func (e redactedError) Error() string {
	s := e.err.Error()
	for _, sec := range e.secrets {
		s = strings.ReplaceAll(s, sec, "xxxxx")
	}
	return s
}

func (e redactedError) Unwrap() error { return e.err }

// hintedError is an error followed by fencectl's advice about it (or
// nothing): outside redactedError, as the advice quotes no secret, and a
// password that is also one of its words ("fence") must not blank it.
type hintedError struct {
	err  error
	hint string
}

func (e hintedError) Error() string { return e.err.Error() + e.hint }
func (e hintedError) Unwrap() error { return e.err }

// mysqlDSN turns mysql://USER:PASSWORD@HOST:PORT/DB?PARAMS into the form
// of github.com/go-sql-driver/mysql, over TCP.
func mysqlDSN(u *url.URL) (string, error) {
	db := strings.TrimPrefix(u.Path, "/")
	if db == "" {
		return "", errors.New("name the database in the URL, as in mysql://user:password@host:3306/shop: the procedures live in one")
	}
	addr := u.Host
	if u.Port() == "" {
		addr = net.JoinHostPort(u.Hostname(), "3306")
	}
	pass, _ := u.User.Password()
	cfg, err := mysql.ParseDSN(fmt.Sprintf("%s:%s@tcp(%s)/%s?%s", u.User.Username(), pass, addr, db, u.RawQuery))
	if err != nil {
		return "", err
	}
	return cfg.FormatDSN(), nil
}

// installHint says what to do about an install error whose own text points
// the wrong way: PostgreSQL's "no schema has been selected to create in"
// (SQLSTATE 3F000) means that no schema search_path names exists (the
// role's own was never made, public was dropped or is not on the path),
// so install has nowhere to put the guard.
func installHint(err error) string {
	if pg, ok := errors.AsType[*pgconn.PgError](err); ok && pg.Code == "3F000" {
		return "; search_path names no schema that exists: create the schema first: CREATE SCHEMA fence;" +
			" then name it in the URL, as in postgres://USER:PASSWORD@HOST:PORT/DB?options=-csearch_path%3Dfence" +
			" (another schema: its name instead of fence), or for the role: ALTER ROLE USER SET search_path = fence"
	}
	return ""
}

func installSQL(ctx context.Context, driver, dsn string, d sqlguard.Dialect) error {
	db, err := sql.Open(driver, dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	if err := db.PingContext(ctx); err != nil {
		return fmt.Errorf("cannot reach the server: %w", err)
	}
	return sqlguard.Install(ctx, db, d)
}

// quietRedis drops go-redis's log lines, one per failed dial: the error
// that install returns says it once.
type quietRedis struct{}

func (quietRedis) Printf(context.Context, string, ...any) {}

func installRedis(ctx context.Context, raw string) error {
	redis.SetLogger(quietRedis{})
	opt, err := redis.ParseURL(raw)
	if err != nil {
		return err
	}
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	if err := rdb.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("cannot reach the server: %w", err)
	}
	err = redisguard.LoadLibrary(ctx, rdb)
	if err != nil && strings.Contains(strings.ToLower(err.Error()), "unknown command") {
		return fmt.Errorf("%w (Redis functions need Redis 7.0 or later)", err)
	}
	return err
}
