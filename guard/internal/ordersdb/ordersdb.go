// Package ordersdb opens, for the adapters' tests, a SQLite database of
// orders and the sqlguard store over it, in which a commit can fail after
// the fenced handler has answered: an order for a customer that does not
// exist breaks a foreign key that SQLite checks only at COMMIT. The one
// customer is "ada".
package ordersdb

import (
	"database/sql"
	"log/slog"
	"path/filepath"
	"testing"

	_ "modernc.org/sqlite" // the pure-Go SQLite driver

	"github.com/fence-dev/fence/guard/sqlguard"
)

// Open creates the database in a directory of t's own, with the tables
// customers (id) and orders (id, customer), and returns it and its store,
// both closed when t ends.
func Open(t testing.TB) (*sql.DB, *sqlguard.Store) {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "orders.db")+"?_txlock=immediate&_busy_timeout=10000&_pragma=foreign_keys(1)")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	for _, q := range []string{
		"CREATE TABLE customers (id TEXT PRIMARY KEY)",
		"CREATE TABLE orders (id TEXT, customer TEXT NOT NULL REFERENCES customers(id) DEFERRABLE INITIALLY DEFERRED)",
		"INSERT INTO customers VALUES ('ada')",
	} {
		if _, err := db.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	store, err := sqlguard.New(db, sqlguard.SQLite, sqlguard.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	if err := store.CreateTable(t.Context()); err != nil {
		t.Fatal(err)
	}
	return db, store
}

// Count returns how many orders the database holds.
func Count(t testing.TB, db *sql.DB) int {
	t.Helper()
	var n int
	if err := db.QueryRow("SELECT count(*) FROM orders").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}
