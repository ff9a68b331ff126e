package pgxguard_test

import (
	"context"
	"errors"
	"log"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/guard"
	"github.com/fence-dev/fence/guard/pgxguard"
)

// A service that holds the lease on "orders" writes with its token; a
// write made after another holder wrote with a newer token is refused,
// and nothing of it lands. Send takes writes that need no answer in
// between; Update, a transaction. (Not run: it needs a PostgreSQL
// server.)
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://fence:fence@127.0.0.1:54329/fence")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	s, err := pgxguard.New(pool, "")
	if err != nil {
		log.Fatal(err)
	}
	if err := s.CreateTable(ctx); err != nil {
		log.Fatal(err)
	}

	token := fence.Token{Scope: "orders", Value: 42} // from the lease: lease.Token()
	b := &pgx.Batch{}
	b.Queue("UPDATE orders SET total = $1 WHERE shard = $2", 1250, 7)
	err = s.Send(ctx, "orders", guard.Write{Token: token}, b)
	if errors.Is(err, fence.ErrStale) {
		// The lease is lost: stop, and do not retry with this token.
		log.Print(err)
		return
	}
	if err != nil {
		log.Fatal(err)
	}

	// A write that reads first runs in a transaction of its own; the
	// BEGIN and the fence statement share a round trip.
	err = s.Update(ctx, "orders", guard.Write{Token: token}, func(tx pgx.Tx) error {
		var total int
		if err := tx.QueryRow(ctx, "SELECT total FROM orders WHERE shard = $1", 7).Scan(&total); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "UPDATE orders SET total = $1 WHERE shard = $2", total+100, 7)
		return err
	})
	if err != nil {
		log.Fatal(err)
	}
}
