package sqlguard_test

import (
	"database/sql"
	"strconv"
	"testing"

	"github.com/fence-dev/fence/guard/guardtest"
	"github.com/fence-dev/fence/guard/sqlguard"
)

// BenchmarkUpdate is a fenced write beside the same plain write, on each
// database: a transaction that upserts one value with a prepared
// statement. The fenced one adds the fence statement (one more round trip
// to a server) to the same transaction. Each write stores a new value:
// SQLite and InnoDB skip writing a row that does not change, and a commit
// with nothing to write would hide the cost of a real one.
func BenchmarkUpdate(b *testing.B) {
	for _, d := range dialects {
		b.Run(d.String(), func(b *testing.B) {
			db, name := newDB(b, d, "_value")
			mustExec(b, db, valueTable(name+"_value"))
			s := newStore(b, db, d, sqlguard.WithTable(name))
			upsert, err := db.Prepare(upsertValue(d, name+"_value"))
			if err != nil {
				b.Fatal(err)
			}
			defer upsert.Close()
			n := 0
			put := func(tx *sql.Tx) error {
				n++
				_, err := tx.StmtContext(ctx, upsert).ExecContext(ctx, "bench", 1, strconv.Itoa(n))
				return err
			}
			plain := func() error {
				tx, err := db.BeginTx(ctx, nil)
				if err != nil {
					return err
				}
				defer tx.Rollback()
				if err := put(tx); err != nil {
					return err
				}
				return tx.Commit()
			}
			fenced := func() error { return s.Update(ctx, "bench", wr("bench", 1, 0), put) }
			guardtest.Compare(b, plain, fenced)
		})
	}
}

// BenchmarkUpdateRow is a fenced row update beside the same plain UPDATE,
// each in a transaction: the token check is a condition of the same
// statement, so no round trip is added.
func BenchmarkUpdateRow(b *testing.B) {
	for _, d := range dialects {
		b.Run(d.String(), func(b *testing.B) {
			db, table := newDB(b, d)
			rowTable(b, db, table, 7)
			s := newStore(b, db, d)
			update := "UPDATE " + table + " SET balance = ? WHERE id = ?"
			if d == sqlguard.Postgres {
				update = "UPDATE " + table + " SET balance = $1 WHERE id = $2"
			}
			row := sqlguard.Row{Table: table, Key: "id", ID: 7}
			w := wr("accounts", 1, 0)
			n := 0
			inTx := func(write func(tx *sql.Tx, balance int) error) func() error {
				return func() error {
					n++ // a new value each time, as in BenchmarkUpdate
					tx, err := db.BeginTx(ctx, nil)
					if err != nil {
						return err
					}
					defer tx.Rollback()
					if err := write(tx, n); err != nil {
						return err
					}
					return tx.Commit()
				}
			}
			guardtest.Compare(b,
				inTx(func(tx *sql.Tx, balance int) error {
					_, err := tx.ExecContext(ctx, update, balance, 7)
					return err
				}),
				inTx(func(tx *sql.Tx, balance int) error {
					return s.UpdateRow(ctx, tx, "accounts", w, row, map[string]any{"balance": balance})
				}))
		})
	}
}
