package guard_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/guard"
)

// A write whose apply fails leaves the mark where it was; Advance then
// records its token all the same, so the older lease's late write is
// refused, while the failed write's retry is accepted.
func ExampleGuard_Advance() {
	ctx := context.Background()
	store := guard.NewMemoryStore()
	g := guard.New(store, guard.WithLogger(slog.New(slog.DiscardHandler)))
	newer := guard.Write{Token: fence.Token{Scope: "orders", Value: 8}, Seq: 1}
	older := guard.Write{Token: fence.Token{Scope: "orders", Value: 7}}

	err := g.Fence(ctx, "orders", newer, func(context.Context) error { return errors.New("order refused") })
	fmt.Println(err, store.Highest("orders"))
	if err := g.Advance(ctx, "orders", newer.Token); err != nil {
		panic(err)
	}
	fmt.Println(store.Highest("orders"))

	fmt.Println(g.Fence(ctx, "orders", older, func(context.Context) error { return nil }))
	fmt.Println(g.Fence(ctx, "orders", newer, func(context.Context) error { return nil }), store.Highest("orders"))
	// Output:
	// order refused {0 0}
	// {8 0}
	// stale fencing token for "orders": token 7 was superseded by token 8
	// <nil> {8 1}
}
