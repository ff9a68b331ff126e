package follow_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"time"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/fencetest"
	"github.com/fence-dev/fence/guard"
	"github.com/fence-dev/fence/guard/follow"
)

func Example() {
	srv := fencetest.NewServer()
	defer srv.Close()
	c := srv.Client()
	defer c.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// The store the resource's guard keeps its marks in, followed.
	store := guard.NewMemoryStore()
	f := follow.New(c, store, "orders/")
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	defer func() { cancel(); <-done }()
	// Wait until the service has taken the follower's watch: every event
	// from then on reaches it. (A lease that ended before, it learns of
	// only from a store that lists its scopes, a guard.Lister.)
	for f.Position() == 0 {
		time.Sleep(time.Millisecond)
	}

	g := guard.New(store, guard.WithLogger(slog.New(slog.DiscardHandler)))
	write := func(tok fence.Token) error {
		return g.Fence(ctx, tok.Scope, guard.Write{Token: tok}, func(context.Context) error { return nil })
	}
	lease, err := c.Acquire(ctx, "orders/7")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("the holder writes:", write(lease.Token()))
	if err := lease.Release(ctx); err != nil {
		log.Fatal(err)
	}
	// The release closed token 1 with 2; the follower records it.
	for store.Highest("orders/7").Token < 2 {
		time.Sleep(time.Millisecond)
	}
	// A delayed write of the old holder arrives; nobody else wrote.
	err = write(lease.Token())
	fmt.Println("its late write:", errors.Is(err, fence.ErrStale), err)
	// Output:
	// the holder writes: <nil>
	// its late write: true stale fencing token for "orders/7": token 1 was superseded by token 2
}
