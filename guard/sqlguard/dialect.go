package sqlguard

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/fence-dev/fence"
)

// Dialect is the SQL a Store speaks: PostgreSQL, SQLite or MySQL (and
// MariaDB). It names no driver: the *sql.DB brings its own.
type Dialect int

// The dialects. Each one's atomicity argument is in the package
// documentation.
const (
	// Postgres is PostgreSQL 9.5 or later (ON CONFLICT), for instance
	// through github.com/jackc/pgx/v5/stdlib.
	Postgres Dialect = iota + 1
	// SQLite is SQLite 3.35 or later, for instance through
	// modernc.org/sqlite.
	SQLite
	// MySQL is MySQL or MariaDB with InnoDB tables, for instance through
	// github.com/go-sql-driver/mysql.
	MySQL
)

func (d Dialect) String() string {
	switch d {
	case Postgres:
		return "postgres"
	case SQLite:
		return "sqlite"
	case MySQL:
		return "mysql"
	}
	return "Dialect(" + strconv.Itoa(int(d)) + ")"
}

func (d Dialect) check() error {
	if d < Postgres || d > MySQL {
		return &fence.InvalidError{Field: "dialect", Reason: fmt.Sprintf("%v is not Postgres, SQLite or MySQL", d)}
	}
	return nil
}

// CreateTableSQL returns the statement that creates a fence table named
// table for dialect d if it does not exist, or an error if table is not a
// plain SQL name (see WithTable). A Store's CreateTable runs it; so does
// guard/pgxguard's, which keeps its marks in the same table as a Store of
// the Postgres dialect, so that the two can fence the same scopes.
func (d Dialect) CreateTableSQL(table string) (string, error) {
	if err := d.check(); err != nil {
		return "", err
	}
	if err := checkName("table", table, true); err != nil {
		return "", err
	}
	return d.createTable(table), nil
}

// createTable is the fence table: one row per scope. token and seq are
// signed 64-bit in every dialect, which holds every token (fence.MaxToken
// is 2^63-1) and the sequence numbers validate admits. MySQL's scope is
// VARBINARY so that scopes compare bytewise, as they do everywhere else:
// its default collations would make "Orders" and "orders" one scope.
func (d Dialect) createTable(table string) string {
	switch d {
	case Postgres:
		return "CREATE TABLE IF NOT EXISTS " + table + " (scope varchar(256) PRIMARY KEY, token bigint NOT NULL, seq bigint NOT NULL)"
	case SQLite:
		return "CREATE TABLE IF NOT EXISTS " + table + " (scope TEXT PRIMARY KEY, token INTEGER NOT NULL, seq INTEGER NOT NULL) WITHOUT ROWID"
	default:
		return "CREATE TABLE IF NOT EXISTS " + table + " (scope VARBINARY(256) PRIMARY KEY, token BIGINT NOT NULL, seq BIGINT NOT NULL) ENGINE=InnoDB"
	}
}

// advance is the one statement that checks a write against its scope's
// mark and, unless it is stale, records guard.Next: an upsert whose update
// applies only to a current write. The conflict arbitration of the upsert
// takes the scope row's lock, which the transaction holds until it ends, so
// no other fenced write of the scope runs between this check and the
// commit of the caller's writes.
//
// On PostgreSQL the statement returns a row if and only if it inserted or
// updated, that is, accepted the write. On SQLite it returns none: its
// count of changed rows (sqlite3_changes, RowsAffected) is 1 if it
// inserted or updated and 0 if the WHERE refused the update. The count
// takes only the statement's own row, never a trigger's, and includes an
// accepted update that rewrote the same mark. A result row would cost each
// write database/sql's Rows, and a goroutine watching its context, for
// one bit.
//
// MySQL's upsert returns no rows, and its rows-affected count is 0 both
// for a stale write and for an accepted one that changed nothing (and 1
// for both with clientFoundRows). So the statement reports through
// LAST_INSERT_ID(expr), whose argument the server sends back as the OK
// packet's insert id: 1 when it inserts or accepts, 2 when the write is
// stale; any other value means the report was lost and the write is
// refused.
//
// Non-strict, the same token with the same sequence is accepted; strict,
// the sequence must grow. A sequence of 0 means none: ordered by token
// alone.
func (d Dialect) advance(table string, strict bool) string {
	after := ">="
	if strict {
		after = ">"
	}
	switch d {
	case Postgres, SQLite:
		greatest, p, returning := "GREATEST", "$", "\nRETURNING 1"
		if d == SQLite {
			greatest, p, returning = "max", "?", ""
		}
		return strings.NewReplacer("$", p, "GREATEST", greatest, "AFTER", after, "TABLE", table).Replace(
			`INSERT INTO TABLE AS f (scope, token, seq) VALUES ($1, $2, $3)
ON CONFLICT (scope) DO UPDATE SET token = excluded.token,
	seq = CASE WHEN excluded.token > f.token THEN excluded.seq ELSE GREATEST(f.seq, excluded.seq) END
WHERE excluded.token > f.token OR excluded.token = f.token AND (excluded.seq = 0 OR excluded.seq AFTER f.seq)`) + returning
	default:
		stale := "<"
		if strict {
			stale = "<="
		}
		// MySQL evaluates the assignments left to right, each seeing the
		// ones before it, so seq is decided while token is still the old
		// value. The arguments are those of mysqlArgs.
		return `INSERT INTO ` + table + ` (scope, token, seq) VALUES (?, ?, IF(LAST_INSERT_ID(1), ?, 0))
ON DUPLICATE KEY UPDATE
	seq = IF(LAST_INSERT_ID(IF(? < token OR ? = token AND ? <> 0 AND ? ` + stale + ` seq, 2, 1)) = 2, seq,
		IF(? > token, ?, GREATEST(seq, ?))),
	token = GREATEST(token, ?)`
	}
}

// accepted runs advance's statement for scope, token t and sequence s and
// reports whether it accepted the write.
func (d Dialect) accepted(ctx context.Context, st *sql.Stmt, scope string, t, s int64) (bool, error) {
	switch d {
	case Postgres:
		var one int
		err := st.QueryRowContext(ctx, scope, t, s).Scan(&one)
		if errors.Is(err, sql.ErrNoRows) {
			return false, nil
		}
		return err == nil, err
	case SQLite:
		res, err := st.ExecContext(ctx, scope, t, s)
		if err != nil {
			return false, err
		}
		n, err := res.RowsAffected()
		return err == nil && n == 1, err
	}
	res, err := st.ExecContext(ctx, scope, t, s, t, t, s, s, t, s, s, t)
	if err != nil {
		return false, err
	}
	id, err := res.LastInsertId()
	switch {
	case err != nil:
		return false, err
	case id == 1:
		return true, nil
	case id == 2:
		return false, nil
	}
	return false, fmt.Errorf("the server reported outcome %d of the fenced upsert, want 1 or 2 (does a proxy rewrite insert ids?)", id)
}

// param returns the placeholder of the n-th argument (from 1).
func (d Dialect) param(n int) string {
	switch d {
	case Postgres:
		return "$" + strconv.Itoa(n)
	case SQLite:
		return "?" + strconv.Itoa(n)
	}
	return "?"
}

// forUpdate locks the rows a SELECT reads until the transaction ends.
// SQLite has no row locks: its writer, which a fenced row update already
// is, excludes every other writer of the file.
func (d Dialect) forUpdate() string {
	if d == SQLite {
		return ""
	}
	return " FOR UPDATE"
}
