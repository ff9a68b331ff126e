package guardreport_test

import (
	"context"
	"errors"
	"iter"
	"log/slog"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/client"
	"github.com/fence-dev/fence/fencetest"
	"github.com/fence-dev/fence/guard"
	"github.com/fence-dev/fence/guard/guardreport"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type counter struct{ accepted, rejected int }

func (c *counter) Accepted(string)            { c.accepted++ }
func (c *counter) Rejected(*guard.StaleError) { c.rejected++ }

// TestReport: a stale write refused by a guard reaches fenced, which tells
// its watchers with the scope, both tokens, the stale token's holder and
// the guard's name.
func TestReport(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srv := fencetest.NewServer()
	defer srv.Close()
	c := srv.Client()
	defer c.Close()
	old, err := c.Grant(ctx, "orders", client.WithHolder("old"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Release(ctx, "orders", old.ID); err != nil {
		t.Fatal(err)
	}
	cur, err := c.Grant(ctx, "orders", client.WithHolder("new"))
	if err != nil {
		t.Fatal(err)
	}
	next, stop := iter.Pull2(c.Watch(ctx, "orders", 0, client.WithHeld()))
	defer stop()
	if e, err, _ := next(); err != nil || e.Kind != client.EventHeld {
		t.Fatalf("first event = %+v, %v", e, err)
	}

	var seen counter
	rep := guardreport.New(c, "orders-db", guardreport.WithInterval(time.Hour), guardreport.WithBuffer(1), guardreport.WithObserver(&seen))
	g := guard.New(guard.NewMemoryStore(), guard.WithObserver(rep), guard.WithLogger(slog.New(slog.DiscardHandler)))
	write := func(l fence.Lease) error {
		return g.Fence(ctx, "orders", guard.Write{Token: l.FencingToken()}, func(context.Context) error { return nil })
	}
	if err := write(cur); err != nil {
		t.Fatal(err)
	}
	for range 2 { // the second does not fit the buffer of one: dropped
		if err := write(old); !errors.Is(err, fence.ErrStale) {
			t.Fatalf("old holder's write = %v, want stale", err)
		}
	}
	if seen.accepted != 1 || seen.rejected != 2 {
		t.Errorf("passed on %+v, want 1 accepted and 2 rejected", seen)
	}
	if err := rep.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	e, err, _ := next()
	if err != nil || e.Kind != client.EventRejected || e.Scope != "orders" || e.Token != old.Token || e.Current != cur.Token || e.Holder != "old" || e.Guard != "orders-db" {
		t.Fatalf("event = %+v, %v; want orders' token %d rejected by orders-db, highest %d, held by old", e, err, old.Token, cur.Token)
	}
	if err := rep.Close(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestReportFailsSoftly: while fenced cannot be reached, Rejected keeps
// returning at once and Flush keeps what fits for later.
func TestReportFailsSoftly(t *testing.T) {
	srv := fencetest.NewServer()
	c := srv.Client(client.WithRetryTimeout(0))
	defer c.Close()
	srv.Close() // nobody answers from now on
	rep := guardreport.New(c, "db", guardreport.WithInterval(time.Hour), guardreport.WithLogger(slog.New(slog.DiscardHandler)))
	for range 3 {
		rep.Rejected(&guard.StaleError{Scope: "a", Presented: 1, Highest: 2})
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := rep.Flush(ctx); !errors.Is(err, fence.ErrUnavailable) {
		t.Fatalf("Flush to a stopped server = %v, want unavailable", err)
	}
	if err := rep.Close(ctx); !errors.Is(err, fence.ErrUnavailable) {
		t.Fatalf("Close's last Flush = %v, want unavailable: the rejections were kept", err)
	}
}
