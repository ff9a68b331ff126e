package sqlguard_test

// Tests of the guards inside the database (sql/*.sql), driven by the
// command-line clients psql and mysql: writers outside Go.

import (
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/guard"
	"github.com/fence-dev/fence/guard/guardtest"
	"github.com/fence-dev/fence/guard/sqlguard"
)

var inDBDialects = []sqlguard.Dialect{sqlguard.Postgres, sqlguard.MySQL}

// inDB is a database of a test's own with the guard installed: a schema
// of the shared PostgreSQL (psql and Go find it through search_path) or a
// database of the shared MariaDB, dropped when the test ends.
type inDB struct {
	d   sqlguard.Dialect
	src source // for Go: the test's own schema or database
	cli []string
	env []string
}

func newInDB(t *testing.T, d sqlguard.Dialect) *inDB {
	t.Helper()
	shared := newSource(t, d)
	name := fmt.Sprintf("sqlguard_indb_%08x", rand.Uint32())
	admin := shared.open(t)
	db := &inDB{d: d, src: shared}
	switch d {
	case sqlguard.Postgres:
		mustExec(t, admin, "CREATE SCHEMA "+name)
		t.Cleanup(func() { admin.Exec("DROP SCHEMA " + name + " CASCADE") })
		// options is a startup parameter both libpq and pgx pass on.
		db.src.dsn += "&options=" + url.QueryEscape("-csearch_path="+name)
		db.cli = psql(db.src.dsn)
	case sqlguard.MySQL:
		mustExec(t, admin, "CREATE DATABASE "+name)
		t.Cleanup(func() { admin.Exec("DROP DATABASE " + name) })
		cfg, err := mysql.ParseDSN(shared.dsn)
		if err != nil {
			t.Fatal(err)
		}
		cfg.DBName = name
		db.src.dsn = cfg.FormatDSN()
		db.cli, db.env = mysqlCLI(t, cfg)
	}
	if _, err := exec.LookPath(db.cli[0]); err != nil {
		skipOrFail(t, "the %s client is missing: %v", db.cli[0], err)
	}
	if err := sqlguard.Install(ctx, db.src.open(t), d); err != nil {
		t.Fatal(err)
	}
	return db
}

// mysqlCLI is the command line, and its environment, of the mysql client
// for a session of cfg's database.
func mysqlCLI(t testing.TB, cfg *mysql.Config) (cli, env []string) {
	t.Helper()
	host, port, err := net.SplitHostPort(cfg.Addr)
	if err != nil {
		t.Fatal(err)
	}
	// MariaDB 11 calls its client mariadb, and mysql only with a
	// compatibility package.
	client := "mysql"
	if _, err := exec.LookPath("mariadb"); err == nil {
		client = "mariadb"
	}
	return []string{client, "--no-defaults", "--protocol=tcp", "-h", host, "-P", port, "-u", cfg.User, "-N", "-B", cfg.DBName},
		[]string{"MYSQL_PWD=" + cfg.Passwd}
}

// psql is the command line of psql for a session of dsn: stop at the
// first error, report SQLSTATEs, print bare values.
func psql(dsn string) []string {
	return []string{"psql", "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-v", "VERBOSITY=verbose", dsn}
}

// run runs input in one session of the command-line client, which stops
// at the first error, and returns its output, or its error output as an
// error.
func (db *inDB) run(input string) (string, error) {
	out, stderr, err := db.session(input)
	if err != nil {
		return out, fmt.Errorf("%s: %w: %s", db.cli[0], err, stderr)
	}
	return out, nil
}

// session runs input in one session of the command-line client and
// returns its output and error output.
func (db *inDB) session(input string) (string, string, error) {
	cmd := exec.Command(db.cli[0], db.cli[1:]...)
	cmd.Env = append(os.Environ(), db.env...)
	cmd.Stdin = strings.NewReader(input)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	return strings.TrimSpace(string(out)), strings.TrimSpace(stderr.String()), err
}

// writeAll makes one writer's fenced writes (scope, token) and returns how
// many were refused as stale. psql runs them in one session, going on
// after an error: PostgreSQL aborts the transaction of a stale write, and
// its COMMIT rolls back. The mysql client must stop at the error instead,
// because MySQL would commit the writes after it, so it gets a session per
// write: the server rolls back the transaction of a client that leaves.
func (db *inDB) writeAll(writes []write) (int, error) {
	stale := 0
	if db.d == sqlguard.Postgres {
		var in strings.Builder
		in.WriteString("\\set ON_ERROR_STOP 0\n")
		for _, w := range writes {
			in.WriteString(db.write(w.scope, w.token))
		}
		_, stderr, err := db.session(in.String())
		if err != nil {
			return 0, fmt.Errorf("psql: %w: %s", err, stderr)
		}
		for l := range strings.Lines(stderr) {
			switch {
			case strings.Contains(l, "ERROR:  FN409:"):
				stale++
			case strings.Contains(l, "ERROR:  25P02:"): // the rest of a stale write's transaction
			case strings.Contains(l, "ERROR:"):
				return stale, errors.New(l)
			}
		}
		return stale, nil
	}
	for _, w := range writes {
		_, err := db.run(db.write(w.scope, w.token))
		switch {
		case err != nil && strings.Contains(err.Error(), "FN409"):
			stale++
		case err != nil:
			return stale, err
		}
	}
	return stale, nil
}

type write struct {
	scope string
	token uint64
}

func (db *inDB) mustRun(t testing.TB, input string) string {
	t.Helper()
	out, err := db.run(input)
	if err != nil {
		t.Fatalf("%s\n%v", input, err)
	}
	return out
}

// advance is the client's call of fence_advance.
func (db *inDB) advance(scope string, token uint64) string {
	if db.d == sqlguard.Postgres {
		return fmt.Sprintf("SELECT fence_advance('%s', %d);\n", scope, token)
	}
	return fmt.Sprintf("CALL fence_advance('%s', %d, 0);\n", scope, token)
}

// createTables creates the tables that write writes: log, of every write
// in the order they landed, and val, of each scope's value.
func (db *inDB) createTables(t testing.TB) {
	t.Helper()
	id := map[sqlguard.Dialect]string{sqlguard.Postgres: "bigserial", sqlguard.MySQL: "BIGINT AUTO_INCREMENT"}[db.d]
	db.mustRun(t, "CREATE TABLE log (id "+id+" PRIMARY KEY, scope VARCHAR(64) NOT NULL, token BIGINT NOT NULL);\n"+
		"CREATE TABLE val (scope VARCHAR(64) PRIMARY KEY, token BIGINT NOT NULL);\n")
}

// write is one fenced transaction of the client: check token against its
// scope's mark, then append to log and set the scope's value.
func (db *inDB) write(scope string, token uint64) string {
	begin, upsert := "BEGIN;\n", "INSERT INTO val (scope, token) VALUES ('%s', %d) ON CONFLICT (scope) DO UPDATE SET token = excluded.token;\n"
	if db.d == sqlguard.MySQL {
		begin, upsert = "START TRANSACTION;\n", "INSERT INTO val (scope, token) VALUES ('%s', %d) ON DUPLICATE KEY UPDATE token = VALUES(token);\n"
	}
	return begin + db.advance(scope, token) +
		fmt.Sprintf("INSERT INTO log (scope, token) VALUES ('%s', %d);\n", scope, token) +
		fmt.Sprintf(upsert, scope, token) + "COMMIT;\n"
}

// wantStale fails unless err is the guard's stale error for presented
// against highest.
func wantStale(t testing.TB, err error, presented, highest uint64) {
	t.Helper()
	want := fmt.Sprintf(`presented_token=%d highest_token=%d\b`, presented, highest)
	if err == nil || !strings.Contains(err.Error(), "FN409") || !regexp.MustCompile(want).MatchString(err.Error()) {
		t.Fatalf("got %v, want SQLSTATE FN409 with %s", err, want)
	}
}

func mark(t testing.TB, s *sqlguard.Store, scope string) uint64 {
	t.Helper()
	m, err := s.Highest(ctx, scope)
	if err != nil {
		t.Fatal(err)
	}
	return m.Token
}

// TestInDatabaseConcurrentWriters has 16 concurrent writers (see
// writeAll) make 50 fenced writes each, of older and newer tokens, to
// three scopes, each write appending to a log and setting the scope's
// value in the transaction that advances the mark. Per scope the log must be
// non-decreasing in token, every refusal stale, and the mark and the value
// the highest token written: invariant 6 for writers outside Go.
func TestInDatabaseConcurrentWriters(t *testing.T) {
	for _, d := range inDBDialects {
		t.Run(d.String(), func(t *testing.T) {
			db := newInDB(t, d)
			db.createTables(t)
			scopes := []string{"orders/1", "orders/2", "orders/3"}
			writers, writes := 16, 50
			if d == sqlguard.MySQL {
				writes = 20 // a mysql process per write: 50 would take a minute on a busy machine
			}
			var (
				mu        sync.Mutex
				stale     int
				errs      []error
				wg        sync.WaitGroup
				presented []write
			)
			for range writers {
				wg.Go(func() {
					ws := make([]write, writes)
					for j := range ws {
						// Tokens grow as writers go on, and writers at the
						// same point overtake each other: some are stale.
						ws[j] = write{scopes[rand.N(len(scopes))], 1 + uint64(j)*8 + rand.Uint64N(64)}
					}
					n, err := db.writeAll(ws)
					mu.Lock()
					defer mu.Unlock()
					presented = append(presented, ws...)
					stale += n
					if err != nil {
						errs = append(errs, err)
					}
				})
			}
			wg.Wait()
			if len(errs) > 0 {
				t.Fatalf("%d writers had writes fail other than stale, such as: %v", len(errs), errs[0])
			}
			s := newStore(t, db.src.open(t), d, quiet)
			landed := 0
			for _, sc := range scopes {
				var logged []uint64
				for _, row := range strings.Fields(db.mustRun(t, "SELECT token FROM log WHERE scope = '"+sc+"' ORDER BY id;\n")) {
					v, _ := strconv.ParseUint(row, 10, 64)
					logged = append(logged, v)
				}
				landed += len(logged)
				if !slices.IsSorted(logged) {
					t.Errorf("%s: the log of landed writes goes back: %v", sc, logged)
				}
				top := uint64(0)
				for _, w := range presented {
					if w.scope == sc {
						top = max(top, w.token)
					}
				}
				val := db.mustRun(t, "SELECT token FROM val WHERE scope = '"+sc+"';\n")
				if m := mark(t, s, sc); m != top || len(logged) == 0 || logged[len(logged)-1] != top || val != strconv.FormatUint(top, 10) {
					t.Errorf("%s: mark %d, value written by %s; want both %d, the highest presented", sc, m, val, top)
				}
			}
			if landed+stale != writers*writes {
				t.Errorf("%d writes landed and %d were stale, want %d in all", landed, stale, writers*writes)
			}
			t.Logf("%d writes landed, %d were refused as stale", landed, stale)
		})
	}
}

// TestInDatabaseLateWriteInNewSession: a token accepted in one session
// still refuses a lower one in the next. The mark is a committed row, so a
// new session reads what a restarted server would; TestInDatabaseRestart
// restarts a PostgreSQL and a MariaDB of its own. (The shared servers of `make services`
// serve every test running on the machine, so no test restarts them.)
func TestInDatabaseLateWriteInNewSession(t *testing.T) {
	for _, d := range inDBDialects {
		t.Run(d.String(), func(t *testing.T) {
			db := newInDB(t, d)
			db.mustRun(t, db.advance("jobs", 42))
			_, err := db.run(db.advance("jobs", 41))
			wantStale(t, err, 41, 42)
			db.mustRun(t, db.advance("jobs", 42)) // the holder of 42 goes on
		})
	}
}

// TestInDatabaseRestart: a PostgreSQL that accepted token 42 from psql
// refuses a late 41 after it crashed (pg_ctl stop -m immediate: no
// shutdown checkpoint, so the mark comes back by WAL replay) and started
// again; so does a MariaDB killed with SIGKILL (InnoDB's redo log brings
// the mark back). The subtests are named like the others, so that make
// test-short, which runs neither server, leaves them out.
func TestInDatabaseRestart(t *testing.T) {
	t.Run("postgres", func(t *testing.T) {
		srv := startPostgres(t)
		db := &inDB{d: sqlguard.Postgres, src: source{sqlguard.Postgres, "pgx", srv.dsn}, cli: psql(srv.dsn)}
		lateWriteAfterRestart(t, db, srv.restart)
	})
	t.Run("mysql", func(t *testing.T) {
		srv := startMariaDB(t)
		cfg, err := mysql.ParseDSN(srv.dsn)
		if err != nil {
			t.Fatal(err)
		}
		db := &inDB{d: sqlguard.MySQL, src: source{sqlguard.MySQL, "mysql", srv.dsn}}
		db.cli, db.env = mysqlCLI(t, cfg)
		lateWriteAfterRestart(t, db, srv.restart)
	})
}

// lateWriteAfterRestart installs the guard in db's server, writes with
// token 42 through the command-line client, restarts the server and has a
// late 41 refused, the value left the one 42 wrote.
func lateWriteAfterRestart(t *testing.T, db *inDB, restart func(*testing.T)) {
	sdb := db.src.open(t)
	if err := sqlguard.Install(ctx, sdb, db.d); err != nil {
		t.Fatal(err)
	}
	sdb.Close()
	db.createTables(t)
	db.mustRun(t, db.write("jobs", 42))
	restart(t)
	_, err := db.run(db.advance("jobs", 41))
	wantStale(t, err, 41, 42)
	if v := db.mustRun(t, "SELECT token FROM val WHERE scope = 'jobs';\n"); v != "42" {
		t.Fatalf("the value was written by %s after the late write, want 42", v)
	}
}

// mariaDB is a MariaDB server of one test, in a directory of its own.
type mariaDB struct {
	server, log string
	args        []string
	dsn         string
	cmd         *exec.Cmd
}

// startMariaDB initializes a data directory and starts a MariaDB on it,
// with a user fence (password fence) and a database fence.
func startMariaDB(t *testing.T) *mariaDB {
	t.Helper()
	find := func(names ...string) string {
		for _, n := range names {
			for _, p := range []string{n, "/usr/sbin/" + n} {
				if path, err := exec.LookPath(p); err == nil {
					return path
				}
			}
		}
		skipOrFail(t, "%s not found", names[0])
		return ""
	}
	server, installDB := find("mariadbd", "mysqld"), find("mariadb-install-db", "mysql_install_db")
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	asRoot := []string{}
	if os.Geteuid() == 0 {
		asRoot = []string{"--user=root"} // as make services runs it: nothing to chown
	}
	if out, err := exec.Command(installDB, append([]string{"--no-defaults", "--datadir=" + data, "--skip-test-db"}, asRoot...)...).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", installDB, err, out)
	}
	initSQL := filepath.Join(dir, "init.sql")
	if err := os.WriteFile(initSQL, []byte("CREATE DATABASE IF NOT EXISTS fence;\n"+
		"CREATE USER IF NOT EXISTS 'fence'@'127.0.0.1' IDENTIFIED BY 'fence';\n"+
		"GRANT ALL PRIVILEGES ON *.* TO 'fence'@'127.0.0.1';\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	srv := &mariaDB{server: server, log: filepath.Join(dir, "log"), dsn: fmt.Sprintf("fence:fence@tcp(127.0.0.1:%d)/fence", port), args: append([]string{
		"--no-defaults", "--datadir=" + data, "--bind-address=127.0.0.1", fmt.Sprintf("--port=%d", port),
		"--socket=" + filepath.Join(dir, "sock"), "--log-error=" + filepath.Join(dir, "log"),
		"--init-file=" + initSQL, "--skip-name-resolve",
		"--innodb-flush-log-at-trx-commit=1", // a commit is on disk before it is acknowledged
	}, asRoot...)}
	srv.start(t)
	t.Cleanup(func() { srv.cmd.Process.Kill(); srv.cmd.Wait() })
	return srv
}

// start starts the server and waits, at most a minute, until it answers.
func (srv *mariaDB) start(t *testing.T) {
	t.Helper()
	srv.cmd = exec.Command(srv.server, srv.args...)
	if err := srv.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("mysql", srv.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for deadline := time.Now().Add(time.Minute); db.PingContext(ctx) != nil; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(srv.log)
			t.Fatalf("MariaDB did not answer within a minute:\n%s", log)
		}
	}
}

// restart kills the server with SIGKILL, as a crash would, and starts it
// again on its data.
func (srv *mariaDB) restart(t *testing.T) {
	t.Helper()
	srv.cmd.Process.Kill()
	srv.cmd.Wait()
	srv.start(t)
}

// pgServer is a PostgreSQL server of one test, in a directory of its own.
type pgServer struct {
	bin, data  string
	port       int
	dsn        string
	asPostgres bool // running as root: PostgreSQL's programs run as the postgres user
}

func startPostgres(t *testing.T) *pgServer {
	t.Helper()
	bins, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb") // Debian keeps them off PATH
	initdb := ""
	if len(bins) > 0 {
		initdb = bins[len(bins)-1]
	} else if p, err := exec.LookPath("initdb"); err == nil {
		initdb = p
	} else {
		skipOrFail(t, "initdb not found: %v", err)
	}
	dir, err := os.MkdirTemp("", "sqlguard-pg-") // not t.TempDir: the postgres user must reach it
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	srv := &pgServer{bin: filepath.Dir(initdb), data: filepath.Join(dir, "data"), asPostgres: os.Geteuid() == 0}
	if srv.asPostgres {
		if out, err := exec.Command("chown", "postgres", dir).CombinedOutput(); err != nil {
			skipOrFail(t, "running as root, and cannot give %s to the postgres user: %v: %s", dir, err, out)
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv.port = l.Addr().(*net.TCPAddr).Port
	l.Close()
	srv.dsn = fmt.Sprintf("postgres://fence@127.0.0.1:%d/postgres?sslmode=disable", srv.port)
	srv.run(t, "initdb", "-D", srv.data, "-U", "fence", "-A", "trust", "--no-locale", "-E", "UTF8")
	srv.start(t)
	t.Cleanup(func() { srv.ctl("stop", "-m", "immediate") })
	return srv
}

// ctl runs pg_ctl on the server's data directory.
func (srv *pgServer) ctl(args ...string) ([]byte, error) {
	return srv.cmd("pg_ctl", append([]string{"-D", srv.data}, args...)...).CombinedOutput()
}

func (srv *pgServer) cmd(prog string, args ...string) *exec.Cmd {
	if srv.asPostgres {
		return exec.Command("runuser", append([]string{"-u", "postgres", "--", filepath.Join(srv.bin, prog)}, args...)...)
	}
	return exec.Command(filepath.Join(srv.bin, prog), args...)
}

func (srv *pgServer) run(t *testing.T, prog string, args ...string) {
	t.Helper()
	if out, err := srv.cmd(prog, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", prog, err, out)
	}
}

// start starts the server and waits until it accepts connections (pg_ctl
// -w waits at most 60 seconds).
func (srv *pgServer) start(t *testing.T) {
	t.Helper()
	opts := fmt.Sprintf("-p %d -c listen_addresses=127.0.0.1 -c unix_socket_directories=''", srv.port)
	if out, err := srv.ctl("start", "-w", "-l", filepath.Join(filepath.Dir(srv.data), "log"), "-o", opts); err != nil {
		log, _ := os.ReadFile(filepath.Join(filepath.Dir(srv.data), "log"))
		t.Fatalf("pg_ctl start: %v\n%s\n%s", err, out, log)
	}
}

// restart stops the server as a crash would, and starts it again.
func (srv *pgServer) restart(t *testing.T) {
	t.Helper()
	if out, err := srv.ctl("stop", "-w", "-m", "immediate"); err != nil {
		t.Fatalf("pg_ctl stop: %v\n%s", err, out)
	}
	srv.start(t)
}

// TestInDatabaseBeyondFloat compares tokens that doubles cannot tell
// apart, and the largest token.
func TestInDatabaseBeyondFloat(t *testing.T) {
	for _, d := range inDBDialects {
		t.Run(d.String(), func(t *testing.T) {
			db := newInDB(t, d)
			const p53 = 1 << 53
			db.mustRun(t, db.advance("big", p53+1))
			_, err := db.run(db.advance("big", p53))
			wantStale(t, err, p53, p53+1)
			db.mustRun(t, db.advance("big", fence.MaxToken))
			_, err = db.run(db.advance("big", fence.MaxToken-1))
			wantStale(t, err, fence.MaxToken-1, fence.MaxToken)
			// 2^63 is no token: refused as malformed (FN400 on MySQL, no
			// fence_advance(text, numeric) on PostgreSQL), never clamped.
			if _, err := db.run(db.advance("big", fence.MaxToken+1)); err == nil || strings.Contains(err.Error(), "FN409") {
				t.Fatalf("token 2^63: %v, want an error that is not stale", err)
			}
			if _, err := db.run(db.advance("big2", fence.MaxToken+1)); err == nil {
				t.Fatal("token 2^63 accepted for a new scope")
			}
			if m := mark(t, newStore(t, db.src.open(t), d), "big"); m != fence.MaxToken {
				t.Fatalf("mark %d, want %d", m, uint64(fence.MaxToken))
			}
		})
	}
}

// TestInDatabaseSharesGoMark has a Go Store and the command-line client
// write one scope: each refuses what the other's higher token superseded.
func TestInDatabaseSharesGoMark(t *testing.T) {
	for _, d := range inDBDialects {
		t.Run(d.String(), func(t *testing.T) {
			db := newInDB(t, d)
			s := newStore(t, db.src.open(t), d, quiet)
			goWrite := func(v uint64) error {
				return s.Update(ctx, "shared", wr("shared", v, 0), func(*sql.Tx) error { return nil })
			}
			if err := goWrite(43); err != nil {
				t.Fatal(err)
			}
			_, err := db.run(db.advance("shared", 42))
			wantStale(t, err, 42, 43)
			db.mustRun(t, db.advance("shared", 44))
			var stale *guard.StaleError
			if err := goWrite(43); !errors.As(err, &stale) || stale.Highest != 44 {
				t.Fatalf("Go write of 43 after the client's 44: %v, want stale against 44", err)
			}
		})
	}
}

// TestInDatabaseRowTrigger attaches the row-token check to a table with
// the documented CREATE TRIGGER, and has UpdateRow and the client write
// one row.
func TestInDatabaseRowTrigger(t *testing.T) {
	for _, d := range inDBDialects {
		t.Run(d.String(), func(t *testing.T) {
			db := newInDB(t, d)
			trigger := "CREATE TRIGGER orders_fence BEFORE UPDATE ON orders FOR EACH ROW EXECUTE FUNCTION fence_row_token('orders');\n"
			if d == sqlguard.MySQL {
				trigger = "CREATE TRIGGER orders_fence BEFORE UPDATE ON orders FOR EACH ROW CALL fence_row_token('orders', OLD.fence_token, NEW.fence_token);\n"
			}
			db.mustRun(t, "CREATE TABLE orders (id INT PRIMARY KEY, total INT NOT NULL, fence_token BIGINT NOT NULL DEFAULT 0);\n"+
				trigger+"INSERT INTO orders (id, total) VALUES (7, 0);\n")
			update := func(total int, token uint64) error {
				_, err := db.run(fmt.Sprintf("UPDATE orders SET total = %d, fence_token = %d WHERE id = 7;\n", total, token))
				return err
			}
			s := newStore(t, db.src.open(t), d, quiet)
			goUpdate := func(total int, token uint64) error {
				tx, err := s.DB().Begin()
				if err != nil {
					t.Fatal(err)
				}
				defer tx.Rollback()
				row := sqlguard.Row{Table: "orders", Key: "id", ID: 7}
				if err := s.UpdateRow(ctx, tx, "orders", wr("orders", token, 0), row, map[string]any{"total": total}); err != nil {
					return err
				}
				return tx.Commit()
			}
			if err := goUpdate(1, 43); err != nil {
				t.Fatal(err)
			}
			wantStale(t, update(2, 42), 42, 43)
			if err := update(3, 1<<53+1); err != nil {
				t.Fatal(err)
			}
			wantStale(t, update(4, 1<<53), 1<<53, 1<<53+1)
			if err := goUpdate(5, 44); !errors.Is(err, fence.ErrStale) {
				t.Fatalf("Go update with 44 after the client's 2^53+1: %v, want stale", err)
			}
			if got := db.mustRun(t, "SELECT total, fence_token FROM orders WHERE id = 7;\n"); strings.Join(strings.Fields(strings.ReplaceAll(got, "|", " ")), " ") != "3 9007199254740993" {
				t.Fatalf("row %q, want the client's write of 3 with token 2^53+1", got)
			}
		})
	}
}

// TestInstall installs the guard again, twice at once, and through the
// client from InstallSQL, and checks that it keeps the marks and that its
// table is the Store's.
func TestInstall(t *testing.T) {
	for _, d := range inDBDialects {
		t.Run(d.String(), func(t *testing.T) {
			db := newInDB(t, d)
			script, err := d.InstallSQL()
			if err != nil {
				t.Fatal(err)
			}
			create, _ := d.CreateTableSQL(sqlguard.DefaultTable)
			if !strings.Contains(script, create+";\n") {
				t.Fatalf("the install script does not create the Store's table with %q", create)
			}
			db.mustRun(t, db.advance("kept", 42))
			var wg sync.WaitGroup
			dbs := []*sql.DB{db.src.open(t), db.src.open(t)}
			errs := make([]error, len(dbs))
			for i, sdb := range dbs {
				wg.Go(func() { errs[i] = sqlguard.Install(ctx, sdb, d) })
			}
			wg.Wait()
			if err := errors.Join(errs...); err != nil {
				t.Fatal(err)
			}
			db.mustRun(t, script)
			if v := db.mustRun(t, "SELECT fence_guard_version();\n"); v != "1" {
				t.Fatalf("fence_guard_version() = %q, want 1", v)
			}
			_, err = db.run(db.advance("kept", 41))
			wantStale(t, err, 41, 42)
		})
	}
	if _, err := sqlguard.SQLite.InstallSQL(); !errors.Is(err, fence.ErrInvalid) {
		t.Fatalf("SQLite install script: %v, want invalid", err)
	}
}

// TestInDatabaseProtocolVectors runs the comparison cases of the guard
// protocol's test vectors (testdata/protocol/vectors.json) through
// fence_advance: the mark at the case's highest token and sequence, then
// the presented one, accepted or refused as stale as the case says.
func TestInDatabaseProtocolVectors(t *testing.T) {
	for _, d := range inDBDialects {
		t.Run(d.String(), func(t *testing.T) {
			db := newInDB(t, d)
			call := map[sqlguard.Dialect]string{sqlguard.Postgres: "SELECT", sqlguard.MySQL: "CALL"}[d]
			for i, c := range guardtest.CompareVectors(t) {
				scope := fmt.Sprintf("vec%d", i)
				db.mustRun(t, fmt.Sprintf("%s fence_advance('%s', %s, %d);\n", call, scope, c.Highest, c.HighestSequence))
				_, err := db.run(fmt.Sprintf("%s fence_advance('%s', %s, %d);\n", call, scope, c.Presented, c.PresentedSequence))
				switch {
				case c.Accepted && err != nil:
					t.Errorf("%s (%s after %s): refused: %v", c.Why, c.Presented, c.Highest, err)
				case !c.Accepted && (err == nil || !strings.Contains(err.Error(), "FN409")):
					t.Errorf("%s (%s after %s): %v, want refused as stale (FN409)", c.Why, c.Presented, c.Highest, err)
				}
			}
		})
	}
}

// TestInDatabaseRefusesBadScopes calls fence_advance with scopes the
// protocol refuses, as bound parameters of the Go drivers: each is refused
// as malformed (FN400) and leaves no mark. MariaDB's REGEXP, PCRE, lets
// '$' match before a final newline, so "orders\n" passed there.
func TestInDatabaseRefusesBadScopes(t *testing.T) {
	for _, d := range inDBDialects {
		t.Run(d.String(), func(t *testing.T) {
			db := newInDB(t, d)
			sdb := db.src.open(t)
			call := "CALL fence_advance(?, 1, 0)"
			if d == sqlguard.Postgres {
				call = "SELECT fence_advance($1::text, 1::bigint)"
			}
			if _, err := sdb.Exec(call, "orders/a"); err != nil {
				t.Fatalf("a good scope: %v", err)
			}
			for _, scope := range []string{"orders\n", "orders\r", "orders\r\n", "orders/a\n", "\norders", "or\nders",
				"orders\x00", "orders\t", "", "/orders", "orders/", "orders//a", "orders/..", "./a", "or ders", "ordérs",
				strings.Repeat("s", 257)} {
				_, err := sdb.Exec(call, scope)
				if d == sqlguard.Postgres && strings.ContainsRune(scope, 0) && err != nil && strings.Contains(err.Error(), "22021") {
					continue // text cannot hold a NUL: refused before the call
				}
				if err == nil || !strings.Contains(err.Error(), "FN400") {
					t.Errorf("scope %q: %v; want refused as malformed (FN400)", scope, err)
				}
			}
			var n int
			if err := sdb.QueryRow("SELECT count(*) FROM fence_tokens").Scan(&n); err != nil || n != 1 {
				t.Errorf("%d marks, %v; want the good scope's alone", n, err)
			}
		})
	}
}

// TestInDatabaseRowDeleteInsert: with the row-token check on inserts and
// deletes too, a stale holder can neither delete a newer holder's row nor,
// once the newer holder deleted it, insert it again with its older token.
// Fenced by updates alone, it could do both.
func TestInDatabaseRowDeleteInsert(t *testing.T) {
	for _, d := range inDBDialects {
		t.Run(d.String(), func(t *testing.T) {
			db := newInDB(t, d)
			triggers := "CREATE TRIGGER orders_fence BEFORE INSERT OR UPDATE OR DELETE ON orders FOR EACH ROW EXECUTE FUNCTION fence_row_token('orders');\n"
			del := func(token string) string {
				if token == "" {
					return "BEGIN;\nDELETE FROM orders WHERE id = 7;\nCOMMIT;\n"
				}
				return "BEGIN;\nSET LOCAL fence.token = '" + token + "';\nDELETE FROM orders WHERE id = 7;\nCOMMIT;\n"
			}
			if d == sqlguard.MySQL {
				triggers = "CREATE TRIGGER orders_fence BEFORE UPDATE ON orders FOR EACH ROW CALL fence_row_token('orders', OLD.fence_token, NEW.fence_token);\n" +
					"CREATE TRIGGER orders_fence_insert BEFORE INSERT ON orders FOR EACH ROW CALL fence_row_insert('orders', NEW.fence_token);\n" +
					"CREATE TRIGGER orders_fence_delete BEFORE DELETE ON orders FOR EACH ROW CALL fence_row_delete('orders', OLD.fence_token);\n"
				del = func(token string) string {
					set := ""
					if token != "" {
						set = "SET @fence_token = " + token + ";\n"
					}
					return "START TRANSACTION;\n" + set + "DELETE FROM orders WHERE id = 7;\nCOMMIT;\n"
				}
			}
			insert := func(token uint64) error {
				_, err := db.run(fmt.Sprintf("INSERT INTO orders (id, total, fence_token) VALUES (7, %d, %d);\n", token, token))
				return err
			}
			rows := func() string {
				return strings.Join(strings.Fields(strings.ReplaceAll(db.mustRun(t, "SELECT id, total, fence_token FROM orders;\n"), "|", " ")), " ")
			}
			db.mustRun(t, "CREATE TABLE orders (id INT PRIMARY KEY, total INT NOT NULL, fence_token BIGINT NOT NULL);\n"+triggers)
			if err := insert(42); err != nil {
				t.Fatal(err)
			}
			db.mustRun(t, "UPDATE orders SET total = 43, fence_token = 43 WHERE id = 7;\n")

			// The holder of 42 deletes 43's row: refused.
			if _, err := db.run(del("")); err == nil || !strings.Contains(err.Error(), "FN400") {
				t.Fatalf("a delete without a token: %v; want refused (FN400)", err)
			}
			_, err := db.run(del("42"))
			wantStale(t, err, 42, 43)
			if got := rows(); got != "7 43 43" {
				t.Fatalf("after the refused deletes the table holds %q, want 43's row", got)
			}

			// 43 deletes its row; 42 inserts it again: refused, as is an
			// insert of another row of the scope with 42.
			db.mustRun(t, del("43"))
			wantStale(t, insert(42), 42, 43)
			if got := rows(); got != "" {
				t.Fatalf("after 43's delete and 42's insert the table holds %q, want nothing", got)
			}
			if err := insert(44); err != nil {
				t.Fatalf("an insert by a newer holder: %v", err)
			}
			if got := rows(); got != "7 44 44" {
				t.Fatalf("the table holds %q, want 44's row", got)
			}
			if m := mark(t, newStore(t, db.src.open(t), d, quiet), "orders"); m != 43 {
				t.Fatalf("the scope's mark %d, want 43, from the delete", m)
			}
		})
	}
}

// TestInDatabaseSearchPathShadow: a role that can create in a schema
// earlier in a writer's search_path makes a table fence_tokens there (and a
// fence_advance(text, integer, integer), which an unqualified call with
// integer arguments would pick). The writer's qualified call still checks
// the guard's own table, and refuses a stale token: the function's
// search_path is its own schema. Before, its unqualified fence_tokens was
// the other role's table, in which every token passed.
func TestInDatabaseSearchPathShadow(t *testing.T) {
	db := newInDB(t, sqlguard.Postgres)
	guardSchema := db.mustRun(t, "SELECT current_schema();\n")
	evil := guardSchema + "_evil"
	admin := db.src.open(t)
	mustExec(t, admin, "CREATE SCHEMA "+evil)
	t.Cleanup(func() { admin.Exec("DROP SCHEMA " + evil + " CASCADE") })
	mustExec(t, admin, "CREATE TABLE "+evil+".fence_tokens (scope varchar(256) PRIMARY KEY, token bigint NOT NULL, seq bigint NOT NULL)")
	mustExec(t, admin, "CREATE FUNCTION "+evil+".fence_advance(scope text, token integer, seq integer DEFAULT 0) RETURNS void LANGUAGE sql AS 'SELECT NULL'")

	call := func(token uint64) string {
		return fmt.Sprintf("SELECT %s.fence_advance('x', %d::bigint);\n", guardSchema, token)
	}
	db.mustRun(t, call(10))
	_, err := db.run("SET search_path = " + evil + ", " + guardSchema + ";\n" + call(5))
	wantStale(t, err, 5, 10)
	if n := db.mustRun(t, "SELECT count(*) FROM "+evil+".fence_tokens;\n"); n != "0" {
		t.Fatalf("the other role's fence_tokens has %s rows, want none", n)
	}
}
