package main

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/fence-dev/fence/client"
	"github.com/fence-dev/fence/guard"
	"github.com/fence-dev/fence/guard/sqlguard"
)

// pgTable is the table of the PostgreSQL guarded write: one row per
// worker, carrying its own token (sqlguard's row token).
const pgTable = "bench_peers_rows"

// postgresSetup prepares the guarded write on PostgreSQL: each worker
// updates its own row in a transaction of its own (BEGIN, UPDATE, COMMIT).
// pg-plain is the plain UPDATE; fence-pg holds a fence lease per worker and
// updates with sqlguard's Store.UpdateRow, whose token condition rides in
// the same UPDATE statement.
func postgresSetup(ctx context.Context, a clientArgs) ([]op, func(), error) {
	if a.workload != wlGuardedWrite {
		return nil, nil, fmt.Errorf("%s: no workload %q", a.system, a.workload)
	}
	db, err := sql.Open("pgx", a.addr.postgres)
	if err != nil {
		return nil, nil, err
	}
	db.SetMaxOpenConns(a.clients + 4)
	db.SetMaxIdleConns(a.clients + 4)
	var u undo
	u.add(func() { db.Close() })
	for _, q := range []string{
		"DROP TABLE IF EXISTS " + pgTable,
		"CREATE TABLE " + pgTable + " (id BIGINT PRIMARY KEY, balance BIGINT NOT NULL DEFAULT 0, fence_token BIGINT NOT NULL DEFAULT 0)",
		"INSERT INTO " + pgTable + " (id) SELECT generate_series(0, " + strconv.Itoa(a.clients-1) + ")",
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			return u.fail(err)
		}
	}
	inTx := func(ctx context.Context, write func(tx *sql.Tx) error) error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		if err := write(tx); err != nil {
			return err
		}
		return tx.Commit()
	}
	ops := make([]op, a.clients)
	switch a.system {
	case sysPlainPG:
		update := "UPDATE " + pgTable + " SET balance = $1 WHERE id = $2"
		for i := range ops {
			n := 0
			ops[i] = func(ctx context.Context) error {
				n++
				return inTx(ctx, func(tx *sql.Tx) error {
					r, err := tx.ExecContext(ctx, update, n, i)
					if err != nil {
						return err
					}
					if k, _ := r.RowsAffected(); k != 1 {
						return fmt.Errorf("update row %d: %d rows", i, k)
					}
					return nil
				})
			}
		}
	case sysFencePG:
		c, err := client.New(a.addr.fence, client.WithHolder("bench"))
		if err != nil {
			return u.fail(err)
		}
		u.add(func() { c.Close() })
		s, err := sqlguard.New(db, sqlguard.Postgres)
		if err != nil {
			return u.fail(err)
		}
		for i := range ops {
			scope := fmt.Sprintf("pg/%d", i)
			l, err := c.Acquire(ctx, scope, client.WithTTL(time.Minute))
			if err != nil {
				return u.fail(err)
			}
			u.add(func() { _ = l.Release(context.Background()) })
			row := sqlguard.Row{Table: pgTable, Key: "id", ID: i}
			n := 0
			ops[i] = func(ctx context.Context) error {
				n++
				return inTx(ctx, func(tx *sql.Tx) error {
					return s.UpdateRow(ctx, tx, scope, guard.Write{Token: l.Token()}, row, map[string]any{"balance": n})
				})
			}
		}
	}
	return ops, u.run, nil
}
