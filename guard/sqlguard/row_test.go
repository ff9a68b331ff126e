package sqlguard_test

import (
	"database/sql"
	"errors"
	"strconv"
	"testing"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/guard"
	"github.com/fence-dev/fence/guard/sqlguard"
)

// rowTable creates a table of accounts whose rows carry their own token.
func rowTable(t testing.TB, db *sql.DB, name string, ids ...int) {
	t.Helper()
	mustExec(t, db, "CREATE TABLE "+name+" (id BIGINT PRIMARY KEY, balance BIGINT NOT NULL DEFAULT 0, note VARCHAR(64) NOT NULL DEFAULT '', fence_token BIGINT NOT NULL DEFAULT 0)")
	for _, id := range ids {
		mustExec(t, db, "INSERT INTO "+name+" (id) VALUES ("+strconv.Itoa(id)+")")
	}
}

// updateRow runs UpdateRow in a transaction of its own, committed when it
// succeeds.
func updateRow(s *sqlguard.Store, scope string, w guard.Write, row sqlguard.Row, set map[string]any) error {
	tx, err := s.DB().BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if err := s.UpdateRow(ctx, tx, scope, w, row, set); err != nil {
		return err
	}
	return tx.Commit()
}

// TestUpdateRow tells the three outcomes apart: accepted, stale (with the
// row's token as Highest) and no such row; and refuses what is not a
// plain name, another scope's token and a sequence.
func TestUpdateRow(t *testing.T) {
	eachDialect(t, func(t *testing.T, d sqlguard.Dialect) {
		db, table := newDB(t, d)
		rowTable(t, db, table, 7)
		s := newStore(t, db, d, quiet)
		row := sqlguard.Row{Table: table, Key: "id", ID: 7}
		acct := func(v uint64) guard.Write { return wr("accounts", v, 0) }
		read := func() (balance int64, note string, token uint64) {
			t.Helper()
			if err := db.QueryRow("SELECT balance, note, fence_token FROM "+table+" WHERE id = 7").Scan(&balance, &note, &token); err != nil {
				t.Fatal(err)
			}
			return
		}

		if err := updateRow(s, "accounts", acct(5), row, map[string]any{"balance": 100, "note": "five"}); err != nil {
			t.Fatalf("token 5 on a new row: %v", err)
		}
		if b, n, tok := read(); b != 100 || n != "five" || tok != 5 {
			t.Fatalf("row %d %q %d, want 100 five 5", b, n, tok)
		}
		// The same token with the same values changes nothing, which MySQL
		// reports as no row affected: still accepted.
		if err := updateRow(s, "accounts", acct(5), row, map[string]any{"balance": 100, "note": "five"}); err != nil {
			t.Fatalf("token 5 again, unchanged: %v", err)
		}
		if err := updateRow(s, "accounts", acct(6), row, nil); err != nil {
			t.Fatalf("token 6 setting no column: %v", err)
		}

		err := updateRow(s, "accounts", acct(4), row, map[string]any{"balance": -1, "note": "stale"})
		var stale *guard.StaleError
		if !errors.As(err, &stale) || !errors.Is(err, fence.ErrStale) || errors.Is(err, sqlguard.ErrNoRow) {
			t.Fatalf("token 4 after 6 = %v, want a StaleError", err)
		}
		if *stale != (guard.StaleError{Scope: "accounts", Presented: 4, Highest: 6}) {
			t.Fatalf("StaleError %+v, want presented 4, highest 6", *stale)
		}
		if b, n, tok := read(); b != 100 || n != "five" || tok != 6 {
			t.Fatalf("after a stale write: row %d %q %d, want 100 five 6", b, n, tok)
		}

		missing := sqlguard.Row{Table: table, Key: "id", ID: 99}
		if err := updateRow(s, "accounts", acct(50), missing, map[string]any{"balance": 1}); !errors.Is(err, sqlguard.ErrNoRow) || errors.Is(err, fence.ErrStale) {
			t.Fatalf("no row 99 = %v, want ErrNoRow", err)
		}

		// Values are bound, never pasted into the statement.
		evil := "'); DROP TABLE " + table + "; --"
		if err := updateRow(s, "accounts", acct(7), row, map[string]any{"note": evil}); err != nil {
			t.Fatal(err)
		}
		if _, n, _ := read(); n != evil {
			t.Fatalf("note %q, want it stored verbatim", n)
		}

		for name, tc := range map[string]struct {
			scope string
			w     guard.Write
			row   sqlguard.Row
			set   map[string]any
			want  error
		}{
			"another scope":     {"accounts", wr("orders", 9, 0), row, nil, guard.ErrWrongScope},
			"a sequence":        {"accounts", wr("accounts", 9, 1), row, nil, fence.ErrInvalid},
			"token 0":           {"accounts", acct(0), row, nil, fence.ErrInvalid},
			"table with SQL":    {"accounts", acct(9), sqlguard.Row{Table: table + "; DROP TABLE x", Key: "id", ID: 7}, nil, fence.ErrInvalid},
			"key with SQL":      {"accounts", acct(9), sqlguard.Row{Table: table, Key: "id = 7 OR 1", ID: 7}, nil, fence.ErrInvalid},
			"column with SQL":   {"accounts", acct(9), row, map[string]any{"balance = 0, note": "x"}, fence.ErrInvalid},
			"the token column":  {"accounts", acct(9), row, map[string]any{"FENCE_TOKEN": 1}, fence.ErrInvalid},
			"a quoted column":   {"accounts", acct(9), row, map[string]any{`"note"`: "x"}, fence.ErrInvalid},
			"an empty key name": {"accounts", acct(9), sqlguard.Row{Table: table, ID: 7}, nil, fence.ErrInvalid},
		} {
			if err := updateRow(s, tc.scope, tc.w, tc.row, tc.set); !errors.Is(err, tc.want) {
				t.Errorf("%s: %v, want %v", name, err, tc.want)
			}
		}
		if _, _, tok := read(); tok != 7 {
			t.Fatalf("token %d after refused writes, want 7", tok)
		}
	})
}

// TestUpdateRowConcurrent has many goroutines write random older and newer
// tokens to three rows at once, each appending to a log in the same
// transaction. Per row, the log must be non-decreasing and the balance
// must be the highest token presented.
func TestUpdateRowConcurrent(t *testing.T) {
	eachDialect(t, func(t *testing.T, d sqlguard.Dialect) {
		db, table := newDB(t, d, "_log")
		rowTable(t, db, table, 1, 2, 3)
		mustExec(t, db, logTable(d, table+"_log"))
		s := newStore(t, db, d, quiet)
		insert := insertLog(d, table+"_log")
		rows := []string{"1", "2", "3"}
		presented := hammer(t, rows, func(id string, v uint64) error {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				return err
			}
			defer tx.Rollback()
			n, _ := strconv.Atoi(id)
			if err := s.UpdateRow(ctx, tx, "accounts", wr("accounts", v, 0), sqlguard.Row{Table: table, Key: "id", ID: n}, map[string]any{"balance": v}); err != nil {
				return err
			}
			if _, err := tx.ExecContext(ctx, insert, id, v); err != nil {
				return err
			}
			return tx.Commit()
		})
		for _, id := range rows {
			checkLog(t, db, "SELECT token FROM "+table+"_log WHERE scope = '"+id+"' ORDER BY id", "row "+id)
			var balance, tok uint64
			if err := db.QueryRow("SELECT balance, fence_token FROM "+table+" WHERE id = "+id).Scan(&balance, &tok); err != nil {
				t.Fatal(err)
			}
			if balance != presented[id] || tok != presented[id] {
				t.Errorf("row %s: balance %d, token %d; want both %d", id, balance, tok, presented[id])
			}
		}
	})
}
