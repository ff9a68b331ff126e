package client_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/client"
	"github.com/fence-dev/fence/fencetest"
)

// TestKeepAliveFollowsSignature: after a key rotation, the keep-alive's
// renewals bring the token signed with the new key, and Token returns it,
// with the same value (issue 33, item 8): guards stop accepting the old
// key's signature once its grace ends.
func TestKeepAliveFollowsSignature(t *testing.T) {
	_, c := start(t, fencetest.WithSigning(), fencetest.WithKeyPublishDelay(0))
	l := acquire(t, c, "keys/orders", client.WithTTL(300*time.Millisecond))
	first := l.Token()
	if !first.Signed() {
		t.Fatalf("Token() = %v, want a signed token", first)
	}
	rot, err := c.RotateSigningKey(testContext(t))
	if err != nil {
		t.Fatal(err)
	}
	if rot.KeyID == first.KeyID {
		t.Fatalf("the rotation kept key %q", rot.KeyID)
	}
	eventually(t, "the lease's token is signed with the new key", func() bool { return l.Token().KeyID == rot.KeyID })
	if got := l.Token(); got.Value != first.Value || got.Scope != first.Scope || !got.Signed() {
		t.Errorf("Token() after the rotation = %v, want token %d of %q signed", got, first.Value, first.Scope)
	}
	if err := l.Err(); err != nil {
		t.Errorf("Err() = %v", err)
	}
}

// watchFrom starts a watch of the scopes under prefix and returns once it
// is under way: a watch begins with the first event read, and reports the
// events from then on.
func watchFrom(t *testing.T, c *client.Client, prefix string) func() client.Event {
	t.Helper()
	ctx := testContext(t)
	if _, err := c.Grant(ctx, prefix+"start"); err != nil {
		t.Fatal(err)
	}
	next := pull(t, c.Watch(ctx, prefix, 0, client.WithHeld()))
	if e := next(); e.Kind != client.EventHeld || e.Scope != prefix+"start" {
		t.Fatalf("first event = %+v, want %sstart held", e, prefix)
	}
	return next
}

// heldRenewals holds the first renewal call (Renew or RenewBatch) until
// open closes, and counts the renewal calls answered after that.
type heldRenewals struct {
	next      http.RoundTripper
	open      chan struct{}
	began     chan struct{} // closed when the first renewal call arrives
	releasing chan struct{} // closed when the first release call arrives
	once, rel sync.Once
	after     atomic.Int64 // renewal calls answered that arrived after open
}

func newHeldRenewals() *heldRenewals {
	return &heldRenewals{next: http.DefaultTransport.(*http.Transport).Clone(),
		open: make(chan struct{}), began: make(chan struct{}), releasing: make(chan struct{})}
}

func (h *heldRenewals) RoundTrip(r *http.Request) (*http.Response, error) {
	switch {
	case strings.HasSuffix(r.URL.Path, "/Renew"), strings.HasSuffix(r.URL.Path, "/RenewBatch"):
		held := false
		h.once.Do(func() { held = true; close(h.began) })
		if held {
			<-h.open
			return h.next.RoundTrip(r)
		}
		select {
		case <-h.open:
			resp, err := h.next.RoundTrip(r)
			h.after.Add(1)
			return resp, err
		default:
			return h.next.RoundTrip(r)
		}
	case strings.HasSuffix(r.URL.Path, "/Release"), strings.HasSuffix(r.URL.Path, "/ReleaseBatch"):
		h.rel.Do(func() { close(h.releasing) })
	}
	return h.next.RoundTrip(r)
}

func (h *heldRenewals) CloseIdleConnections() {
	h.next.(interface{ CloseIdleConnections() }).CloseIdleConnections()
}

// TestReleaseAfterRenewals: a released lease's renewals do not reach the
// service after its release, whether they were queued behind another
// lease's renewal or already sent, so the leader never publishes a
// renewal of it answered lost (issue 33, item 9). Lease a's renewal is
// held on its way; b's comes due behind it, and b is released then.
func TestReleaseAfterRenewals(t *testing.T) {
	srv, c := start(t)
	ctx := testContext(t)
	next := watchFrom(t, c, "rel/")
	h := newHeldRenewals()
	held := srv.Client(client.WithHTTPClient(&http.Client{Transport: h}), client.WithHolder("held"))
	defer held.Close()
	opened := sync.OnceFunc(func() { close(h.open) })
	defer opened()

	const ttl = 900 * time.Millisecond
	a := acquire(t, held, "rel/a", client.WithTTL(ttl))
	b := acquire(t, held, "rel/b", client.WithTTL(ttl))
	bAcquired := time.Now()
	select {
	case <-h.began:
	case <-time.After(wait):
		t.Fatalf("no renewal within %v", wait)
	}
	// b's renewal is due a third of its TTL after its acquire was sent:
	// let it come due while the first renewal is held.
	time.Sleep(time.Until(bAcquired.Add(ttl / 2)))
	released := make(chan error, 1)
	go func() { released <- b.Release(ctx) }()
	select {
	case <-b.Done():
	case <-time.After(wait):
		t.Fatalf("b not ended within %v of Release", wait)
	}
	// A release that does not wait for b's renewal reaches the transport
	// now; one that does waits for the held renewal, which opening lets
	// through. The outcome is checked at the service, whichever it is.
	select {
	case <-h.releasing:
	case <-time.After(200 * time.Millisecond):
	}
	opened()
	select {
	case err := <-released:
		if err != nil {
			t.Fatalf("Release = %v", err)
		}
	case <-time.After(wait):
		t.Fatalf("Release did not return within %v", wait)
	}
	// Two renewal calls after the held one: a renewal of b queued behind
	// it has gone out by then, and been answered.
	eventually(t, "a renews twice more", func() bool { return h.after.Load() >= 2 })
	if err := a.Err(); err != nil {
		t.Fatalf("a: %v", err)
	}
	if _, err := c.Grant(ctx, "rel/end"); err != nil {
		t.Fatal(err)
	}
	sawRelease := false
	for i := 0; ; i++ {
		if i > 1000 {
			t.Fatal("no grant of rel/end in 1000 events")
		}
		e := next()
		if e.Scope == "rel/end" {
			break
		}
		if e.Scope != "rel/b" {
			continue
		}
		switch e.Kind {
		case client.EventReleased:
			sawRelease = true
		case client.EventLost:
			t.Errorf("a renewal of b answered lost after its release: %+v", e)
		}
	}
	if !sawRelease {
		t.Error("no release of rel/b among the events")
	}
}

// lateRenewals lets the service renew, but holds the first renewal's
// answer until the call gives up, as a slow network would.
type lateRenewals struct {
	next http.RoundTripper
	once sync.Once
	late chan struct{} // closed when the late answer was dropped
}

func (lr *lateRenewals) RoundTrip(r *http.Request) (*http.Response, error) {
	if !strings.HasSuffix(r.URL.Path, "/Renew") && !strings.HasSuffix(r.URL.Path, "/RenewBatch") {
		return lr.next.RoundTrip(r)
	}
	first := false
	lr.once.Do(func() { first = true })
	resp, err := lr.next.RoundTrip(r)
	if !first || err != nil {
		return resp, err
	}
	resp.Body.Close()
	<-r.Context().Done()
	close(lr.late)
	return nil, r.Context().Err()
}

func (lr *lateRenewals) CloseIdleConnections() {
	lr.next.(interface{ CloseIdleConnections() }).CloseIdleConnections()
}

// TestLocallyLostLeaseReleased: a lease whose renewal the service granted
// but whose answer came too late is lost locally; it is then released,
// so its scope is free at once rather than after the TTL the late renewal
// gave it (issue 33, item 11). The release only frees the scope while the
// lease is current, so it can take nothing from a newer holder.
func TestLocallyLostLeaseReleased(t *testing.T) {
	srv, c := start(t)
	ctx := testContext(t)
	next := watchFrom(t, c, "late/")
	lr := &lateRenewals{next: http.DefaultTransport.(*http.Transport).Clone(), late: make(chan struct{})}
	slow := srv.Client(client.WithHTTPClient(&http.Client{Transport: lr}), client.WithHolder("slow"))
	defer slow.Close()

	l := acquire(t, slow, "late/a", client.WithTTL(600*time.Millisecond))
	waitLost(t, l)
	if err := l.Err(); !strings.Contains(err.Error(), "local validity ran out") {
		t.Fatalf("Err() = %v, want the local validity to have run out", err)
	}
	for i := 0; ; i++ {
		if i > 100 {
			t.Fatal("no end of late/a in 100 events")
		}
		e := next()
		if e.Scope != "late/a" || e.Kind == client.EventGranted || e.Kind == client.EventRenewed {
			continue
		}
		if e.Kind != client.EventReleased {
			t.Errorf("late/a ended with %+v, want released by its holder once lost locally", e)
		}
		break
	}
	if err := l.Release(ctx); !errors.Is(err, fence.ErrLeaseLost) {
		t.Errorf("Release of the lost lease = %v, want fence.ErrLeaseLost", err)
	}
}

// partition passes calls through until cut closes. Then renewals are lost
// on the way, failing only when their caller gives up, as over a network
// that drops packets, and releases are held until heal closes, whatever
// their context says: a Release that waited for one would hang.
type partition struct {
	next      http.RoundTripper
	cut, heal chan struct{}
	releasing chan struct{} // closed when the first release is held
	once      sync.Once
}

func (p *partition) RoundTrip(r *http.Request) (*http.Response, error) {
	select {
	case <-p.cut:
	default:
		return p.next.RoundTrip(r)
	}
	switch path := r.URL.Path; {
	case strings.HasSuffix(path, "/Renew"), strings.HasSuffix(path, "/RenewBatch"):
		<-r.Context().Done()
		return nil, r.Context().Err()
	case strings.HasSuffix(path, "/Release"), strings.HasSuffix(path, "/ReleaseBatch"):
		p.once.Do(func() { close(p.releasing) })
		<-p.heal
	}
	return p.next.RoundTrip(r)
}

func (p *partition) CloseIdleConnections() {
	p.next.(interface{ CloseIdleConnections() }).CloseIdleConnections()
}

// TestReleaseOfLeaseLostInPartition: a lease whose local validity ran out
// in a partition is released in the background (see
// TestLocallyLostLeaseReleased), and Release returns its loss reason at
// once, without waiting for that release, which a partition holds for up
// to a TTL: a deferred Release(context.Background()) must not hang there
// (issue 41, item 4).
func TestReleaseOfLeaseLostInPartition(t *testing.T) {
	srv, _ := start(t)
	p := &partition{next: http.DefaultTransport.(*http.Transport).Clone(),
		cut: make(chan struct{}), heal: make(chan struct{}), releasing: make(chan struct{})}
	cut := srv.Client(client.WithHTTPClient(&http.Client{Transport: p}), client.WithHolder("cut"))
	defer cut.Close()
	healed := sync.OnceFunc(func() { close(p.heal) })
	defer healed()

	l := acquire(t, cut, "part/a", client.WithTTL(600*time.Millisecond))
	close(p.cut)
	waitLost(t, l)
	lost := l.Err()
	if !strings.Contains(lost.Error(), "local validity ran out") {
		t.Fatalf("Err() = %v, want the local validity to have run out", lost)
	}
	select {
	case <-p.releasing:
	case <-time.After(wait):
		t.Fatalf("no release of the lost lease within %v", wait)
	}
	released := make(chan error, 1)
	go func() { released <- l.Release(context.Background()) }()
	select {
	case err := <-released:
		if err != lost {
			t.Errorf("Release of the lost lease = %v, want its loss reason %v", err, lost)
		}
	case <-time.After(wait):
		t.Fatalf("Release of the lost lease still waits after %v, for the release the partition holds", wait)
	}
}
