package client_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/client"
	"github.com/fence-dev/fence/fencetest"
)

// TestMain checks that no test leaves a goroutine behind: a Lease's
// keep-alive, a waiter, the client's connections or the server's Raft and
// HTTP goroutines. goleak retries for a while before it reports, which
// covers connections that close just after the server does.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// wait bounds every wait in these tests. It is a limit after which a test
// gives up, never a performance expectation.
const wait = 10 * time.Second

// start runs a fresh server for one test and returns it with a client of
// it; both are closed when the test ends.
func start(t testing.TB, opts ...fencetest.Option) (*fencetest.Server, *client.Client) {
	t.Helper()
	srv := fencetest.NewServer(opts...)
	t.Cleanup(srv.Close)
	c := srv.Client(client.WithHolder("tester"))
	t.Cleanup(func() { c.Close() })
	return srv, c
}

// testContext returns a context that ends when the test does, or after a
// generous limit so a hung call fails the test instead of the run.
func testContext(t testing.TB) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// acquire acquires scope and releases the lease when the test ends, if it
// is still held then, so its keep-alive never outlives the test.
func acquire(t testing.TB, c *client.Client, scope string, opts ...client.AcquireOption) *client.Lease {
	t.Helper()
	l, err := c.Acquire(testContext(t), scope, opts...)
	if err != nil {
		t.Fatalf("Acquire(%q) = %v", scope, err)
	}
	t.Cleanup(func() { stop(l) })
	return l
}

// stop ends a lease's keep-alive without caring how it ended.
func stop(l *client.Lease) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = l.Release(ctx)
}

func get(t testing.TB, c *client.Client, scope string) client.ScopeState {
	t.Helper()
	st, err := c.Get(testContext(t), scope)
	if err != nil {
		t.Fatalf("Get(%q) = %v", scope, err)
	}
	return st
}

// eventually polls cond until it holds, and fails the test if it does not
// within the wait limit.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(wait); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after %v", what, wait)
		}
	}
}

// waitLost waits until the lease reports itself lost and checks that it
// does so through every channel: Done, Err and the context's cause.
func waitLost(t testing.TB, l *client.Lease) {
	t.Helper()
	select {
	case <-l.Done():
	case <-time.After(wait):
		t.Fatalf("lease %v still not lost after %v; Err() = %v", l.Token(), wait, l.Err())
	}
	if err := l.Err(); !errors.Is(err, fence.ErrLeaseLost) {
		t.Errorf("Err() = %v, want an error matching fence.ErrLeaseLost", err)
	}
	if l.Context().Err() == nil {
		t.Error("Done is closed but Context is not cancelled")
	}
	if cause := context.Cause(l.Context()); !errors.Is(cause, fence.ErrLeaseLost) {
		t.Errorf("context.Cause(Context()) = %v, want an error matching fence.ErrLeaseLost", cause)
	}
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// checkHeld checks that Get shows scope held by holder with token.
func checkHeld(t testing.TB, c *client.Client, scope, holder string, token uint64) {
	t.Helper()
	st := get(t, c, scope)
	if st.Lease == nil {
		t.Fatalf("Get(%q): free, want held by %q with token %d", scope, holder, token)
	}
	if st.Lease.Holder != holder || st.Lease.Token != token || st.LastToken != token {
		t.Fatalf("Get(%q): held by %q with token %d (last %d), want %q with token %d",
			scope, st.Lease.Holder, st.Lease.Token, st.LastToken, holder, token)
	}
	if !st.Lease.ID.IsZero() {
		t.Errorf("Get(%q) disclosed the lease ID %v", scope, st.Lease.ID)
	}
}

// checkValidity checks that the lease counts itself valid no longer than
// the service will hold it (docs/design.md, the holder's view): the lease's
// ValidUntil, read first, must not be later than the service's deadline as
// a Get after it reports. Deadlines only move later while a lease is held,
// so a renewal in between cannot make a correct lease fail this check.
func checkValidity(t testing.TB, c *client.Client, l *client.Lease) {
	t.Helper()
	valid := l.ValidUntil()
	st := get(t, c, l.Scope())
	deadline := time.Now()
	if st.Lease != nil && st.Lease.Token == l.Token().Value {
		deadline = deadline.Add(st.Lease.ExpiresIn)
	}
	if valid.After(deadline) {
		t.Errorf("lease %v counts itself valid %v past the service's deadline", l.Token(), valid.Sub(deadline))
	}
}

// TestTokensIncrease: every new grant of a scope takes a greater token,
// after a release and after an expiry, through Acquire and Grant alike
// (invariant 1). Renewals and releases do not move the counter.
func TestTokensIncrease(t *testing.T) {
	_, c := start(t)
	ctx := testContext(t)

	l := acquire(t, c, "orders")
	if got := l.Token(); got != (fence.Token{Scope: "orders", Value: 1}) {
		t.Fatalf("first token = %v, want fence:v1:orders:1", got)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if st := get(t, c, "orders"); st.Lease != nil || st.LastToken != 2 {
		t.Fatalf("after release: Get = %+v, want free with last token 2, the closing of token 1", st)
	}

	l = acquire(t, c, "orders")
	if l.Token().Value != 3 {
		t.Fatalf("token after release = %d, want 3, after the closing", l.Token().Value)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}

	// A grant nobody renews expires; the next grant still goes up.
	g, err := c.Grant(ctx, "orders", client.WithTTL(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if g.Token != 5 {
		t.Fatalf("Grant token = %d, want 5", g.Token)
	}
	eventually(t, "the unrenewed grant expires", func() bool { return get(t, c, "orders").Lease == nil })
	l = acquire(t, c, "orders")
	if l.Token().Value != 7 {
		t.Fatalf("token after expiry = %d, want 7, after the closing 6", l.Token().Value)
	}

	// Another scope has its own counter.
	if other := acquire(t, c, "orders/other"); other.Token().Value != 1 {
		t.Fatalf("first token of another scope = %d, want 1", other.Token().Value)
	}
}

// TestRenewKeepsToken: Client.Renew extends a lease without changing its
// token or ID (invariant 2).
func TestRenewKeepsToken(t *testing.T) {
	_, c := start(t)
	ctx := testContext(t)

	g, err := c.Grant(ctx, "orders", client.WithTTL(5*time.Second), client.WithHolder("a"))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		r, err := c.Renew(ctx, "orders", g.ID)
		if err != nil {
			t.Fatalf("renew %d: %v", i, err)
		}
		if r.Token != g.Token || r.ID != g.ID || r.Scope != g.Scope || r.Holder != "a" {
			t.Fatalf("renew %d = %+v, want the grant %+v", i, r, g)
		}
		if r.TTL != 5*time.Second || r.ExpiresIn <= 0 || r.ExpiresIn > r.TTL {
			t.Fatalf("renew %d: TTL %v, expires in %v; want 5s and (0, 5s]", i, r.TTL, r.ExpiresIn)
		}
	}
	checkHeld(t, c, "orders", "a", g.Token)
}

// TestLeaseStaysAlive: a kept-alive lease outlives its TTL many times over
// with the same token, and the service agrees it is held (invariant 2).
func TestLeaseStaysAlive(t *testing.T) {
	_, c := start(t)
	const ttl = 300 * time.Millisecond
	l := acquire(t, c, "orders", client.WithTTL(ttl), client.WithHolder("a"))
	tok := l.Token()
	if l.TTL() != ttl || l.Scope() != "orders" || l.Holder() != "a" || l.ID().IsZero() {
		t.Fatalf("lease: TTL %v, scope %q, holder %q, ID %v", l.TTL(), l.Scope(), l.Holder(), l.ID())
	}
	for end := time.Now().Add(5 * ttl); time.Now().Before(end); time.Sleep(ttl / 6) {
		if err := l.Err(); err != nil {
			t.Fatalf("lease lost while kept alive: %v", err)
		}
		if l.Token() != tok {
			t.Fatalf("token changed from %v to %v", tok, l.Token())
		}
		checkHeld(t, c, "orders", "a", tok.Value)
		checkValidity(t, c, l)
	}
	if isClosed(l.Done()) {
		t.Fatal("Done closed while the lease is held")
	}
}

// TestWrongLeaseID: renew and release succeed only for the current lease
// ID (invariant 3). An ID the scope never had answers ErrNotHolder; the ID
// of its released lease answers ErrLeaseLost with the current token.
// Neither changes anything.
func TestWrongLeaseID(t *testing.T) {
	_, c := start(t)
	ctx := testContext(t)

	old, err := c.Grant(ctx, "orders", client.WithTTL(time.Minute), client.WithHolder("old"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Release(ctx, "orders", old.ID); err != nil {
		t.Fatal(err)
	}
	cur, err := c.Grant(ctx, "orders", client.WithTTL(time.Minute), client.WithHolder("current"))
	if err != nil {
		t.Fatal(err)
	}
	other, err := c.Grant(ctx, "other", client.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name string
		id   fence.LeaseID
		want error
	}{
		{"random ID", fence.NewLeaseID(), fence.ErrNotHolder},
		{"another scope's ID", other.ID, fence.ErrNotHolder},
		{"released ID", old.ID, fence.ErrLeaseLost},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := c.Renew(ctx, "orders", tc.id)
			if !errors.Is(err, tc.want) {
				t.Errorf("Renew = %v, want %v", err, tc.want)
			}
			checkLostFields(t, err, old.Token, cur.Token)
			_, err = c.Release(ctx, "orders", tc.id)
			if !errors.Is(err, tc.want) {
				t.Errorf("Release = %v, want %v", err, tc.want)
			}
			checkLostFields(t, err, old.Token, cur.Token)
			checkHeld(t, c, "orders", "current", cur.Token)
		})
	}
	// The current lease is untouched and still works.
	if _, err := c.Renew(ctx, "orders", cur.ID); err != nil {
		t.Fatalf("renew of the current lease: %v", err)
	}
}

// checkLostFields checks the structured form of a lost answer, if err is
// one: the lost lease's token and the scope's current one.
func checkLostFields(t testing.TB, err error, lost, current uint64) {
	t.Helper()
	var le *fence.LostError
	if !errors.Is(err, fence.ErrLeaseLost) {
		return
	}
	if !errors.As(err, &le) {
		t.Errorf("%v: not a *fence.LostError", err)
		return
	}
	if le.Scope != "orders" || le.Token != lost || le.Current != current {
		t.Errorf("LostError = %+v, want scope orders, token %d, current %d", *le, lost, current)
	}
}

// TestHeld: acquiring a held scope fails with a *fence.HeldError naming
// the holder, its token and its time left, and changes nothing.
func TestHeld(t *testing.T) {
	_, c := start(t)
	ctx := testContext(t)
	l := acquire(t, c, "orders", client.WithHolder("a"), client.WithTTL(30*time.Second))

	_, err := c.Acquire(ctx, "orders", client.WithHolder("b"))
	checkHeldError(t, err, "a", l.Token().Value)
	_, err = c.Grant(ctx, "orders", client.WithHolder("b"))
	checkHeldError(t, err, "a", l.Token().Value)
	checkHeld(t, c, "orders", "a", l.Token().Value)
}

func checkHeldError(t testing.TB, err error, holder string, token uint64) {
	t.Helper()
	if !errors.Is(err, fence.ErrHeld) {
		t.Fatalf("acquire of a held scope = %v, want fence.ErrHeld", err)
	}
	var held *fence.HeldError
	if !errors.As(err, &held) {
		t.Fatalf("%v: not a *fence.HeldError", err)
	}
	if held.Scope != "orders" || held.Holder != holder || held.Token != token {
		t.Errorf("HeldError = %+v, want scope orders, holder %q, token %d", *held, holder, token)
	}
	if held.ExpiresIn <= 0 || held.ExpiresIn > 30*time.Second {
		t.Errorf("HeldError.ExpiresIn = %v, want in (0, 30s]", held.ExpiresIn)
	}
}

type acquired struct {
	lease *client.Lease
	err   error
}

// acquireAsync starts an acquire that waits in line and waits until the
// service shows it queued as the n-th waiter.
func acquireAsync(t testing.TB, ctx context.Context, c *client.Client, scope, holder string, n int, opts ...client.AcquireOption) <-chan acquired {
	t.Helper()
	ch := make(chan acquired, 1)
	opts = append([]client.AcquireOption{client.WithWait(), client.WithHolder(holder)}, opts...)
	go func() {
		l, err := c.Acquire(ctx, scope, opts...)
		ch <- acquired{l, err}
	}()
	eventually(t, fmt.Sprintf("%s is queued as waiter %d", holder, n), func() bool {
		return get(t, c, scope).Waiters >= n
	})
	return ch
}

func receive(t testing.TB, ch <-chan acquired) acquired {
	t.Helper()
	select {
	case a := <-ch:
		if a.lease != nil {
			t.Cleanup(func() { stop(a.lease) })
		}
		return a
	case <-time.After(wait):
		t.Fatalf("waiting acquire did not return within %v", wait)
		return acquired{}
	}
}

// TestWaitFIFO: acquires that wait in line are granted one by one, in the
// order they queued, each with the next token, as each holder releases.
func TestWaitFIFO(t *testing.T) {
	_, c := start(t)
	ctx := testContext(t)
	holder := acquire(t, c, "orders", client.WithHolder("holder"))

	names := []string{"w1", "w2", "w3", "w4"}
	var queue []<-chan acquired
	for i, name := range names {
		queue = append(queue, acquireAsync(t, ctx, c, "orders", name, i+1))
	}
	if st := get(t, c, "orders"); st.Waiters != len(names) {
		t.Fatalf("Waiters = %d, want %d", st.Waiters, len(names))
	}

	prev := holder
	for i, ch := range queue {
		select {
		case a := <-ch:
			t.Fatalf("%s returned before %s released: %v, %v", names[i], prev.Holder(), a.lease, a.err)
		default:
		}
		if err := prev.Release(ctx); err != nil {
			t.Fatal(err)
		}
		a := receive(t, ch)
		if a.err != nil {
			t.Fatalf("%s: %v", names[i], a.err)
		}
		want := holder.Token().Value + 2*uint64(i) + 2 // each end closes a token
		if a.lease.Token().Value != want || a.lease.Holder() != names[i] {
			t.Fatalf("grant %d went to %s with token %d, want %s with token %d",
				i+1, a.lease.Holder(), a.lease.Token().Value, names[i], want)
		}
		checkHeld(t, c, "orders", names[i], want)
		checkValidity(t, c, a.lease)
		if st := get(t, c, "orders"); st.Waiters != len(names)-i-1 {
			t.Fatalf("Waiters = %d, want %d", st.Waiters, len(names)-i-1)
		}
		prev = a.lease
	}
}

// TestWaitDeadline: a waiter whose context deadline passes gets an error
// matching context.DeadlineExceeded and leaves the queue: it takes no
// token and is not granted the scope when the holder releases.
func TestWaitDeadline(t *testing.T) {
	_, c := start(t)
	holder := acquire(t, c, "orders", client.WithHolder("holder"))

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	ch := acquireAsync(t, ctx, c, "orders", "impatient", 1)
	a := receive(t, ch)
	if !errors.Is(a.err, context.DeadlineExceeded) {
		t.Fatalf("waiter past its deadline: %v, %v; want context.DeadlineExceeded", a.lease, a.err)
	}
	eventually(t, "the waiter leaves the queue", func() bool { return get(t, c, "orders").Waiters == 0 })
	checkHeld(t, c, "orders", "holder", holder.Token().Value)

	if err := holder.Release(testContext(t)); err != nil {
		t.Fatal(err)
	}
	if st := get(t, c, "orders"); st.Lease != nil || st.LastToken != holder.Token().Value+1 {
		t.Fatalf("after release: Get = %+v %+v, want free with last token %d, the closing", st, st.Lease, holder.Token().Value+1)
	}
}

// TestRequestID: an acquire repeated with the same request ID returns the
// same grant; once that grant has ended, it answers lost, never a second
// token.
func TestRequestID(t *testing.T) {
	_, c := start(t)
	ctx := testContext(t)

	first, err := c.Grant(ctx, "orders", client.WithRequestID("req-1"), client.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	again, err := c.Grant(ctx, "orders", client.WithRequestID("req-1"), client.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if again.Token != first.Token || again.ID != first.ID {
		t.Fatalf("repeated grant = token %d ID %v, want token %d ID %v", again.Token, again.ID, first.Token, first.ID)
	}
	// A different request ID is a different acquire.
	if _, err := c.Grant(ctx, "orders", client.WithRequestID("req-2")); !errors.Is(err, fence.ErrHeld) {
		t.Fatalf("grant with another request ID = %v, want fence.ErrHeld", err)
	}
	if st := get(t, c, "orders"); st.LastToken != first.Token {
		t.Fatalf("LastToken = %d after repeated grants, want %d", st.LastToken, first.Token)
	}

	if _, err := c.Release(ctx, "orders", first.ID); err != nil {
		t.Fatal(err)
	}
	for _, acq := range []func() error{
		func() error {
			_, err := c.Grant(ctx, "orders", client.WithRequestID("req-1"), client.WithTTL(time.Minute))
			return err
		},
		func() error {
			l, err := c.Acquire(ctx, "orders", client.WithRequestID("req-1"), client.WithTTL(time.Minute))
			if l != nil {
				stop(l)
			}
			return err
		},
	} {
		err := acq()
		if !errors.Is(err, fence.ErrLeaseLost) {
			t.Fatalf("acquire with the request ID of a released grant = %v, want fence.ErrLeaseLost", err)
		}
		var le *fence.LostError
		if !errors.As(err, &le) || le.Token != first.Token {
			t.Errorf("%v: want a *fence.LostError with token %d", err, first.Token)
		}
	}
	if st := get(t, c, "orders"); st.Lease != nil || st.LastToken != first.Token+1 {
		t.Fatalf("Get = %+v, want free with last token %d, the closing: no second token", st, first.Token+1)
	}
}

// loseFirstAcquire delivers the first Acquire to the service but loses its
// answer, after a delay, as a connection cut at the wrong moment would.
type loseFirstAcquire struct {
	next  http.RoundTripper
	delay time.Duration
	done  atomic.Bool
}

func (rt *loseFirstAcquire) RoundTrip(r *http.Request) (*http.Response, error) {
	if !strings.HasSuffix(r.URL.Path, "/Acquire") || rt.done.Swap(true) {
		return rt.next.RoundTrip(r)
	}
	resp, err := rt.next.RoundTrip(r)
	if err == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	time.Sleep(rt.delay)
	return nil, errors.New("connection reset (simulated after the service answered)")
}

func (rt *loseFirstAcquire) CloseIdleConnections() {
	rt.next.(interface{ CloseIdleConnections() }).CloseIdleConnections()
}

// TestRetriedAcquire: an acquire whose answer is lost is retried with the
// same request ID and gets the grant of its first attempt, not a second
// token. The lease must then not count itself valid from the retry's send
// time: the service's deadline started at the first attempt.
func TestRetriedAcquire(t *testing.T) {
	srv, c := start(t)
	const ttl = time.Second
	rt := &loseFirstAcquire{next: http.DefaultTransport.(*http.Transport).Clone(), delay: ttl / 2}
	flaky := srv.Client(client.WithHTTPClient(&http.Client{Transport: rt}))
	defer flaky.Close()

	l := acquire(t, flaky, "orders", client.WithTTL(ttl), client.WithHolder("a"))
	if !rt.done.Load() {
		t.Fatal("the first acquire did not go through the lossy transport")
	}
	if l.Token().Value != 1 {
		t.Fatalf("token = %d, want 1: the retry took a second token", l.Token().Value)
	}
	checkValidity(t, c, l)
	if st := get(t, c, "orders"); st.LastToken != 1 {
		t.Fatalf("LastToken = %d, want 1", st.LastToken)
	}
}

// TestCallerRetriedAcquire: a caller that retries an acquire itself, with
// the request ID it chose, gets the grant of its first call, whose deadline
// started then: the lease must not count itself valid from the second
// call's send time.
func TestCallerRetriedAcquire(t *testing.T) {
	_, c := start(t)
	const ttl = 2 * time.Second
	ctx := testContext(t)
	// The first call's answer is taken as lost: nothing keeps it alive.
	first, err := c.Grant(ctx, "orders", client.WithTTL(ttl), client.WithRequestID("order-run-7"))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(ttl / 2)
	l := acquire(t, c, "orders", client.WithTTL(ttl), client.WithRequestID("order-run-7"))
	if l.Token().Value != first.Token || l.ID() != first.ID {
		t.Fatalf("the caller's retry got token %d, lease %v; want the first call's grant %d, %v", l.Token().Value, l.ID(), first.Token, first.ID)
	}
	checkValidity(t, c, l)
}

// TestWaitedAcquire: a queued grant comes after the acquire was sent, and
// its deadline starts then, so the lease counts its validity from the send
// time and needs no renewal before Acquire returns. Unless the wait took
// more than a third of the TTL: then one renewal gives it a fresh start.
func TestWaitedAcquire(t *testing.T) {
	srv, c := start(t)
	rc := &renewCounter{next: http.DefaultTransport.(*http.Transport).Clone()}
	waiter := srv.Client(client.WithHTTPClient(&http.Client{Transport: rc}))
	t.Cleanup(func() { waiter.Close() })
	ctx := testContext(t)
	const margin = time.Millisecond

	for _, tc := range []struct {
		name      string
		ttl, hold time.Duration // the waiter's TTL; how long it waits
		renewals  int64         // before Acquire returns
	}{
		{"short wait", time.Minute, 0, 0},
		{"wait past a third of the TTL", 1500 * time.Millisecond, 600 * time.Millisecond, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			holder := acquire(t, c, "orders", client.WithHolder("holder"))
			ch := acquireAsync(t, ctx, waiter, "orders", "waiter", 1, client.WithTTL(tc.ttl), client.WithDriftMargin(margin))
			time.Sleep(tc.hold)
			rc.n.Store(0)
			released := time.Now()
			if err := holder.Release(ctx); err != nil {
				t.Fatal(err)
			}
			a := receive(t, ch)
			if a.err != nil {
				t.Fatal(a.err)
			}
			if n := rc.n.Load(); n != tc.renewals {
				t.Errorf("%d renewals before Acquire returned, want %d", n, tc.renewals)
			}
			checkValidity(t, c, a.lease)
			// Sent before the release, the acquire's validity ends before
			// a full TTL from it; renewed, after.
			if fromSend := !a.lease.ValidUntil().After(released.Add(tc.ttl - margin)); fromSend != (tc.renewals == 0) {
				t.Errorf("validity until %v after the release, TTL %v: counted from the acquire's send time %v, want %v",
					a.lease.ValidUntil().Sub(released), tc.ttl, fromSend, tc.renewals == 0)
			}
			if err := a.lease.Release(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestLeaseLostWhenServiceUnreachable: a lease whose renewals cannot reach
// the service reports itself lost once its local validity runs out.
func TestLeaseLostWhenServiceUnreachable(t *testing.T) {
	srv, _ := start(t)
	c := srv.Client(client.WithRetryTimeout(200 * time.Millisecond))
	t.Cleanup(func() { c.Close() })

	l := acquire(t, c, "orders", client.WithTTL(300*time.Millisecond))
	srv.Close() // Close may be called again by the cleanup
	waitLost(t, l)
	if time.Now().Before(l.ValidUntil()) {
		t.Errorf("lost, but ValidUntil %v is still ahead", time.Until(l.ValidUntil()))
	}
	if _, err := c.Get(testContext(t), "orders"); !errors.Is(err, fence.ErrUnavailable) {
		t.Errorf("Get from a stopped service = %v, want fence.ErrUnavailable", err)
	}
}

// TestLeaseLostWhenServiceSaysSo: a lease released behind its back (here
// by ID, through another client) learns it at its next renewal.
func TestLeaseLostWhenServiceSaysSo(t *testing.T) {
	srv, c := start(t)
	l := acquire(t, c, "orders", client.WithTTL(300*time.Millisecond))

	other := srv.Client()
	defer other.Close()
	if _, err := other.Release(testContext(t), "orders", l.ID()); err != nil {
		t.Fatal(err)
	}
	waitLost(t, l)
	var le *fence.LostError
	if !errors.As(l.Err(), &le) || le.Token != l.Token().Value {
		t.Errorf("Err() = %v, want a *fence.LostError with token %d", l.Err(), l.Token().Value)
	}
}

// TestMarkLost: MarkLost ends the lease locally at once; a later Release
// returns the loss and leaves the scope held at the service until it
// expires, as a newer holder may already own it.
func TestMarkLost(t *testing.T) {
	_, c := start(t)
	const ttl = time.Second
	l := acquire(t, c, "orders", client.WithTTL(ttl), client.WithHolder("a"))

	stale := fmt.Errorf("guard: %w", fence.ErrStale)
	l.MarkLost(stale)
	if !isClosed(l.Done()) {
		t.Fatal("Done is open after MarkLost")
	}
	waitLost(t, l)
	if !strings.Contains(l.Err().Error(), stale.Error()) {
		t.Errorf("Err() = %q, want it to mention the cause %q", l.Err(), stale)
	}
	l.MarkLost(errors.New("second cause")) // no effect: the first reason stays
	if strings.Contains(l.Err().Error(), "second cause") {
		t.Errorf("a second MarkLost replaced the reason: %v", l.Err())
	}

	err := l.Release(testContext(t))
	if !errors.Is(err, fence.ErrLeaseLost) {
		t.Fatalf("Release after MarkLost = %v, want fence.ErrLeaseLost", err)
	}
	checkHeld(t, c, "orders", "a", l.Token().Value)
	// Nothing renews it any more: the service expires it.
	eventually(t, "the marked lease expires at the service", func() bool { return get(t, c, "orders").Lease == nil })
}

// renewCounter counts the renewals a client sends.
type renewCounter struct {
	next http.RoundTripper
	n    atomic.Int64
}

func (rc *renewCounter) RoundTrip(r *http.Request) (*http.Response, error) {
	if strings.HasSuffix(r.URL.Path, "/Renew") || strings.HasSuffix(r.URL.Path, "/RenewBatch") {
		rc.n.Add(1)
	}
	return rc.next.RoundTrip(r)
}

func (rc *renewCounter) CloseIdleConnections() {
	rc.next.(interface{ CloseIdleConnections() }).CloseIdleConnections()
}

// TestLeaseRelease: releasing a lease frees the scope, closes Done and
// stops renewals; releasing again only reports that it ended.
func TestLeaseRelease(t *testing.T) {
	srv, c := start(t)
	rc := &renewCounter{next: http.DefaultTransport.(*http.Transport).Clone()}
	counted := srv.Client(client.WithHTTPClient(&http.Client{Transport: rc}))
	defer counted.Close()
	ctx := testContext(t)

	const ttl = 300 * time.Millisecond
	l := acquire(t, counted, "orders", client.WithTTL(ttl))
	eventually(t, "the lease renews", func() bool { return rc.n.Load() >= 2 })
	if err := l.Release(ctx); err != nil {
		t.Fatalf("Release = %v", err)
	}
	if !isClosed(l.Done()) {
		t.Fatal("Done is open after Release")
	}
	if !errors.Is(l.Err(), fence.ErrLeaseLost) {
		t.Errorf("Err() after Release = %v, want fence.ErrLeaseLost", l.Err())
	}
	if st := get(t, c, "orders"); st.Lease != nil || st.LastToken != l.Token().Value+1 {
		t.Fatalf("after Release: Get = %+v, want free with last token %d, the closing", st, l.Token().Value+1)
	}
	renewals := rc.n.Load()
	time.Sleep(2 * ttl) // several renewal periods
	if n := rc.n.Load(); n != renewals {
		t.Errorf("%d renewals sent after Release returned", n-renewals)
	}
	if err := l.Release(ctx); !errors.Is(err, fence.ErrLeaseLost) {
		t.Errorf("second Release = %v, want fence.ErrLeaseLost", err)
	}
}

// TestInvalidInput: bad input passes through the client, is refused by the
// service with a *fence.InvalidError naming the field, and changes nothing.
func TestInvalidInput(t *testing.T) {
	_, c := start(t, fencetest.WithMaxTTL(time.Minute))
	ctx := testContext(t)

	for _, tc := range []struct {
		name  string
		scope string
		opts  []client.AcquireOption
		field string
	}{
		{"empty scope", "", nil, "scope"},
		{"300-byte scope", strings.Repeat("s", 300), nil, "scope"},
		{"scope with NUL", "a\x00b", nil, "scope"},
		{"dot-dot segment", "../x", nil, "scope"},
		{"leading slash", "/x", nil, "scope"},
		{"negative TTL", "valid", []client.AcquireOption{client.WithTTL(-1)}, "ttl"},
		{"1ns TTL", "valid", []client.AcquireOption{client.WithTTL(time.Nanosecond)}, "ttl"},
		{"TTL below the minimum", "valid", []client.AcquireOption{client.WithTTL(99 * time.Millisecond)}, "ttl"},
		{"TTL above the maximum", "valid", []client.AcquireOption{client.WithTTL(time.Minute + time.Millisecond)}, "ttl"},
		{"200-byte holder", "valid", []client.AcquireOption{client.WithHolder(strings.Repeat("h", 200))}, "holder"},
		{"holder with a control character", "valid", []client.AcquireOption{client.WithHolder("a\nb")}, "holder"},
		{"100-byte request ID", "valid", []client.AcquireOption{client.WithRequestID(strings.Repeat("r", 100))}, "request_id"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := c.Grant(ctx, tc.scope, tc.opts...)
			checkInvalid(t, "Grant", err, tc.field)
			l, err := c.Acquire(ctx, tc.scope, tc.opts...)
			if l != nil {
				stop(l)
			}
			checkInvalid(t, "Acquire", err, tc.field)
			if tc.field == "scope" {
				_, err = c.Renew(ctx, tc.scope, fence.NewLeaseID())
				checkInvalid(t, "Renew", err, "scope")
				_, err = c.Release(ctx, tc.scope, fence.NewLeaseID())
				checkInvalid(t, "Release", err, "scope")
				_, err = c.Get(ctx, tc.scope)
				checkInvalid(t, "Get", err, "scope")
			}
		})
	}
	t.Run("zero lease ID", func(t *testing.T) {
		_, err := c.Renew(ctx, "valid", fence.LeaseID{})
		checkInvalid(t, "Renew", err, "lease_id")
		_, err = c.Release(ctx, "valid", fence.LeaseID{})
		checkInvalid(t, "Release", err, "lease_id")
	})
	t.Run("bad prefix", func(t *testing.T) {
		_, err := c.List(ctx, "a b")
		checkInvalid(t, "List", err, "prefix")
	})

	if st := get(t, c, "valid"); st.Lease != nil || st.LastToken != 0 || st.Waiters != 0 {
		t.Errorf("Get(valid) = %+v, want never granted", st)
	}
	if all, err := c.List(ctx, ""); err != nil || len(all) != 0 {
		t.Errorf("List = %v, %v; want nothing held", all, err)
	}
	// The limits themselves are allowed.
	for _, opts := range [][]client.AcquireOption{
		{client.WithTTL(100 * time.Millisecond)},
		{client.WithTTL(time.Minute)},
		{client.WithHolder(strings.Repeat("h", fence.MaxHolderLen))},
		{client.WithRequestID(strings.Repeat("r", 64))},
	} {
		scope := strings.Repeat("s", fence.MaxScopeLen)
		g, err := c.Grant(ctx, scope, opts...)
		if err != nil {
			t.Fatalf("Grant at the limits: %v", err)
		}
		if _, err := c.Release(ctx, scope, g.ID); err != nil {
			t.Fatal(err)
		}
	}
}

func checkInvalid(t testing.TB, call string, err error, field string) {
	t.Helper()
	if !errors.Is(err, fence.ErrInvalid) {
		t.Errorf("%s = %v, want fence.ErrInvalid", call, err)
		return
	}
	var inv *fence.InvalidError
	if !errors.As(err, &inv) {
		t.Errorf("%s = %v: not a *fence.InvalidError", call, err)
		return
	}
	if inv.Field != field || inv.Reason == "" {
		t.Errorf("%s: InvalidError{Field: %q, Reason: %q}, want field %q and a reason", call, inv.Field, inv.Reason, field)
	}
}

// TestListPages: List returns the held scopes under a prefix in scope
// order, across more than one page of the service's answers (1000), and
// leaves out released ones.
func TestListPages(t *testing.T) {
	_, c := start(t)
	ctx := testContext(t)

	const n = 1100
	var scopes []string
	for i := range n {
		scopes = append(scopes, fmt.Sprintf("list/%04d", i))
	}
	scopes = append(scopes, "lis", "listx", "other/1")
	ids := make([]fence.LeaseID, len(scopes))
	// Grant in parallel: one at a time would spend most of the test on
	// fsync round trips.
	var (
		wg    sync.WaitGroup
		next  atomic.Int64
		errMu sync.Mutex
		first error
	)
	for range 64 {
		wg.Go(func() {
			for i := int(next.Add(1)) - 1; i < len(scopes); i = int(next.Add(1)) - 1 {
				g, err := c.Grant(ctx, scopes[i], client.WithTTL(5*time.Minute), client.WithHolder("lister"))
				if err != nil {
					errMu.Lock()
					first = cmp.Or(first, err)
					errMu.Unlock()
					return
				}
				ids[i] = g.ID
			}
		})
	}
	wg.Wait()
	if first != nil {
		t.Fatal(first)
	}

	check := func(prefix string, want []string) {
		t.Helper()
		got, err := c.List(ctx, prefix)
		if err != nil {
			t.Fatalf("List(%q) = %v", prefix, err)
		}
		names := make([]string, len(got))
		for i, l := range got {
			names[i] = l.Scope
			if l.Token != 1 || l.Holder != "lister" || !l.ID.IsZero() || l.TTL != 5*time.Minute {
				t.Fatalf("List(%q)[%d] = %+v", prefix, i, l)
			}
		}
		if !slices.Equal(names, want) {
			t.Fatalf("List(%q): %d scopes, want %d in order (first difference near %q)", prefix, len(names), len(want), firstDiff(names, want))
		}
	}
	listed := slices.Sorted(slices.Values(scopes[:n]))
	check("list/", listed)
	check("list", append(slices.Clone(listed), "listx"))
	check("list/10", scopes[1000:1100])
	check("nothing", nil)
	check("", slices.Sorted(slices.Values(scopes)))

	// Released scopes drop out of the listing.
	for _, i := range []int{0, 999, 1000, 1099} {
		if _, err := c.Release(ctx, scopes[i], ids[i]); err != nil {
			t.Fatal(err)
		}
	}
	check("list/", slices.DeleteFunc(slices.Clone(listed), func(s string) bool {
		return s == "list/0000" || s == "list/0999" || s == "list/1000" || s == "list/1099"
	}))
}

func firstDiff(a, b []string) string {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return a[i]
		}
	}
	if len(a) > len(b) {
		return a[len(b)]
	}
	if len(b) > len(a) {
		return b[len(a)]
	}
	return ""
}

// TestConcurrentHolders: many goroutines take turns on a few scopes. Per
// scope, every grant has a fresh token greater than the one before, no
// token is skipped, and no two holders ever believe they hold the scope at
// once: each holder marks itself the scope's holder after its grant and
// clears that mark before it releases, so a grant that finds the mark set
// was given while another holder still held the scope.
func TestConcurrentHolders(t *testing.T) {
	srv, _ := start(t)
	ctx := testContext(t)
	const (
		workers = 64
		rounds  = 50
		nScopes = 4
	)
	var clients []*client.Client
	for range 4 {
		c := srv.Client()
		t.Cleanup(func() { c.Close() })
		clients = append(clients, c)
	}
	type scopeState struct {
		mu      sync.Mutex
		holder  int // worker holding it, -1 if none
		last    uint64
		granted int
	}
	states := make([]*scopeState, nScopes)
	for i := range states {
		states[i] = &scopeState{holder: -1}
	}

	var (
		wg       sync.WaitGroup
		failMu   sync.Mutex
		failures []string
	)
	fail := func(format string, args ...any) {
		failMu.Lock()
		defer failMu.Unlock()
		failures = append(failures, fmt.Sprintf(format, args...))
	}
	for w := range workers {
		wg.Go(func() {
			c := clients[w%len(clients)]
			for r := range rounds {
				i := (w + r) % nScopes
				scope := fmt.Sprintf("busy/%d", i)
				st := states[i]
				// The TTL is long enough that no lease expires: every
				// hand-over in this test is a release.
				l, err := c.Acquire(ctx, scope, client.WithWait(), client.WithTTL(time.Minute), client.WithHolder(fmt.Sprint("w", w)))
				if err != nil {
					fail("worker %d round %d: acquire %s: %v", w, r, scope, err)
					return
				}
				tok := l.Token().Value
				st.mu.Lock()
				if st.holder != -1 {
					fail("%s granted to worker %d with token %d while worker %d holds it", scope, w, tok, st.holder)
				}
				if want := st.last + 2; st.last == 0 && tok != 1 || st.last != 0 && tok != want { // each release closes one
					fail("%s: token %d granted after token %d", scope, tok, st.last)
				}
				st.holder, st.last = w, tok
				st.granted++
				st.mu.Unlock()

				// The work under the lease.
				if err := l.Err(); err != nil {
					fail("worker %d: %s token %d lost while held: %v", w, scope, tok, err)
				}
				runtime.Gosched()

				st.mu.Lock()
				if st.holder == w {
					st.holder = -1
				}
				st.mu.Unlock()
				if err := l.Release(ctx); err != nil {
					fail("worker %d: release %s token %d: %v", w, scope, tok, err)
					return
				}
			}
		})
	}
	wg.Wait()
	if len(failures) > 0 {
		t.Fatalf("%d failures, first ones:\n%s", len(failures), strings.Join(failures[:min(len(failures), 10)], "\n"))
	}
	for i, st := range states {
		scope := fmt.Sprintf("busy/%d", i)
		want := workers * rounds / nScopes
		if st.granted != want || st.last != uint64(2*want-1) {
			t.Errorf("%s: %d grants, last token %d; want %d and %d", scope, st.granted, st.last, want, 2*want-1)
		}
		if got := get(t, clients[0], scope); got.Lease != nil || got.LastToken != uint64(2*want) || got.Waiters != 0 {
			t.Errorf("Get(%s) = %+v, want free with last token %d, the last closing", scope, got, 2*want)
		}
	}
}

// TestNewRejectsBadAddresses: New explains what address it wants. A list
// of addresses is trimmed; empty elements and duplicates are refused.
func TestNewRejectsBadAddresses(t *testing.T) {
	for _, tc := range []struct{ addr, want string }{
		{"", "empty address"},
		{"   ", "empty address"},
		{"ftp://x", "unsupported scheme"},
		{"a:1,,b:2", "address 2 of 3 is empty"},
		{"a:1,", "address 2 of 2 is empty"},
		{" , a:1", "address 1 of 2 is empty"},
		{"a:1,b:2,a:1", "a:1 is listed twice"},
		{"a:1, http://a:1/", "http://a:1/ is listed twice"},
		{"a:1,ftp://b", "unsupported scheme"},
	} {
		c, err := client.New(tc.addr)
		if err == nil {
			c.Close()
			t.Errorf("New(%q) succeeded", tc.addr)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "host:port") {
			t.Errorf("New(%q) = %q, want it to say %q and what is expected (host:port)", tc.addr, err, tc.want)
		}
	}
	for _, addr := range []string{"127.0.0.1:7480", "localhost:1", "http://127.0.0.1:7480/", "https://fence.example:443",
		"a:1,b:2", " a:1 , http://b:2/ ,https://c:3", "a:1,a:2,b:1"} {
		c, err := client.New(addr)
		if err != nil {
			t.Errorf("New(%q) = %v", addr, err)
			continue
		}
		c.Close()
	}
}

// TestCloseEndsLeases: Close stops every lease the client keeps alive and
// releases it. Each lease reports itself lost at once, the service shows
// the scopes free with their tokens kept, no renewal goes out after Close,
// and an Acquire after Close fails with fence.ErrClosed. A lease lost
// before Close is left alone.
func TestCloseEndsLeases(t *testing.T) {
	srv, c := start(t)
	rc := &renewCounter{next: http.DefaultTransport.(*http.Transport).Clone()}
	closing := srv.Client(client.WithHTTPClient(&http.Client{Transport: rc}), client.WithHolder("closing"))
	t.Cleanup(func() { closing.Close() })

	const ttl = 300 * time.Millisecond
	var leases []*client.Lease
	for _, scope := range []string{"a", "b", "c"} {
		leases = append(leases, acquire(t, closing, scope, client.WithTTL(ttl)))
	}
	lost := acquire(t, closing, "lost", client.WithTTL(time.Minute))
	lost.MarkLost(errors.New("a guard said so"))
	eventually(t, "the leases renew", func() bool { return rc.n.Load() >= 2 })

	if err := closing.Close(); err != nil {
		t.Fatalf("Close = %v", err)
	}
	renewals := rc.n.Load()
	for _, l := range leases {
		if !isClosed(l.Done()) {
			t.Fatalf("lease %v: Done is open after Close returned", l.Token())
		}
		waitLost(t, l)
		if st := get(t, c, l.Scope()); st.Lease != nil || st.LastToken != l.Token().Value+1 {
			t.Errorf("%q after Close: Get = %+v, want free with last token %d, the closing", l.Scope(), st, l.Token().Value+1)
		}
	}
	checkHeld(t, c, "lost", "closing", lost.Token().Value)
	time.Sleep(2 * ttl) // several renewal periods
	if n := rc.n.Load(); n != renewals {
		t.Errorf("%d renewals sent after Close returned", n-renewals)
	}
	if _, err := closing.Acquire(testContext(t), "d"); !errors.Is(err, fence.ErrClosed) {
		t.Errorf("Acquire after Close = %v, want fence.ErrClosed", err)
	}
	if st := get(t, c, "d"); st.LastToken != 0 {
		t.Errorf("Acquire after Close took token %d", st.LastToken)
	}
	if err := closing.Close(); err != nil {
		t.Errorf("second Close = %v, want nil", err)
	}
}

// TestCloseWithoutService: a Close that cannot reach the service still
// ends its leases at once and returns within its bound, with an error
// naming the leases that were not released.
func TestCloseWithoutService(t *testing.T) {
	srv, _ := start(t)
	// Its calls would retry for an hour: only Close's own bound ends the
	// release. A minute (not a measure of the bound: the test's limit on
	// a hang) tells the two apart on any machine.
	c := srv.Client(client.WithHolder("tester"), client.WithRetryTimeout(time.Hour))
	l := acquire(t, c, "orders", client.WithTTL(time.Minute))
	srv.Close()
	closed := make(chan error, 1)
	go func() { closed <- c.Close() }()
	var err error
	select {
	case err = <-closed:
	case <-testContext(t).Done():
		t.Fatal("Close did not return within a minute with the service gone: its 2s bound did not hold")
	}
	if err == nil || !strings.Contains(err.Error(), `"orders"`) {
		t.Errorf("Close = %v, want an error naming the unreleased scope", err)
	}
	waitLost(t, l)
}

// TestCloseDuringAcquires: Acquires racing with Close either fail with
// fence.ErrClosed or return a lease that Close ends; once all have
// returned, no scope is left held, whichever of them Close overtook.
func TestCloseDuringAcquires(t *testing.T) {
	srv, c := start(t)
	closing := srv.Client(client.WithHolder("closing"))
	t.Cleanup(func() { closing.Close() })
	const n = 40
	leases := make([]*client.Lease, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	var granted atomic.Int64
	for i := range n {
		wg.Go(func() {
			leases[i], errs[i] = closing.Acquire(testContext(t), fmt.Sprintf("s%d", i), client.WithTTL(time.Minute))
			if errs[i] == nil {
				granted.Add(1)
			}
		})
	}
	eventually(t, "a few acquires return", func() bool { return granted.Load() >= 3 })
	if err := closing.Close(); err != nil {
		t.Errorf("Close = %v", err)
	}
	wg.Wait()
	closed := 0
	for i := range n {
		switch {
		case errs[i] != nil && !errors.Is(errs[i], fence.ErrClosed):
			t.Errorf("s%d: Acquire = %v, want a lease or fence.ErrClosed", i, errs[i])
		case errs[i] != nil:
			closed++
		default:
			waitLost(t, leases[i])
		}
		if st := get(t, c, fmt.Sprintf("s%d", i)); st.Lease != nil {
			t.Errorf("s%d is held by %q with token %d after Close", i, st.Lease.Holder, st.Lease.Token)
		}
	}
	t.Logf("%d of %d acquires failed with ErrClosed", closed, n)
}

// gate holds back the answers to Acquire calls until open is closed.
type gate struct {
	next    http.RoundTripper
	waiting chan struct{} // receives once per held answer
	open    chan struct{}
}

func (g *gate) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := g.next.RoundTrip(r)
	if strings.HasSuffix(r.URL.Path, "/Acquire") {
		g.waiting <- struct{}{}
		<-g.open
	}
	return resp, err
}

// TestCloseOvertakesAcquire: an Acquire whose grant arrives after Close
// has run fails with fence.ErrClosed and releases that grant, rather than
// start a keep-alive that nothing would stop.
func TestCloseOvertakesAcquire(t *testing.T) {
	srv, c := start(t)
	g := &gate{next: http.DefaultTransport.(*http.Transport).Clone(), waiting: make(chan struct{}, 1), open: make(chan struct{})}
	closing := srv.Client(client.WithHTTPClient(&http.Client{Transport: g}), client.WithHolder("closing"))
	t.Cleanup(func() { closing.Close() })
	done := make(chan error, 1)
	go func() {
		_, err := closing.Acquire(testContext(t), "late", client.WithTTL(time.Minute))
		done <- err
	}()
	<-g.waiting // granted at the service, the answer held back
	checkHeld(t, c, "late", "closing", 1)
	if err := closing.Close(); err != nil {
		t.Errorf("Close = %v", err)
	}
	close(g.open)
	if err := <-done; !errors.Is(err, fence.ErrClosed) {
		t.Fatalf("Acquire overtaken by Close = %v, want fence.ErrClosed", err)
	}
	if st := get(t, c, "late"); st.Lease != nil || st.LastToken != 2 {
		t.Errorf("after the overtaken Acquire: Get = %+v, want free with last token 2, the closing of 1", st)
	}
}
