// Command readme is the README's end-to-end example, built by
// TestReadmeExample so that the README's code compiles. It expects fenced
// on 127.0.0.1:7480 and PostgreSQL as `make services` runs it.
package main

import (
	"context"
	"database/sql"
	"errors"
	"log"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" driver

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/client"
	"github.com/fence-dev/fence/guard"
	"github.com/fence-dev/fence/guard/sqlguard"
)

func main() {
	ctx := context.Background()
	c, err := client.New("127.0.0.1:7480")
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	db, err := sql.Open("pgx", "postgres://fence:fence@127.0.0.1:54329/fence")
	if err != nil {
		log.Fatal(err)
	}
	store, err := sqlguard.New(db, sqlguard.Postgres)
	if err != nil {
		log.Fatal(err)
	}
	if err := store.CreateTable(ctx); err != nil {
		log.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, "CREATE TABLE IF NOT EXISTS totals (shard int PRIMARY KEY, total bigint NOT NULL)"); err != nil {
		log.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, "INSERT INTO totals VALUES (7, 0) ON CONFLICT DO NOTHING"); err != nil {
		log.Fatal(err)
	}
	log.Fatal(work(ctx, c, store))
}

// The README's example, from here to the end, as it is there.

// work holds the lease on "orders" and writes under its token until the
// lease is lost.
func work(ctx context.Context, c *client.Client, store *sqlguard.Store) error {
	lease, err := c.Acquire(ctx, "orders", client.WithTTL(10*time.Second))
	if err != nil {
		return err // errors.Is(err, fence.ErrHeld): someone else holds it
	}
	defer lease.Release(context.Background())
	lctx := lease.Context() // cancelled when the lease is lost

	for total := 1; ; total++ {
		// The token check and the write commit in one transaction.
		err := store.Update(lctx, "orders", guard.Write{Token: lease.Token()}, func(tx *sql.Tx) error {
			_, err := tx.ExecContext(lctx, "UPDATE totals SET total = $1 WHERE shard = 7", total)
			return err
		})
		if errors.Is(err, fence.ErrStale) {
			lease.MarkLost(err) // a newer holder wrote: stop, never retry with this token
		} else if err != nil && lctx.Err() == nil {
			return err
		}
		select {
		case <-lease.Done(): // expired, released elsewhere, or refused as stale
			return lease.Err()
		case <-time.After(time.Second):
		}
	}
}
