// Package pgxguard fences writes to PostgreSQL through pgx, without the
// round trip that database/sql spends on the fence statement. It keeps
// the marks in the fence table of sqlguard's Postgres dialect, with the
// same rule, so a pgxguard.Store and a sqlguard.Store on one table fence
// the same scopes, and a restart of either forgets nothing. So do writers
// in other languages that call the fence_advance function sqlguard.Install
// puts in the database (see sqlguard's "Writers in other languages").
//
// # Usage
//
//	pool, err := pgxpool.New(ctx, dsn)
//	s, err := pgxguard.New(pool, "") // the table sqlguard.DefaultTable
//	err = s.CreateTable(ctx)         // idempotent
//
// Update begins a transaction and checks and advances the mark in one
// round trip, then runs the caller's function in the transaction and
// commits:
//
//	err = s.Update(ctx, "orders", guard.Write{Token: lease.Token()}, func(tx pgx.Tx) error {
//		_, err := tx.Exec(ctx, "UPDATE orders SET total = $1 WHERE shard = $2", total, 7)
//		return err
//	})
//
// Send takes writes that need no answer before the next one as a
// pgx.Batch, and sends the fence statement and the batch in one round
// trip, one implicit transaction:
//
//	b := &pgx.Batch{}
//	b.Queue("UPDATE orders SET total = $1 WHERE shard = $2", total, 7)
//	err = s.Send(ctx, "orders", guard.Write{Token: lease.Token()}, b)
//
// Either way a stale write returns a *guard.StaleError (errors.Is
// fence.ErrStale) with the scope and the presented and highest tokens,
// and nothing of the caller's is written.
//
// # Why the check and the write are atomic
//
// The fence statement is sqlguard's upsert of the scope's row (see its
// package documentation for the locking argument, which is the same), with
// one change: instead of skipping the update of a stale write, it sets the
// token to NULL, which the column's NOT NULL constraint refuses. A stale
// write is thus an error, and PostgreSQL aborts the transaction and skips
// every statement sent after it in the same pipeline. That is what lets
// the caller's statements travel with the fence statement instead of
// waiting for its answer. READ COMMITTED, the default, suffices; under
// REPEATABLE READ or SERIALIZABLE, retry on SQLSTATE 40001 as with
// sqlguard.
//
// The highest token in a StaleError is read after the refusal, outside
// the aborted transaction, so it may be higher than the mark that refused
// the write: marks only grow.
//
// The fence is as durable as PostgreSQL's commit: with fsync or
// synchronous_commit off, a crash can lose an accepted mark together with
// the write it fenced.
package pgxguard
