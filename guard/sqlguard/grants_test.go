package sqlguard_test

// Tests of docs/security.md's recipe ("Who may move a mark"): the guard's
// functions check no signature, so whoever may call them, or write their
// table, can set a mark to 2^63-1 and lock every holder of the scope out.
// The recipe limits that to a role of the writers and the follower.

import (
	"database/sql"
	"fmt"
	"math/rand/v2"
	"net/url"
	"strings"
	"testing"

	"github.com/go-sql-driver/mysql"

	"github.com/fence-dev/fence/guard/sqlguard"
)

// lockout is the call that locks a scope's holders out for good.
const lockout = 9223372036854775807

// wantRefused fails unless err is an error of the server whose message
// contains what.
func wantRefused(t testing.TB, err error, what string) {
	t.Helper()
	if err == nil || !strings.Contains(err.Error(), what) {
		t.Fatalf("got %v, want refused: %s", err, what)
	}
}

// wantMarkIn fails unless the scope's mark, read by the guard's owner from
// table, is token.
func wantMarkIn(t testing.TB, admin *sql.DB, table, scope string, token int64) {
	t.Helper()
	var got int64
	if err := admin.QueryRow("SELECT token FROM " + table + " WHERE scope = '" + scope + "'").Scan(&got); err != nil {
		t.Fatal(err)
	}
	if got != token {
		t.Fatalf("the mark of %s is %d, want %d", scope, got, token)
	}
}

// TestInDatabaseGrantsPostgres applies the PostgreSQL recipe: EXECUTE on
// fence_advance revoked from PUBLIC, and granted, with the rights on
// fence_tokens that the function uses as its caller's, to a role of the
// writers. A role outside it that may read the marks is refused the call,
// the table's update and an insert into a table the row trigger fences;
// the writer's calls, Go Store and insert work, before and after the guard
// is installed again.
func TestInDatabaseGrantsPostgres(t *testing.T) {
	db := newInDB(t, sqlguard.Postgres)
	admin := db.src.open(t)
	schema := db.mustRun(t, "SELECT current_schema();\n")
	fn := schema + ".fence_advance(text, bigint, bigint)"
	suffix := fmt.Sprintf("%08x", rand.Uint32())
	group, writer, other := "fence_writer_"+suffix, "fence_test_writer_"+suffix, "fence_test_other_"+suffix
	password := "pw-" + suffix
	for _, role := range []string{group, writer, other} {
		login := " LOGIN PASSWORD '" + password + "'"
		if role == group {
			login = " NOLOGIN"
		}
		mustExec(t, admin, "CREATE ROLE "+role+login)
		t.Cleanup(func() {
			// DROP OWNED BY also revokes the role's privileges, which
			// DROP ROLE needs gone.
			if _, err := admin.Exec("DROP OWNED BY " + role + "; DROP ROLE " + role); err != nil {
				t.Errorf("drop role %s: %v", role, err)
			}
		})
	}
	for _, st := range []string{
		// The recipe.
		"REVOKE EXECUTE ON FUNCTION " + fn + " FROM PUBLIC",
		"GRANT USAGE ON SCHEMA " + schema + " TO " + group,
		"GRANT EXECUTE ON FUNCTION " + fn + " TO " + group,
		"GRANT SELECT, INSERT, UPDATE ON " + schema + ".fence_tokens TO " + group,
		"GRANT " + group + " TO " + writer,
		// Another role, which may read the marks.
		"GRANT USAGE ON SCHEMA " + schema + " TO " + other,
		"GRANT SELECT ON " + schema + ".fence_tokens TO " + other,
		// A table fenced by the row trigger, which both may write.
		"CREATE TABLE " + schema + ".orders (id int PRIMARY KEY, fence_token bigint NOT NULL)",
		"CREATE TRIGGER orders_fence BEFORE INSERT OR UPDATE OR DELETE ON " + schema + ".orders FOR EACH ROW EXECUTE FUNCTION " + schema + ".fence_row_token('orders')",
		"GRANT SELECT, INSERT, UPDATE, DELETE ON " + schema + ".orders TO " + writer + ", " + other,
	} {
		mustExec(t, admin, st)
	}
	as := func(role string) *sql.DB {
		u, err := url.Parse(db.src.dsn)
		if err != nil {
			t.Fatal(err)
		}
		u.User = url.UserPassword(role, password)
		return source{sqlguard.Postgres, "pgx", u.String()}.open(t)
	}
	wdb, odb := as(writer), as(other)
	call := "SELECT " + schema + ".fence_advance($1::text, $2::bigint, $3::bigint)"
	table := schema + ".fence_tokens"
	store, err := sqlguard.New(wdb, sqlguard.Postgres, sqlguard.WithTable(table), quiet)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	for round, token := range []int64{10, 20} {
		if _, err := wdb.Exec(call, "orders", token, 0); err != nil {
			t.Fatalf("round %d: the writer's call: %v", round, err)
		}
		_, err := wdb.Exec(call, "orders", token-1, 0)
		wantRefused(t, err, "FN409")
		if err := store.Update(ctx, "orders", wr("orders", uint64(token+1), 0), func(*sql.Tx) error { return nil }); err != nil {
			t.Fatalf("round %d: the writer's Go Store: %v", round, err)
		}

		_, err = odb.Exec(call, "orders", lockout, 0)
		wantRefused(t, err, "permission denied for function fence_advance")
		_, err = odb.Exec("UPDATE "+table+" SET token = $1 WHERE scope = 'orders'", int64(lockout))
		wantRefused(t, err, "permission denied for table fence_tokens")
		wantMarkIn(t, admin, table, "orders", token+1)

		// The trigger writes the mark with its caller's rights: a writer
		// of the table needs the role.
		_, err = odb.Exec("INSERT INTO "+schema+".orders VALUES ($1, $2)", round, int64(lockout))
		wantRefused(t, err, "permission denied for table fence_tokens")
		if _, err := wdb.Exec("INSERT INTO "+schema+".orders VALUES ($1, $2)", round, token+1); err != nil {
			t.Fatalf("round %d: the writer's insert: %v", round, err)
		}

		// Installing again replaces the functions and keeps their grants.
		if err := sqlguard.Install(ctx, db.src.open(t), sqlguard.Postgres); err != nil {
			t.Fatal(err)
		}
	}
}

// TestInDatabaseGrantsMySQL applies the MySQL recipe: EXECUTE on the
// guard's database, which holds nothing else, to the writers. Its routines
// run with their definer's rights, so the writer needs and has no right on
// fence_tokens: it cannot move a mark but through fence_advance. A user
// that may read the marks is refused the call and the update; as a writer
// of a table of another database, whose triggers call the guard's
// procedures with their definer's rights, it needs no grant of the guard's.
// A grant on the database, unlike one on the procedure, outlives the
// routines that installing again drops and creates.
func TestInDatabaseGrantsMySQL(t *testing.T) {
	db := newInDB(t, sqlguard.MySQL)
	admin := db.src.open(t)
	cfg, err := mysql.ParseDSN(db.src.dsn)
	if err != nil {
		t.Fatal(err)
	}
	guardDB := cfg.DBName
	suffix := fmt.Sprintf("%08x", rand.Uint32())
	writer, other := "fence_w_"+suffix, "fence_o_"+suffix
	password := "pw-" + suffix
	for _, user := range []string{writer, other} {
		mustExec(t, admin, "CREATE USER '"+user+"'@'%' IDENTIFIED BY '"+password+"'")
		t.Cleanup(func() {
			if _, err := admin.Exec("DROP USER '" + user + "'@'%'"); err != nil {
				t.Errorf("drop user %s: %v", user, err)
			}
		})
	}
	mustExec(t, admin, "GRANT EXECUTE ON `"+guardDB+"`.* TO '"+writer+"'@'%'") // the recipe
	mustExec(t, admin, "GRANT SELECT ON `"+guardDB+"`.fence_tokens TO '"+other+"'@'%'")
	// A table of another database fenced by the row triggers, which name
	// the guard's database.
	appDB := guardDB + "_app"
	mustExec(t, admin, "CREATE DATABASE "+appDB)
	t.Cleanup(func() { admin.Exec("DROP DATABASE " + appDB) })
	orders := appDB + ".orders"
	mustExec(t, admin, "CREATE TABLE "+orders+" (id INT PRIMARY KEY, fence_token BIGINT NOT NULL)")
	mustExec(t, admin, "CREATE TRIGGER "+appDB+".orders_fence BEFORE UPDATE ON "+orders+" FOR EACH ROW CALL `"+guardDB+"`.fence_row_token('orders', OLD.fence_token, NEW.fence_token)")
	mustExec(t, admin, "CREATE TRIGGER "+appDB+".orders_fence_insert BEFORE INSERT ON "+orders+" FOR EACH ROW CALL `"+guardDB+"`.fence_row_insert('orders', NEW.fence_token)")
	mustExec(t, admin, "GRANT SELECT, INSERT, UPDATE ON "+orders+" TO '"+other+"'@'%'")
	as := func(user string) *sql.DB {
		c := cfg.Clone()
		c.User, c.Passwd, c.DBName = user, password, ""
		return source{sqlguard.MySQL, "mysql", c.FormatDSN()}.open(t)
	}
	wdb, odb := as(writer), as(other)
	call := "CALL `" + guardDB + "`.fence_advance(?, ?, ?)"
	table := "`" + guardDB + "`.fence_tokens"
	for round, token := range []int64{10, 20} {
		if _, err := wdb.Exec(call, "orders", token, 0); err != nil {
			t.Fatalf("round %d: the writer's call: %v", round, err)
		}
		_, err := wdb.Exec(call, "orders", token-1, 0)
		wantRefused(t, err, "FN409")
		_, err = wdb.Exec("UPDATE " + table + " SET token = 1 WHERE scope = 'orders'")
		wantRefused(t, err, "UPDATE command denied")

		_, err = odb.Exec(call, "orders", int64(lockout), 0)
		wantRefused(t, err, "execute command denied")
		_, err = odb.Exec("UPDATE "+table+" SET token = ? WHERE scope = 'orders'", int64(lockout))
		wantRefused(t, err, "UPDATE command denied")
		wantMarkIn(t, admin, table, "orders", token)

		if _, err := odb.Exec("INSERT INTO "+orders+" VALUES (?, ?)", round, token); err != nil {
			t.Fatalf("round %d: an insert through the trigger: %v", round, err)
		}
		_, err = odb.Exec("INSERT INTO "+orders+" VALUES (?, ?)", round+10, token-1)
		wantRefused(t, err, "FN409")

		if err := sqlguard.Install(ctx, db.src.open(t), sqlguard.MySQL); err != nil {
			t.Fatal(err)
		}
	}
}
