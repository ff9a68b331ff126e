package fencetest_test

import (
	"context"
	"fmt"
	"log"

	"github.com/fence-dev/fence/client"
	"github.com/fence-dev/fence/fencetest"
)

func ExampleNewServer() {
	srv := fencetest.NewServer()
	defer srv.Close()
	c := srv.Client(client.WithHolder("test"))
	defer c.Close()
	ctx := context.Background()

	for range 2 {
		lease, err := c.Acquire(ctx, "orders")
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(lease.Token())
		if err := lease.Release(ctx); err != nil {
			log.Fatal(err)
		}
	}
	// Each release closes its token with the next value, granted to
	// nobody, so the second grant is 3.

	// Output:
	// fence:v1:orders:1
	// fence:v1:orders:3
}
