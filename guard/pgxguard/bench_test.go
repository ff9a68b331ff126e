package pgxguard_test

import (
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/fence-dev/fence/guard/guardtest"
)

// BenchmarkSend is one write sent as a batch, alone (one round trip, an
// implicit transaction) and fenced by Send (the fence statement in the
// same round trip). Each write stores a new value, so that every commit
// writes.
func BenchmarkSend(b *testing.B) {
	pool, table := newPool(b, "_value")
	valueTable(b, pool, table)
	s := newStore(b, pool, table, quiet)
	n := 0
	batch := func() *pgx.Batch {
		n++
		bt := &pgx.Batch{}
		bt.Queue(upsert(table), "bench", 1, strconv.Itoa(n))
		return bt
	}
	guardtest.Compare(b,
		func() error { return pool.SendBatch(ctx, batch()).Close() },
		func() error { return s.Send(ctx, "bench", wr("bench", 1, 0), batch()) })
}

// BenchmarkUpdate is a transaction of one write: begun with pool.Begin,
// written and committed (three round trips), beside the same transaction
// under Update, which sends the fence statement with its BEGIN.
func BenchmarkUpdate(b *testing.B) {
	pool, table := newPool(b, "_value")
	valueTable(b, pool, table)
	s := newStore(b, pool, table, quiet)
	n := 0
	put := func(tx pgx.Tx) error {
		n++
		_, err := tx.Exec(ctx, upsert(table), "bench", 1, strconv.Itoa(n))
		return err
	}
	guardtest.Compare(b,
		func() error { return pgx.BeginFunc(ctx, pool, put) },
		func() error { return s.Update(ctx, "bench", wr("bench", 1, 0), put) })
}
