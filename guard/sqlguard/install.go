package sqlguard

import (
	"context"
	"database/sql"
	"embed"
	"fmt"
	"strings"

	"github.com/fence-dev/fence"
)

// The guards inside the database, one script per dialect that has them.
//
//go:embed sql/postgres.sql sql/mysql.sql
var scripts embed.FS

// InstallSQL returns the script that installs fence's guard inside a
// database of dialect d, for writers in any language: the fence table
// (DefaultTable, as CreateTable makes it, so Go Stores and SQL writers
// share each scope's mark), the function or procedure fence_advance, the
// row-token check fence_row_token and fence_guard_version. The package
// documentation describes them. The PostgreSQL script runs in psql; the
// MySQL one, with its DELIMITER lines, in the mysql client. There is none
// for SQLite, which has no stored functions. InstallSQL is safe for
// concurrent use.
func (d Dialect) InstallSQL() (string, error) {
	if err := d.check(); err != nil {
		return "", err
	}
	if d == SQLite {
		return "", &fence.InvalidError{Field: "dialect", Reason: "SQLite has no stored functions: fence it with a Store"}
	}
	b, err := scripts.ReadFile("sql/" + d.String() + ".sql")
	return string(b), err
}

// Install runs d's InstallSQL on db. Running it again, or from several
// processes at once, is harmless: it replaces the functions and keeps the
// marks.
func Install(ctx context.Context, db *sql.DB, d Dialect) error {
	script, err := d.InstallSQL()
	if err != nil {
		return err
	}
	// One connection: the PostgreSQL script is one transaction, and the
	// MySQL one sets its session's sql_mode.
	conn, err := db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("sqlguard: install the %s guard: %w", d, err)
	}
	defer conn.Close()
	stmts := []string{script} // PostgreSQL takes the script whole
	if d == MySQL {
		stmts = statements(script)
	}
	for _, st := range stmts {
		if _, err := conn.ExecContext(ctx, st); err != nil {
			// Leave neither a failed transaction nor the install lock on
			// a connection going back to the pool.
			if d == Postgres {
				conn.ExecContext(ctx, "ROLLBACK")
			} else {
				conn.ExecContext(ctx, "DO RELEASE_LOCK('fence guard install')")
			}
			return fmt.Errorf("sqlguard: install the %s guard: %w", d, err)
		}
	}
	return nil
}

// statements splits a script for the mysql client into its statements:
// each ends with the delimiter (";" until a DELIMITER line changes it) at
// the end of a line. Comment lines between statements are dropped.
func statements(script string) []string {
	delim := ";"
	var out []string
	var cur strings.Builder
	for line := range strings.Lines(script) {
		t := strings.TrimSpace(line)
		if d, ok := strings.CutPrefix(t, "DELIMITER "); ok {
			delim = strings.TrimSpace(d)
			continue
		}
		if cur.Len() == 0 && (t == "" || strings.HasPrefix(t, "--")) {
			continue
		}
		if st, ok := strings.CutSuffix(t, delim); ok {
			out = append(out, cur.String()+st)
			cur.Reset()
			continue
		}
		cur.WriteString(line)
	}
	if strings.TrimSpace(cur.String()) != "" {
		out = append(out, cur.String()) // unterminated: the server says what is wrong
	}
	return out
}
