package sqlguard_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/guard"
	"github.com/fence-dev/fence/guard/sqlguard"
)

// TestHostileTokens presents tokens no service issues, and tokens of
// another scope, to Update and UpdateRow. Each is refused before the
// database is touched: the fence table's mark and the row's token stay
// where they were, and the caller's function does not run.
func TestHostileTokens(t *testing.T) {
	eachDialect(t, func(t *testing.T, d sqlguard.Dialect) {
		db, table := newDB(t, d, "_rows")
		rows := table + "_rows"
		rowTable(t, db, rows, 7)
		s := newStore(t, db, d, sqlguard.WithTable(table), quiet)
		row := sqlguard.Row{Table: rows, Key: "id", ID: 7}
		if err := s.Update(ctx, "orders", wr("orders", 5, 2), func(*sql.Tx) error { return nil }); err != nil {
			t.Fatal(err)
		}
		if err := updateRow(s, "accounts", wr("accounts", 5, 0), row, map[string]any{"balance": 1}); err != nil {
			t.Fatal(err)
		}
		for _, w := range []guard.Write{
			wr("orders", 0, 0),
			wr("orders", fence.MaxToken+1, 0),
			wr("orders", 1<<64-1, 0),
			wr("orders", 5, 1<<63), // a sequence the signed column cannot hold
			wr("orders", 6, 1<<64-1),
			wr("", 6, 0),
			wr(strings.Repeat("o", fence.MaxScopeLen+1), 6, 0),
		} {
			ran := false
			err := s.Update(ctx, "orders", w, func(*sql.Tx) error { ran = true; return nil })
			if ran || !errors.Is(err, fence.ErrInvalid) {
				t.Errorf("Update(token %d seq %d scope %.20q): ran %v, err %v; want ErrInvalid", w.Token.Value, w.Seq, w.Token.Scope, ran, err)
			}
		}
		for _, tc := range []struct {
			scope string
			w     guard.Write
			want  error
		}{
			{"accounts", wr("accounts", fence.MaxToken+1, 0), fence.ErrInvalid},
			{"accounts", wr("accounts", 1<<64-1, 0), fence.ErrInvalid},
			{"accounts", wr("orders", fence.MaxToken, 0), guard.ErrWrongScope},
			{"accounts", wr("", fence.MaxToken, 0), guard.ErrWrongScope},
		} {
			if err := updateRow(s, tc.scope, tc.w, row, map[string]any{"balance": -1}); !errors.Is(err, tc.want) {
				t.Errorf("UpdateRow(%q, token %d of %q): %v, want %v", tc.scope, tc.w.Token.Value, tc.w.Token.Scope, err, tc.want)
			}
		}
		if m, err := s.Highest(ctx, "orders"); err != nil || m != (guard.Mark{Token: 5, Seq: 2}) {
			t.Errorf("the mark of orders is %+v, %v; want token 5 sequence 2", m, err)
		}
		for _, sc := range []string{"", "accounts"} {
			if m, err := s.Highest(ctx, sc); err != nil || m != (guard.Mark{}) {
				t.Errorf("the mark of %q is %+v, %v; want none", sc, m, err)
			}
		}
		var balance, token int64
		if err := db.QueryRow("SELECT balance, fence_token FROM "+rows+" WHERE id = 7").Scan(&balance, &token); err != nil || balance != 1 || token != 5 {
			t.Errorf("row 7: balance %d token %d, %v; want 1 and 5", balance, token, err)
		}
	})
}

// TestUpdateRefusesAnotherScopesToken: Update is told which scope the
// write is for, so a genuine token of another scope cannot pass for it.
func TestUpdateRefusesAnotherScopesToken(t *testing.T) {
	eachDialect(t, func(t *testing.T, d sqlguard.Dialect) {
		db, table := newDB(t, d, "")
		s := newStore(t, db, d, sqlguard.WithTable(table), quiet)
		ran := false
		err := s.Update(context.Background(), "orders", wr("billing", 9, 0), func(*sql.Tx) error { ran = true; return nil })
		if ran || !errors.Is(err, guard.ErrWrongScope) {
			t.Fatalf("a billing token for orders: ran %v, err %v; want ErrWrongScope and nothing run", ran, err)
		}
		for _, scope := range []string{"orders", "billing"} {
			if m, err := s.Highest(context.Background(), scope); err != nil || m != (guard.Mark{}) {
				t.Errorf("Highest(%q) = %+v, %v; want no mark", scope, m, err)
			}
		}
	})
}
