package client_test

import (
	"context"
	"fmt"
	"log"

	"github.com/fence-dev/fence/client"
	"github.com/fence-dev/fence/fencetest"
)

func ExampleClient_Watch() {
	srv := fencetest.NewServer()
	defer srv.Close()
	c := srv.Client()
	defer c.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	first, err := c.Grant(ctx, "orders/1", client.WithHolder("worker-1"))
	if err != nil {
		log.Fatal(err)
	}
	n := 0
	for e, err := range c.Watch(ctx, "orders/", 0, client.WithHeld()) {
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(e.Kind, e.Scope, e.Token, e.Holder)
		if e.Closing != 0 {
			// The end of a lease closes its token with the next value,
			// granted to nobody: a guard advanced to it refuses the
			// token (guard/follow does so).
			fmt.Println("closed with", e.Closing)
		}
		if e.Kind == client.EventHeld {
			// The watch is live: what happens from here on is seen.
			if _, err := c.Release(ctx, "orders/1", first.ID); err != nil {
				log.Fatal(err)
			}
			if _, err := c.Grant(ctx, "orders/1", client.WithHolder("worker-2")); err != nil {
				log.Fatal(err)
			}
		}
		if n++; n == 3 {
			break
		}
	}
	// Output:
	// held orders/1 1 worker-1
	// released orders/1 1 worker-1
	// closed with 2
	// granted orders/1 3 worker-2
}

func ExampleElection() {
	srv := fencetest.NewServer()
	defer srv.Close()
	c := srv.Client()
	defer c.Close()
	ctx := context.Background()

	e := client.NewElection(c, "reports/leader")
	lease, err := e.Campaign(ctx, "reporter-1") // waits until this process leads
	if err != nil {
		log.Fatal(err)
	}
	// Lead while lease.Context() lasts; send lease.Token() with every
	// write so that the resources refuse a deposed leader's writes.
	fmt.Println("leading with", lease.Token())

	leader, err := e.Leader(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("leader:", leader.Holder, leader.Token)
	if err := e.Resign(ctx); err != nil {
		log.Fatal(err)
	}
	// Output:
	// leading with fence:v1:reports/leader:1
	// leader: reporter-1 1
}
