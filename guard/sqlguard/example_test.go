package sqlguard_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	_ "modernc.org/sqlite"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/guard"
	"github.com/fence-dev/fence/guard/sqlguard"
)

// A lease holder writes with its token inside the transaction that
// advances the scope's mark; after a newer holder has written, the old
// one's late write is refused and its transaction rolled back.
func Example() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "sqlguard-example-")
	defer os.RemoveAll(dir)
	// BEGIN IMMEDIATE, and wait up to 5 s for another writer to finish.
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "orders.db")+"?_txlock=immediate&_busy_timeout=5000")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer db.Close()
	if _, err := db.Exec("CREATE TABLE totals (shard TEXT PRIMARY KEY, total INTEGER NOT NULL, holder TEXT NOT NULL)"); err != nil {
		fmt.Println(err)
		return
	}
	s, err := sqlguard.New(db, sqlguard.SQLite, sqlguard.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer s.Close()
	if err := s.CreateTable(ctx); err != nil {
		fmt.Println(err)
		return
	}

	const scope = "orders/shard-7"
	write := func(token uint64, holder string, total int) error {
		w := guard.Write{Token: fence.Token{Scope: scope, Value: token}}
		return s.Update(ctx, w.Token.Scope, w, func(tx *sql.Tx) error {
			_, err := tx.Exec(`INSERT INTO totals VALUES (?, ?, ?)
				ON CONFLICT (shard) DO UPDATE SET total = excluded.total, holder = excluded.holder`, "shard-7", total, holder)
			return err
		})
	}

	fmt.Println("B, token 42:", write(42, "B", 100))
	err = write(41, "A", 90) // A was paused while its lease expired
	var stale *guard.StaleError
	if errors.As(err, &stale) {
		fmt.Printf("A, token 41: refused, highest is %d\n", stale.Highest)
	}
	var total int
	var holder string
	db.QueryRow("SELECT total, holder FROM totals").Scan(&total, &holder)
	fmt.Println("total:", total, "written by", holder)
	// Output:
	// B, token 42: <nil>
	// A, token 41: refused, highest is 42
	// total: 100 written by B
}

// UpdateRow fences one row by the token stored beside it, in the caller's
// transaction: no fence table is involved. A stale token and a missing row
// are different errors.
func ExampleStore_UpdateRow() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "sqlguard-example-")
	defer os.RemoveAll(dir)
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "bank.db")+"?_txlock=immediate&_busy_timeout=5000")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer db.Close()
	_, err = db.Exec(`CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance INTEGER NOT NULL,
		fence_token INTEGER NOT NULL DEFAULT 0);
		INSERT INTO accounts (id, balance) VALUES (7, 0)`)
	if err != nil {
		fmt.Println(err)
		return
	}
	s, err := sqlguard.New(db, sqlguard.SQLite, sqlguard.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer s.Close()

	const scope = "accounts"
	set := func(id int, token uint64, balance int) error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		w := guard.Write{Token: fence.Token{Scope: scope, Value: token}}
		row := sqlguard.Row{Table: "accounts", Key: "id", ID: id}
		if err := s.UpdateRow(ctx, tx, scope, w, row, map[string]any{"balance": balance}); err != nil {
			return err
		}
		return tx.Commit()
	}

	fmt.Println("token 5:", set(7, 5, 100))
	fmt.Println("token 4:", set(7, 4, 90))
	fmt.Println("no row 8:", errors.Is(set(8, 6, 10), sqlguard.ErrNoRow))
	// Output:
	// token 5: <nil>
	// token 4: stale fencing token for "accounts": token 4 was superseded by token 5
	// no row 8: true
}
