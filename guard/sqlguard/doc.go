// Package sqlguard fences writes to a SQL database through database/sql,
// on PostgreSQL, SQLite and MySQL or MariaDB. The highest accepted token of
// each scope lives in a table of the guarded database, and one statement
// checks a write's token against it and advances it inside the
// transaction that then makes the write, so the mark and the data commit
// or roll back together: a late write with an old token is refused even
// after the service restarts.
//
// # Usage
//
// Open the database with the driver of your choice, make a Store for its
// dialect and create the fence table once:
//
//	db, err := sql.Open("pgx", dsn) // github.com/jackc/pgx/v5/stdlib
//	s, err := sqlguard.New(db, sqlguard.Postgres)
//	err = s.CreateTable(ctx) // fence_tokens (scope, token, seq); idempotent
//
// Update begins a transaction, checks and advances the mark, runs the
// caller's writes and commits:
//
//	err = s.Update(ctx, "orders", guard.Write{Token: lease.Token()}, func(tx *sql.Tx) error {
//		_, err := tx.ExecContext(ctx, "UPDATE orders SET total = $1 WHERE shard = $2", total, 7)
//		return err
//	})
//	if errors.Is(err, fence.ErrStale) {
//		// the lease is lost: stop, do not retry with this token
//	}
//
// A stale write returns a *guard.StaleError with the scope and the
// presented and highest tokens; the transaction is rolled back and the
// function never runs. If the function fails, its writes and the mark
// roll back together.
//
// Store is also a guard.Store: guard.New(s) gives a guard.Guard (for
// httpguard, say) whose apply finds the transaction with TxFromContext.
//
// For a table whose rows each carry the token of their last write (a
// column fence_token BIGINT NOT NULL DEFAULT 0), UpdateRow needs no fence
// table: it runs UPDATE t SET ..., fence_token = $t WHERE key = $id AND
// fence_token <= $t in the caller's transaction, and tells a stale token
// (*guard.StaleError, Highest being the row's token) from a missing row
// (ErrNoRow). Table and column names must be plain SQL names; values are
// always bound parameters.
//
// # Why the check and the write are atomic
//
// The fence statement is an upsert of the scope's row whose update applies
// only to a current write. Resolving the conflict locks the scope's row (or
// the database, on SQLite) until the transaction ends, so every other
// fenced write of the scope waits at its own fence statement until the
// caller's writes have committed or rolled back, and then compares against
// the mark they left.
//
// PostgreSQL: INSERT ... ON CONFLICT (scope) DO UPDATE ... WHERE <current>
// RETURNING 1. The unique index arbitrates concurrent first writes of a
// scope; afterwards ON CONFLICT locks the existing row, and under READ
// COMMITTED re-evaluates the WHERE against the newest committed version
// after waiting for a lock holder. A row comes back if and only if the
// write was accepted. READ COMMITTED, the default, suffices. Under
// REPEATABLE READ or SERIALIZABLE the fence is just as safe, but a writer
// that waited for another fenced write of its scope fails with a
// serialization error (SQLSTATE 40001) instead of going on: retry the
// whole Update.
//
// MySQL and MariaDB (InnoDB tables only): INSERT ... ON DUPLICATE KEY
// UPDATE takes an exclusive lock on the scope's index record, and the
// update reads the newest committed row, not the transaction's snapshot,
// at every isolation level, so the default REPEATABLE READ and READ
// COMMITTED both suffice. MySQL's upsert cannot return a row, and its
// rows-affected count cannot tell a stale write from an accepted one that
// changed nothing, so the statement reports its outcome through
// LAST_INSERT_ID(expr), which comes back in the same reply: the decision is
// taken once, in the statement, under the lock. A reply without an
// outcome (say, from a proxy that rewrites insert ids) refuses the write
// with an error.
//
// SQLite: a database file has one writer at a time, so there are no row
// locks to take. The fence statement is the transaction's first, and a
// write, so the transaction holds the write lock from before it reads the
// mark until it commits; every SQLite transaction is serializable. Open the
// database so that writers wait for each other instead of failing at once
// with SQLITE_BUSY, and begin every transaction with BEGIN IMMEDIATE: with
// modernc.org/sqlite, the DSN parameters
//
//	file:data.db?_txlock=immediate&_busy_timeout=5000
//
// (WAL mode, _journal_mode=WAL, lets readers run beside the writer). The
// fence is correct without _txlock=immediate, but then a transaction of
// the caller's that reads before it writes can fail with SQLITE_BUSY
// whatever the timeout, which BEGIN IMMEDIATE rules out. (A pool of one
// connection, db.SetMaxOpenConns(1), serialises writers too, but also
// every reader.)
//
// UpdateRow's statement is the same argument applied to one row: the
// UPDATE locks the row and compares its token under the lock. When no row
// matched, UpdateRow reads the row with SELECT ... FOR UPDATE (SQLite's
// write lock is already held) to tell a missing row from a stale token,
// and, because MySQL reports a matched row that did not change as no row,
// writes again under that lock when the row admits the token.
//
// # Writers in other languages
//
// Install (or `fencectl guard install URL`) puts the same check inside a
// PostgreSQL or MySQL/MariaDB database, as SQL any client can call, on
// the fence table DefaultTable: a Store with the default table and those
// writers share each scope's mark. The scripts are InstallSQL's, embedded
// from sql/postgres.sql and sql/mysql.sql; running them again replaces the
// functions and keeps the marks. In the caller's transaction, before its
// writes:
//
//	SELECT fence.fence_advance('orders', 42::bigint); -- PostgreSQL, installed in schema fence; seq is an optional third argument
//	CALL fence_advance('orders', 42, 0);      -- MySQL: scope, token, sequence (0: none)
//
// A stale token fails with SQLSTATE FN409 (on MySQL, error 1644): on
// PostgreSQL the message reads as guard.StaleError's and DETAIL holds
// "scope=S presented_token=T highest_token=H presented_seq=Q
// highest_seq=R"; on MySQL the message holds the same fields, scope last,
// cut at 128 characters. A malformed argument fails with FN400. MySQL
// keeps the transaction open after an error: the caller must roll it back.
// On PostgreSQL, install into a schema of the guard's own and call the
// functions by their qualified names with bigint arguments: an unqualified
// call may find a function of the same name in a schema earlier in the
// caller's search_path. The functions themselves run with their own
// schema as search_path.
//
// For row tokens, fence_row_token refuses an update that lowers a row's
// fence_token (FN409), as UpdateRow would; attached to inserts and deletes
// too (on MySQL, fence_row_insert and fence_row_delete), it refuses a
// delete that does not present a token at least the row's (PostgreSQL: SET
// LOCAL fence.token; MySQL: @fence_token) and an insert below the mark the
// scope's deletes left:
//
//	CREATE TRIGGER orders_fence BEFORE INSERT OR UPDATE OR DELETE ON orders FOR EACH ROW EXECUTE FUNCTION fence.fence_row_token('orders');
//	CREATE TRIGGER orders_fence BEFORE UPDATE ON orders FOR EACH ROW CALL fence_row_token('orders', OLD.fence_token, NEW.fence_token);
//	CREATE TRIGGER orders_fence_insert BEFORE INSERT ON orders FOR EACH ROW CALL fence_row_insert('orders', NEW.fence_token);
//	CREATE TRIGGER orders_fence_delete BEFORE DELETE ON orders FOR EACH ROW CALL fence_row_delete('orders', OLD.fence_token);
//
// fence_guard_version() returns the scripts' version, 1. The Go Store
// does not call these functions: it needs no install, and its one
// statement is the same upsert. docs/protocol.md, "Guards inside the
// database", has the whole contract.
//
// # Caveats
//
// Each Update costs one statement more than the same unfenced
// transaction: one more round trip to a database server. UpdateRow costs
// none on the accepted path. On PostgreSQL, guard/pgxguard fences through
// pgx on the same table without the extra round trip. See BENCHMARKS.md, "Known costs".
//
// The functions Install puts in the database check no signature: whoever
// may call them, or write the fence table, can set a mark to 2^63-1 and
// lock the scope's holders out. Grant them and the table to the writers and
// the follower alone (docs/security.md, "Who may move a mark", has the
// GRANT and REVOKE statements).
//
// A write rolled back by a deadlock or serialization error, like any
// other failure, leaves the mark where it was; retrying it with the same
// token is safe. A stale write must not be retried with its token.
//
// Token and sequence columns are signed 64-bit: tokens fit (fence.MaxToken
// is 2^63-1), and sequence numbers above 2^63-1 are refused as invalid.
// Row-level fencing keeps no sequence, so UpdateRow refuses a write that
// carries one.
//
// On MySQL the fence statement sets the connection's LAST_INSERT_ID();
// read it only after your own INSERT in the transaction. The tests run
// against MariaDB; MySQL documents the same LAST_INSERT_ID(expr) reply,
// and should a server not send it, every fenced write fails with an
// error rather than passing unchecked.
//
// The fence is as durable as the database's commit: with PostgreSQL's
// fsync or synchronous_commit off, InnoDB's innodb_flush_log_at_trx_commit
// other than 1, or SQLite's synchronous=OFF, a crash can lose an accepted
// mark together with the write it fenced, and a late stale write is then
// accepted. A failover to a replica that missed the last commits has the
// same effect.
package sqlguard
