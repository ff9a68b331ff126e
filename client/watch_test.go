package client_test

import (
	"errors"
	"fmt"
	"io"
	"iter"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/client"
)

// pull returns a function that reads the next event of a watch, failing
// the test if the watch ends instead.
func pull(t *testing.T, seq iter.Seq2[client.Event, error]) func() client.Event {
	t.Helper()
	next, stop := iter.Pull2(seq)
	t.Cleanup(stop)
	return func() client.Event {
		t.Helper()
		e, err, ok := next()
		if !ok || err != nil {
			t.Fatalf("watch ended: %v", err)
		}
		return e
	}
}

// awaitFree polls until scope's lease has expired.
func awaitFree(t *testing.T, c *client.Client, scope string) {
	t.Helper()
	for deadline := time.Now().Add(wait); get(t, c, scope).Lease != nil; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%q did not expire within %v", scope, wait)
		}
	}
}

// TestWatch: a watch shows the leases held when it starts, then each
// event under its prefix in order, and resumes from a position.
func TestWatch(t *testing.T) {
	_, c := start(t)
	ctx := testContext(t)
	a, err := c.Grant(ctx, "orders/a", client.WithHolder("alice"))
	if err != nil {
		t.Fatal(err)
	}
	next := pull(t, c.Watch(ctx, "orders/", 0, client.WithHeld()))
	if e := next(); e.Kind != client.EventHeld || e.Scope != "orders/a" || e.Token != 1 || e.Holder != "alice" || e.Position != 0 {
		t.Fatalf("first event = %+v, want orders/a held by alice with token 1", e)
	}

	if _, err := c.Renew(ctx, "orders/a", a.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Release(ctx, "orders/a", a.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Grant(ctx, "jobs", client.WithHolder("alice")); err != nil { // not under the prefix
		t.Fatal(err)
	}
	b, err := c.Grant(ctx, "orders/b", client.WithHolder("bob"), client.WithTTL(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	awaitFree(t, c, "orders/b")
	want := []struct {
		kind   client.EventKind
		scope  string
		holder string
		id     fence.LeaseID
	}{
		{client.EventRenewed, "orders/a", "alice", a.ID},
		{client.EventReleased, "orders/a", "alice", a.ID},
		{client.EventGranted, "orders/b", "bob", b.ID},
		{client.EventExpired, "orders/b", "bob", b.ID},
		{client.EventLost, "orders/b", "bob", b.ID},
	}
	var last uint64
	for i, w := range want {
		if w.kind == client.EventLost {
			// Renew only once the expiry was seen: the server hands an
			// expiry to watchers just after it applies it, so a renewal
			// sent the moment Get shows the scope free can be answered,
			// and its lost event published, first.
			if _, err := c.Renew(ctx, "orders/b", b.ID); !errors.Is(err, fence.ErrLeaseLost) {
				t.Fatalf("renew after expiry: %v, want lost", err)
			}
		}
		e := next()
		if e.Kind != w.kind || e.Scope != w.scope || e.Token != 1 || e.Holder != w.holder || e.LeaseFingerprint != w.id.Fingerprint() {
			t.Fatalf("event %d = %+v, want %s of %s token 1 by %s, lease %s", i, e, w.kind, w.scope, w.holder, w.id.Fingerprint())
		}
		if e.Position <= last || e.Time.IsZero() {
			t.Fatalf("event %d = %+v: position not after %d, or no time", i, e, last)
		}
		last = e.Position
	}

	// Resuming after the last event read gives what happened since.
	if _, err := c.Grant(ctx, "orders/c", client.WithHolder("carol")); err != nil {
		t.Fatal(err)
	}
	resumed := pull(t, c.Watch(ctx, "orders/", last+1))
	if e := resumed(); e.Kind != client.EventGranted || e.Scope != "orders/c" || e.Position != last+1 {
		t.Fatalf("resumed watch's first event = %+v, want orders/c granted at %d", e, last+1)
	}
}

// TestWatchMissed: resuming from a position the service does not retain
// fails with ErrMissedEvents and says why.
func TestWatchMissed(t *testing.T) {
	_, c := start(t)
	ctx := testContext(t)
	if _, err := c.Grant(ctx, "orders"); err != nil {
		t.Fatal(err)
	}
	for _, err := range c.Watch(ctx, "", 1) { // term 0 never has events
		if !errors.Is(err, fence.ErrMissedEvents) {
			t.Fatalf("watch from position 1 = %v, want ErrMissedEvents", err)
		}
		t.Log(err)
		return
	}
	t.Fatal("watch ended without an error")
}

// TestWatchInvalidPrefix: a bad prefix is refused, not retried.
func TestWatchInvalidPrefix(t *testing.T) {
	_, c := start(t)
	for _, err := range c.Watch(testContext(t), "bad prefix", 0) {
		if !errors.Is(err, fence.ErrInvalid) {
			t.Fatalf("watch = %v, want ErrInvalid", err)
		}
		return
	}
}

// TestElection: candidates lead one at a time, in line; Observe follows
// every change of leader, and the vacancies between.
func TestElection(t *testing.T) {
	_, c := start(t)
	ctx := testContext(t)
	e1 := client.NewElection(c, "leader")
	e2 := client.NewElection(c, "leader")
	observe, stop := iter.Pull2(client.NewElection(c, "leader").Observe(ctx))
	defer stop()
	observed := func(want client.Leader) {
		t.Helper()
		l, err, ok := observe()
		if !ok || err != nil || l != want {
			t.Fatalf("observed %+v, %v, %v; want %+v", l, err, ok, want)
		}
	}

	l1, err := e1.Campaign(ctx, "one")
	if err != nil {
		t.Fatal(err)
	}
	if l1.Token().Value != 1 || l1.Holder() != "one" {
		t.Fatalf("first leader's lease = %v held by %q", l1.Token(), l1.Holder())
	}
	observed(client.Leader{Holder: "one", Token: 1})

	won := make(chan *client.Lease, 1)
	go func() {
		l, err := e2.Campaign(ctx, "two")
		if err != nil {
			t.Error(err)
		}
		won <- l
	}()
	for deadline := time.Now().Add(wait); get(t, c, "leader").Waiters != 1; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the second candidate did not queue within %v", wait)
		}
	}
	if err := e1.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	l2 := <-won
	if l2 == nil || l2.Token().Value != 3 { // 2 closed the first leader's
		t.Fatalf("second leader's lease = %v", l2)
	}
	observed(client.Leader{}) // one resigned …
	observed(client.Leader{Holder: "two", Token: 3})
	if got, err := e1.Leader(ctx); err != nil || got != (client.Leader{Holder: "two", Token: 3}) {
		t.Fatalf("Leader = %+v, %v; want two with token 3", got, err)
	}
	if err := e1.Resign(ctx); err != nil {
		t.Fatalf("resigning again: %v", err)
	}
	if err := e2.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	observed(client.Leader{})
	if got, err := e2.Leader(ctx); err != nil || got != (client.Leader{}) {
		t.Fatalf("Leader after resigning = %+v, %v; want none", got, err)
	}
}

// cutOnce is a transport whose first Watch response body breaks after
// limit bytes, as a connection lost in the middle of a response.
type cutOnce struct {
	next  http.RoundTripper
	limit int64
	done  atomic.Bool
}

func (c *cutOnce) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := c.next.RoundTrip(r)
	if err == nil && strings.HasSuffix(r.URL.Path, "/Watch") && c.done.CompareAndSwap(false, true) {
		resp.Body = &cutBody{ReadCloser: resp.Body, left: c.limit}
	}
	return resp, err
}

type cutBody struct {
	io.ReadCloser
	left int64
}

func (b *cutBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		return 0, io.ErrUnexpectedEOF
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.ReadCloser.Read(p)
	b.left -= int64(n)
	return n, err
}

// TestWatchHeldPagesAcrossReconnect: held leases come a thousand to a
// response; a connection lost among those pages asks for them again, so
// the watcher still sees every held lease.
func TestWatchHeldPagesAcrossReconnect(t *testing.T) {
	srv, c := start(t)
	ctx := testContext(t)
	const n = 2500
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Go(func() {
			for i := w; i < n; i += 16 {
				if _, err := c.Grant(ctx, fmt.Sprintf("p/%04d", i), client.WithTTL(time.Minute)); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.Protocols = new(http.Protocols)
	tr.Protocols.SetUnencryptedHTTP2(true)
	cut := &cutOnce{next: tr, limit: 120_000} // past the first page, within the second
	wc := srv.Client(client.WithHTTPClient(&http.Client{Transport: cut}))
	t.Cleanup(func() { wc.Close() })
	next := pull(t, wc.Watch(ctx, "p/", 0, client.WithHeld()))
	seen := map[string]bool{}
	for len(seen) < n {
		e := next()
		if e.Kind != client.EventHeld {
			t.Fatalf("after %d of %d held leases: %+v", len(seen), n, e)
		}
		seen[e.Scope] = true
	}
	if !cut.done.Load() {
		t.Fatal("the watch's connection was never cut")
	}
	if _, err := c.Grant(ctx, "p/new"); err != nil {
		t.Fatal(err)
	}
	for {
		e := next()
		if e.Kind == client.EventGranted && e.Scope == "p/new" {
			break
		}
		if e.Kind != client.EventHeld {
			t.Fatalf("before p/new's grant: %+v", e)
		}
	}
}

// TestCloseEndsWatches: Close ends a watch under way with fence.ErrClosed,
// and a watch begun after Close fails so at once.
func TestCloseEndsWatches(t *testing.T) {
	srv, _ := start(t)
	c, err := client.New(srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	ctx := testContext(t)
	if _, err := c.Grant(ctx, "orders/a"); err != nil {
		t.Fatal(err)
	}
	ended := make(chan error, 1)
	held := make(chan struct{})
	go func() {
		for e, err := range c.Watch(ctx, "orders/", 0, client.WithHeld()) {
			if err != nil {
				ended <- err
				return
			}
			if e.Kind == client.EventHeld {
				close(held)
			}
		}
		ended <- errors.New("the watch ended without an error")
	}()
	<-held
	c.Close()
	select {
	case err := <-ended:
		if !errors.Is(err, fence.ErrClosed) {
			t.Fatalf("watch ended with %v, want fence.ErrClosed", err)
		}
	case <-ctx.Done():
		t.Fatal("the watch outlived Close")
	}
	var after error
	for _, err := range c.Watch(ctx, "orders/", 0) {
		after = err
		break
	}
	if !errors.Is(after, fence.ErrClosed) {
		t.Fatalf("Watch after Close: %v, want fence.ErrClosed", after)
	}
}

// TestWatchProgress: WithProgress reports the position after each
// response, events or none: at once when the service has taken the
// watch's start, and after the events it yielded, so a later Watch from
// it misses nothing and repeats nothing.
func TestWatchProgress(t *testing.T) {
	_, c := start(t)
	ctx := testContext(t)
	progress := make(chan uint64, 16)
	seq := c.Watch(ctx, "p/", 0, client.WithProgress(func(next uint64) { progress <- next }))
	events := make(chan client.Event, 16)
	go func() {
		for e, err := range seq {
			if err != nil {
				return
			}
			events <- e
		}
	}()
	first := <-progress // no event yet: the start alone
	if first == 0 {
		t.Fatal("progress 0")
	}
	if _, err := c.Grant(ctx, "p/a"); err != nil {
		t.Fatal(err)
	}
	e := <-events
	if next := <-progress; e.Position != first || next != e.Position+1 {
		t.Errorf("event at %d then progress %d, after a start at %d; want the event at the start and progress after it", e.Position, next, first)
	}
}
