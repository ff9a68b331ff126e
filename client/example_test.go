package client_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log"
	"net"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/client"
	"github.com/fence-dev/fence/fencetest"
)

func ExampleNew() {
	srv := fencetest.NewServer()
	defer srv.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	down := ln.Addr().String() // a node that is down: it refuses connections
	ln.Close()

	// Every node of the cluster, in the order to try them. The client
	// moves on from the node that is down and stays with the one that
	// answers.
	c, err := client.New(down + "," + srv.Addr)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()

	lease, err := c.Acquire(ctx, "orders", client.WithHolder("worker-1"))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(lease.Token())
	if err := lease.Release(ctx); err != nil {
		log.Fatal(err)
	}
	// Output:
	// fence:v1:orders:1
}

func ExampleClient_Acquire() {
	srv := fencetest.NewServer()
	defer srv.Close()
	c := srv.Client()
	defer c.Close()
	ctx := context.Background()

	lease, err := c.Acquire(ctx, "orders", client.WithHolder("worker-1"))
	if err != nil {
		log.Fatal(err)
	}
	// Send the token with every write to the protected resource, and do
	// the work under lease.Context(), which ends when authority does.
	fmt.Println(lease.Token())
	if err := lease.Release(ctx); err != nil {
		log.Fatal(err)
	}
	// Output:
	// fence:v1:orders:1
}

func ExampleClient_Acquire_held() {
	srv := fencetest.NewServer()
	defer srv.Close()
	c := srv.Client()
	defer c.Close()
	ctx := context.Background()

	first, err := c.Acquire(ctx, "orders", client.WithHolder("worker-1"))
	if err != nil {
		log.Fatal(err)
	}
	defer first.Release(ctx)

	_, err = c.Acquire(ctx, "orders", client.WithHolder("worker-2"))
	var held *fence.HeldError
	if errors.As(err, &held) {
		fmt.Printf("held by %s with token %d\n", held.Holder, held.Token)
	}
	// Output:
	// held by worker-1 with token 1
}

func ExampleLease_MarkLost() {
	srv := fencetest.NewServer()
	defer srv.Close()
	c := srv.Client()
	defer c.Close()
	ctx := context.Background()

	lease, err := c.Acquire(ctx, "orders", client.WithHolder("worker-1"))
	if err != nil {
		log.Fatal(err)
	}
	// A guard refused a write with this lease's token: a newer holder has
	// written. Stop acting on the lease, and never retry that write with
	// the same token.
	lease.MarkLost(fmt.Errorf("write order 17: %w", fence.ErrStale))

	fmt.Println("lost:", errors.Is(lease.Err(), fence.ErrLeaseLost))
	select {
	case <-lease.Done():
		fmt.Println("done: closed")
	default:
		fmt.Println("done: open")
	}
	// Releasing a lost lease only returns why it was lost.
	fmt.Println("release is lost:", errors.Is(lease.Release(ctx), fence.ErrLeaseLost))
	// Output:
	// lost: true
	// done: closed
	// release is lost: true
}

func ExampleClient_Get() {
	srv := fencetest.NewServer()
	defer srv.Close()
	c := srv.Client()
	defer c.Close()
	ctx := context.Background()

	lease, err := c.Acquire(ctx, "orders/shard-7", client.WithHolder("worker-1"))
	if err != nil {
		log.Fatal(err)
	}
	st, err := c.Get(ctx, "orders/shard-7")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("held by %s, token %d, last token %d\n", st.Lease.Holder, st.Lease.Token, st.LastToken)

	if err := lease.Release(ctx); err != nil {
		log.Fatal(err)
	}
	st, err = c.Get(ctx, "orders/shard-7")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("free: %t, last token %d\n", st.Lease == nil, st.LastToken)
	// Output:
	// held by worker-1, token 1, last token 1
	// free: true, last token 2
}

func ExampleClient_RenewBatch() {
	srv := fencetest.NewServer()
	defer srv.Close()
	c := srv.Client()
	defer c.Close()
	ctx := context.Background()

	// Leases granted to this process, which runs its own renewal timer.
	var batch []client.Renewal
	for _, scope := range []string{"shard/1", "shard/2", "shard/3"} {
		l, err := c.Grant(ctx, scope)
		if err != nil {
			log.Fatal(err)
		}
		batch = append(batch, client.Renewal{Scope: l.Scope, ID: l.ID})
	}
	if _, err := c.Release(ctx, "shard/2", batch[1].ID); err != nil {
		log.Fatal(err)
	}

	results, err := c.RenewBatch(ctx, batch)
	if err != nil {
		log.Fatal(err) // nothing was renewed
	}
	for i, r := range results {
		switch {
		case errors.Is(r.Err, fence.ErrLeaseLost):
			fmt.Println(batch[i].Scope, "lost: stop writing with its token")
		case r.Err != nil:
			log.Fatal(r.Err)
		default:
			fmt.Println(batch[i].Scope, "renewed for", r.ExpiresIn)
		}
	}
	// Output:
	// shard/1 renewed for 10s
	// shard/2 lost: stop writing with its token
	// shard/3 renewed for 10s
}

// Close ends the leases the client keeps alive and releases them: their
// holders learn at once, and the scopes are free for the next holder.
func ExampleClient_Close() {
	srv := fencetest.NewServer()
	defer srv.Close()
	ctx := context.Background()
	c := srv.Client()
	lease, err := c.Acquire(ctx, "orders")
	if err != nil {
		log.Fatal(err)
	}

	if err := c.Close(); err != nil {
		log.Fatal(err)
	}
	<-lease.Done()
	fmt.Println(lease.Err())
	_, err = c.Acquire(ctx, "orders")
	fmt.Println(errors.Is(err, fence.ErrClosed))

	other := srv.Client()
	defer other.Close()
	next, err := other.Acquire(ctx, "orders")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(next.Token())
	if err := next.Release(ctx); err != nil {
		log.Fatal(err)
	}
	// Output:
	// lease on "orders" with token 1 is lost: its client was closed
	// true
	// fence:v1:orders:3
}

func ExampleClient_Backup() {
	srv := fencetest.NewServer()
	defer srv.Close()
	c := srv.Client()
	defer c.Close()
	ctx := context.Background()
	if _, err := c.Acquire(ctx, "orders", client.WithHolder("worker-1")); err != nil {
		log.Fatal(err)
	}

	// In production: a file of its owner's only, for fenced --restore.
	var backup bytes.Buffer
	n, err := c.Backup(ctx, &backup)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(n > 0, int64(backup.Len()) == n)
	// Output: true true
}
