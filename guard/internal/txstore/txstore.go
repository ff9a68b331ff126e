// Package txstore opens, for the adapters' tests, the stores whose fenced
// section is a transaction that a handler writes in: boltguard, and
// sqlguard over SQLite. Each comes with a way to write a row in that
// transaction and to count the rows committed, so a test can tell whether
// a handler's writes landed.
package txstore

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"testing"

	"go.etcd.io/bbolt"
	_ "modernc.org/sqlite" // the pure-Go SQLite driver

	"github.com/fence-dev/fence/guard"
	"github.com/fence-dev/fence/guard/boltguard"
	"github.com/fence-dev/fence/guard/sqlguard"
)

// Store is a guard.Store with the rows a handler writes beside its marks.
type Store struct {
	Name  string
	Store guard.Store
	// Insert writes a row named key in the transaction of the Fence call
	// whose apply received ctx.
	Insert func(ctx context.Context, key string) error
	// Rows counts the committed rows.
	Rows func(t testing.TB) int
	// Highest reads scope's committed mark.
	Highest func(t testing.TB, scope string) guard.Mark
}

var rows = []byte("rows")

// Bolt opens boltguard's Store in a directory of t's own, closed when t
// ends. With batched, the Store is its Batched store.
func Bolt(t testing.TB, batched bool) Store {
	t.Helper()
	s, err := boltguard.Open(filepath.Join(t.TempDir(), "rows.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if err := s.DB().Update(func(tx *bbolt.Tx) error {
		_, err := tx.CreateBucket(rows)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	st := Store{Name: "boltguard", Store: s}
	if batched {
		st.Name, st.Store = "boltguard batched", s.Batched()
	}
	st.Insert = func(ctx context.Context, key string) error {
		tx, ok := boltguard.TxFromContext(ctx)
		if !ok {
			return errors.New("no boltguard transaction in the context")
		}
		return tx.Bucket(rows).Put([]byte(key), []byte("x"))
	}
	st.Rows = func(t testing.TB) int {
		t.Helper()
		var n int
		if err := s.DB().View(func(tx *bbolt.Tx) error {
			n = tx.Bucket(rows).Stats().KeyN
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return n
	}
	st.Highest = func(t testing.TB, scope string) guard.Mark {
		t.Helper()
		m, err := s.Highest(scope)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	return st
}

// SQLite opens sqlguard's Store over a SQLite file in a directory of t's
// own, closed when t ends.
func SQLite(t testing.TB) Store {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "rows.db")+"?_txlock=immediate&_busy_timeout=10000")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if _, err := db.Exec("CREATE TABLE rows (key TEXT)"); err != nil {
		t.Fatal(err)
	}
	s, err := sqlguard.New(db, sqlguard.SQLite)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if err := s.CreateTable(t.Context()); err != nil {
		t.Fatal(err)
	}
	return Store{
		Name:  "sqlguard SQLite",
		Store: s,
		Insert: func(ctx context.Context, key string) error {
			tx, ok := sqlguard.TxFromContext(ctx)
			if !ok {
				return errors.New("no sqlguard transaction in the context")
			}
			_, err := tx.ExecContext(ctx, "INSERT INTO rows VALUES (?)", key)
			return err
		},
		Rows: func(t testing.TB) int {
			t.Helper()
			var n int
			if err := db.QueryRow("SELECT count(*) FROM rows").Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n
		},
		Highest: func(t testing.TB, scope string) guard.Mark {
			t.Helper()
			m, err := s.Highest(context.Background(), scope)
			if err != nil {
				t.Fatal(err)
			}
			return m
		},
	}
}
