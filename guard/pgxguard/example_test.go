package pgxguard_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/guard"
	"github.com/fence-dev/fence/guard/pgxguard"
)

// B holds the lease on "orders" with token 42 and writes; A, whose lease
// (token 41) has run out, writes late and is refused, and nothing of its
// write lands. Send takes writes that need no answer in between; Update, a
// transaction. It runs against PostgreSQL (`make services`, or
// FENCE_TEST_POSTGRES).
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, postgresDSN())
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	s, err := pgxguard.New(pool, "pgxguard_example_fence") // "": fence_tokens
	if err != nil {
		log.Fatal(err)
	}
	if err := s.CreateTable(ctx); err != nil {
		log.Fatal(err)
	}
	// The example's own tables, made afresh: it runs again and again.
	for _, q := range []string{
		"DELETE FROM pgxguard_example_fence",
		"CREATE TABLE IF NOT EXISTS pgxguard_example_orders (shard int PRIMARY KEY, total int NOT NULL)",
		"INSERT INTO pgxguard_example_orders VALUES (7, 0) ON CONFLICT (shard) DO UPDATE SET total = 0",
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			log.Fatal(err)
		}
	}

	b42 := fence.Token{Scope: "orders", Value: 42} // from B's lease: lease.Token()
	a41 := fence.Token{Scope: "orders", Value: 41} // A's, from before it lost the lease
	batch := &pgx.Batch{}
	batch.Queue("UPDATE pgxguard_example_orders SET total = $1 WHERE shard = $2", 1250, 7)
	err = s.Send(ctx, "orders", guard.Write{Token: b42}, batch)
	fmt.Println("B sends:", err)

	// A write that reads first runs in a transaction of its own; the
	// BEGIN and the fence statement share a round trip.
	err = s.Update(ctx, "orders", guard.Write{Token: a41}, func(tx pgx.Tx) error {
		var total int
		if err := tx.QueryRow(ctx, "SELECT total FROM pgxguard_example_orders WHERE shard = $1", 7).Scan(&total); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "UPDATE pgxguard_example_orders SET total = $1 WHERE shard = $2", total+100, 7)
		return err
	})
	var stale *guard.StaleError
	if errors.As(err, &stale) {
		// A's lease is lost: stop, and do not retry with this token.
		fmt.Printf("A refused: presented %d, highest %d\n", stale.Presented, stale.Highest)
	}

	var total int
	if err := pool.QueryRow(ctx, "SELECT total FROM pgxguard_example_orders WHERE shard = 7").Scan(&total); err != nil {
		log.Fatal(err)
	}
	fmt.Println("total:", total)
	// Output:
	// B sends: <nil>
	// A refused: presented 41, highest 42
	// total: 1250
}
