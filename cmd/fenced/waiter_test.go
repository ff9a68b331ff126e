package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	fencev1 "github.com/fence-dev/fence/api/fence/v1"
	"github.com/fence-dev/fence/client"
)

// TestClusterPartitionWaiter cuts off a leader while a client waits in its
// line (issue 33, item 1). The cut-off leader steps down, but never applies
// the next leader's promote, which drops its line; its waiter must still
// be answered, "leader changed", so that the client retries at the new
// leader and is granted the scope there once the holder releases it.
func TestClusterPartitionWaiter(t *testing.T) {
	c := startCluster(t, 3)
	defer dumpLogs(t, c)
	old := c.leader()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	admin := newClient(t, c.addrs(), client.WithRetryTimeout(30*time.Second))
	held, err := admin.Grant(ctx, "w", client.WithTTL(time.Minute), client.WithHolder("holder"))
	if err != nil {
		t.Fatal(err)
	}
	// The waiter's calls go to the leader first, not through a follower,
	// which would cancel a forwarded call when it hears of a new leader.
	addrs := []string{old.api}
	for _, nd := range c.others(old) {
		addrs = append(addrs, nd.api)
	}
	waiter := newClient(t, strings.Join(addrs, ","), client.WithRetryTimeout(30*time.Second))
	wctx, wcancel := context.WithTimeout(ctx, 45*time.Second)
	defer wcancel()
	type answer struct {
		token uint64
		err   error
	}
	done := make(chan answer, 1)
	go func() {
		l, err := waiter.Grant(wctx, "w", client.WithWait(), client.WithTTL(time.Minute), client.WithHolder("waiter"))
		done <- answer{l.Token, err}
	}()
	for end := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		r, err := direct(old).Get(ctx, connect.NewRequest(&fencev1.GetRequest{Scope: "w"}))
		if err == nil && r.Msg.Waiters == 1 {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("the waiter is not in the leader's line after 20s: %v", err)
		}
	}

	isolate(t, old.ip, true)
	rest := c.others(old)
	nl := c.leader(rest...)
	t.Logf("cut off the leader %s with a waiter in its line; %s leads the others", old.id, nl.id)
	var restAddrs []string
	for _, nd := range rest {
		restAddrs = append(restAddrs, nd.api)
	}
	majority := newClient(t, strings.Join(restAddrs, ","), client.WithRetryTimeout(30*time.Second))
	if _, err := majority.Release(ctx, "w", held.ID); err != nil {
		t.Fatal(err)
	}
	a := <-done // bounded by wctx
	if a.err != nil {
		t.Fatalf("the waiter of the cut-off leader, with the scope released at the new leader: %v; want granted there", a.err)
	}
	st, err := majority.Get(ctx, "w")
	if err != nil || st.Lease == nil || st.Lease.Token != a.token || st.Lease.Holder != "waiter" {
		t.Fatalf("scope w at the new leader: %+v, %v; want held by the waiter with token %d", st, err, a.token)
	}
	isolate(t, old.ip, false)
}
