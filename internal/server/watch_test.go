package server_test

import (
	"iter"
	"testing"

	"github.com/fence-dev/fence/client"
)

// TestWatchThroughFollower: a watch sent to a follower is forwarded to the
// leader and streams from there, event by event, as they happen.
func TestWatchThroughFollower(t *testing.T) {
	ctx := testContext(t)
	_, follower := startPair(ctx, t)
	c := newClient(t, follower.Addr(), client.WithHolder("w"))
	if _, err := c.Grant(ctx, "orders/0"); err != nil {
		t.Fatal(err)
	}
	next, stop := iter.Pull2(c.Watch(ctx, "orders/", 0, client.WithHeld()))
	defer stop()
	if e, err, _ := next(); err != nil || e.Kind != client.EventHeld || e.Scope != "orders/0" {
		t.Fatalf("first event = %+v, %v; want orders/0 held", e, err)
	}
	// Each grant is seen before the next is made: the stream is not
	// buffered anywhere on the way.
	for _, scope := range []string{"orders/1", "orders/2", "orders/3"} {
		l, err := c.Grant(ctx, scope)
		if err != nil {
			t.Fatal(err)
		}
		e, err, _ := next()
		if err != nil || e.Kind != client.EventGranted || e.Scope != scope || e.Token != l.Token {
			t.Fatalf("event = %+v, %v; want %s granted with token %d", e, err, scope, l.Token)
		}
	}
}
