package lessor

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/internal/fsm"
)

// TestAbandonedAttemptKeepsItsRetry: a waiting acquire whose caller gives up
// while a retry with the same request ID waits in its place must leave the
// retry's place in line alone; the retry is granted when the scope frees.
func TestAbandonedAttemptKeepsItsRetry(t *testing.T) {
	var queued atomic.Int32
	l, node := startLessorWith(t, Config{Queued: func() func(bool) {
		queued.Add(1)
		return func(bool) {}
	}})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	acquire := func(ctx context.Context, holder, requestID string, wait bool) (fsm.Result, error) {
		return l.Acquire(ctx, fsm.Command{Op: fsm.OpAcquire, Scope: "s", LeaseID: fence.NewLeaseID(), Holder: holder,
			TTL: time.Minute, Wait: wait, RequestID: requestID, At: time.Now().UnixNano()})
	}
	held, err := acquire(ctx, "a", "", false)
	if err != nil || held.Outcome != fsm.Granted {
		t.Fatalf("first acquire: %v, %v", held.Outcome, err)
	}
	type answer struct {
		r   fsm.Result
		err error
	}
	awaitQueued := func(n int32) {
		t.Helper()
		for queued.Load() < n {
			if ctx.Err() != nil {
				t.Fatalf("%d acquires queued, want %d", queued.Load(), n)
			}
			time.Sleep(time.Millisecond)
		}
	}
	first, abandon := context.WithCancel(ctx)
	firstDone := make(chan answer, 1)
	go func() {
		r, err := acquire(first, "b", "req-1", true)
		firstDone <- answer{r, err}
	}()
	awaitQueued(1)
	retryDone := make(chan answer, 1)
	go func() {
		r, err := acquire(ctx, "b", "req-1", true)
		retryDone <- answer{r, err}
	}()
	awaitQueued(2)
	abandon()
	if a := <-firstDone; a.err == nil {
		t.Fatalf("abandoned attempt: %v, want an error", a.r.Outcome)
	}
	if _, err := l.Release(ctx, "s", held.Lease.ID); err != nil {
		t.Fatal(err)
	}
	select {
	case a := <-retryDone:
		if a.err != nil || a.r.Outcome != fsm.Granted || a.r.Lease.Holder != "b" {
			t.Fatalf("retry: %v, %v; want granted to b", a.r.Outcome, a.err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("retry not answered 20s after the scope was released")
	}
	var in fsm.ScopeInfo
	node.Read(func(st *fsm.State) { in = st.Get("s") })
	if in.Lease == nil || in.Lease.Holder != "b" {
		t.Fatalf("scope after the retry's grant: %+v; want held by b", in)
	}
}

// TestAbandonedAttemptKeepsTheGrantOfItsRetry: an attempt whose caller gave
// up after its retry was answered with the grant must not release that
// grant. The first attempt is played by hand so that it gives up exactly
// then, with the grant not yet read from its channel.
func TestAbandonedAttemptKeepsTheGrantOfItsRetry(t *testing.T) {
	l, node := startLessor(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	acquire := func(holder, requestID string, wait bool) fsm.Command {
		return fsm.Command{Op: fsm.OpAcquire, Scope: "s", LeaseID: fence.NewLeaseID(), Holder: holder,
			TTL: time.Minute, Wait: wait, RequestID: requestID, At: time.Now().UnixNano()}
	}
	held, err := l.Acquire(ctx, acquire("a", "", false))
	if err != nil || held.Outcome != fsm.Granted {
		t.Fatalf("first acquire: %v, %v", held.Outcome, err)
	}
	// The first attempt joins the line as Acquire would.
	first := acquire("b", "req-1", true)
	key := waitKey(first.Scope, fsm.Lease{ID: first.LeaseID, RequestID: first.RequestID})
	ch, err := l.waiters.add(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	queued, err := node.Apply(ctx, first)
	if err != nil || queued.Outcome != fsm.Queued {
		t.Fatalf("first attempt: %v, %v; want queued", queued.Outcome, err)
	}
	// Its retry is answered with the grant once the scope is free.
	retried := make(chan fsm.Result, 1)
	go func() {
		r, _ := l.Acquire(ctx, acquire("b", "req-1", true))
		retried <- r
	}()
	if _, err := l.Release(ctx, "s", held.Lease.ID); err != nil {
		t.Fatal(err)
	}
	r := <-retried
	if r.Outcome != fsm.Granted || r.Lease.ID != queued.Lease.ID {
		t.Fatalf("retry: %v; want the grant of the first attempt's place", r.Outcome)
	}
	// Now the first attempt's caller gives up.
	gone, stop := context.WithCancel(ctx)
	stop()
	if _, err := l.inLine(gone, key, queued, make(chan fsm.Event), l.office.Load()); err == nil {
		t.Fatal("abandoned attempt: no error")
	}
	l.waiters.remove(key, ch)
	var in fsm.ScopeInfo
	node.Read(func(st *fsm.State) { in = st.Get("s") })
	if in.Lease == nil || in.Lease.ID != r.Lease.ID {
		t.Fatalf("scope after the first attempt gave up: %+v; want still held by the retry's grant", in)
	}
}
