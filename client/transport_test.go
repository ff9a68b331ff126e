package client_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/client"
	"github.com/fence-dev/fence/fencetest"
	"github.com/fence-dev/fence/internal/scrape"
)

// silentAddr returns a loopback address that takes connections and never
// answers, as a paused (SIGSTOP) or frozen node does: the kernel accepts
// them, nothing reads them.
func silentAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln.Addr().String()
}

// TestFailoverFromSilentNode: calls to a node that takes connections and
// never answers fail over to the next address, found out by the liveness
// probe, since a call on a connection of its own has no pings: a lone call
// of each kind, each made on a fresh client whose first address is the
// silent one.
func TestFailoverFromSilentNode(t *testing.T) {
	srv := fencetest.NewServer()
	t.Cleanup(srv.Close)
	silent := silentAddr(t)
	admin := newClient(t, srv.Addr)
	g, err := admin.Grant(testContext(t), "kept", client.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	held, err := admin.Grant(testContext(t), "held", client.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	calls := []struct {
		name string
		call func(context.Context, *client.Client) error
	}{
		{"Grant", func(ctx context.Context, c *client.Client) error { _, err := c.Grant(ctx, "granted"); return err }},
		{"Renew", func(ctx context.Context, c *client.Client) error { _, err := c.Renew(ctx, "kept", g.ID); return err }},
		{"Get", func(ctx context.Context, c *client.Client) error { _, err := c.Get(ctx, "kept"); return err }},
		{"List", func(ctx context.Context, c *client.Client) error { _, err := c.List(ctx, ""); return err }},
		{"Acquire with wait", func(ctx context.Context, c *client.Client) error {
			l, err := c.Acquire(ctx, "waited", client.WithWait())
			if err == nil {
				err = l.Release(ctx)
			}
			return err
		}},
		{"Release", func(ctx context.Context, c *client.Client) error {
			_, err := c.Release(ctx, "held", held.ID)
			return err
		}},
	}
	t.Run("each", func(t *testing.T) {
		for _, tc := range calls {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				c := newClient(t, silent+","+srv.Addr, client.WithRetryTimeout(time.Minute))
				if err := tc.call(testContext(t), c); err != nil {
					t.Errorf("%s with the first node silent: %v", tc.name, err)
				}
			})
		}
	})
	if st, err := admin.Get(testContext(t), "held"); err != nil || st.Lease != nil {
		t.Errorf("held after the failed-over release: %+v, %v; want free", st, err)
	}
}

// TestSilentNodeAlone: with the only node silent, a call ends with
// fence.ErrUnavailable naming the liveness probe once the retry budget is
// spent, not when the caller's context ends.
func TestSilentNodeAlone(t *testing.T) {
	c := newClient(t, silentAddr(t), client.WithRetryTimeout(0))
	_, err := c.Get(testContext(t), "s")
	if !errors.Is(err, fence.ErrUnavailable) {
		t.Fatalf("Get from a silent node = %v, want fence.ErrUnavailable", err)
	}
	t.Log(err)
}

// TestLongCallNotCut: a waiting acquire that lasts several probe intervals
// on a live node is probed, not cut off, and gets its grant.
func TestLongCallNotCut(t *testing.T) {
	_, c := start(t)
	ctx := testContext(t)
	holder := acquire(t, c, "orders", client.WithHolder("holder"))
	ch := acquireAsync(t, ctx, c, "orders", "waiter", 1)
	time.Sleep(5 * time.Second) // past two liveness probes of the waiter's node
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	a := receive(t, ch)
	if a.err != nil || a.lease.Token().Value != holder.Token().Value+2 {
		t.Fatalf("waiter after 5s: %v, %v; want the next token after the closing", a.lease, a.err)
	}
}

// TestManyCallsAtOnce: more waiting acquires than the client keeps
// connections of its own for go over the shared connection, and every one
// is granted in turn.
func TestManyCallsAtOnce(t *testing.T) {
	srv, c := start(t)
	ctx := testContext(t)
	const n = 100
	holder := acquire(t, c, "orders", client.WithHolder("holder"))
	got := make(chan acquired, n)
	for i := range n {
		go func() {
			l, err := c.Acquire(ctx, "orders", client.WithWait(), client.WithHolder(fmt.Sprint("w", i)))
			got <- acquired{l, err}
		}()
	}
	eventually(t, fmt.Sprintf("%d waiters queued", n), func() bool { return get(t, c, "orders").Waiters == n })
	// 64 of their own and the shared one, the connection this reads the
	// metric over, and a few that net/http dialled while a connection was
	// on its way back to the pool (it keeps them idle).
	if open := scrape.Value(t, srv.Addr, "fence_connections_open"); open > 64+8 {
		t.Fatalf("%v connections open with %d waiters: the client keeps at most 64 of its own a node", open, n)
	}
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	var tokens []uint64
	for range n {
		a := receive(t, got)
		if a.err != nil {
			t.Fatal(a.err)
		}
		tokens = append(tokens, a.lease.Token().Value)
		if err := a.lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	slices.Sort(tokens)
	for i, tok := range tokens {
		if want := holder.Token().Value + 2*uint64(i) + 2; tok != want { // each end closes a token
			t.Fatalf("grant %d has token %d, want %d: %v", i, tok, want, tokens)
		}
	}
}

// fenced closes a connection beyond --max-conns-per-addr as it accepts it.
// A client with more calls under way than that, here waiting acquires that
// each hold a connection while they wait, must still get every call
// through: over the shared connection.
func TestRefusedConnectionsGoShared(t *testing.T) {
	srv := fencetest.NewServer(fencetest.WithMaxConnsPerAddr(4))
	defer srv.Close()
	c := srv.Client()
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const waiters, rounds = 24, 5
	errs := make(chan error, waiters)
	var wg sync.WaitGroup
	for range waiters {
		wg.Go(func() {
			for range rounds {
				l, err := c.Grant(ctx, "refused/one", client.WithTTL(10*time.Second), client.WithWait())
				if err == nil {
					_, err = c.Release(ctx, "refused/one", l.ID)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	c.Close() // and its idle connections, which count against the limit
	if n := scrape.Value(t, srv.Addr, "fence_connections_refused_total", "limit", "max-conns-per-addr"); n == 0 {
		t.Fatal("the server refused no connection: the test did not reach the limit")
	}
}
