package lessor

import (
	"maps"
	"testing"
	"time"
	"unsafe"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/internal/fsm"
)

func lease(token uint64, ttl time.Duration) fsm.Lease {
	return fsm.Lease{Token: token, ID: fence.NewLeaseID(), TTL: ttl}
}

func granted(l fsm.Lease) func() fsm.Result {
	return func() fsm.Result { return fsm.Result{Outcome: fsm.Granted, Lease: l} }
}

func TestDeadlinesRenewExtendsFromNow(t *testing.T) {
	d := newDeadlines()
	t0 := time.Now()
	l := lease(7, 10*time.Second)
	d.granted("a", l, t0)
	if got := d.left("a", 7, t0.Add(4*time.Second)); got != 6*time.Second {
		t.Fatalf("left after 4s = %v, want 6s", got)
	}
	r, ttl := d.renew("a", t0.Add(4*time.Second), granted(l))
	if r.Outcome != fsm.Granted || ttl != 10*time.Second || r.Lease.Token != 7 {
		t.Fatalf("renew = %v %v token %d", r.Outcome, ttl, r.Lease.Token)
	}
	if got := d.left("a", 7, t0.Add(4*time.Second)); got != 10*time.Second {
		t.Fatalf("left after renewal = %v, want a full TTL", got)
	}
	if due, _ := d.due(t0.Add(13*time.Second), 10); len(due) != 0 {
		t.Fatalf("renewed lease due at 13s: %+v", due)
	}
	due, _ := d.due(t0.Add(14*time.Second), 10)
	if len(due) != 1 || due[0].scope != "a" || due[0].token != 7 {
		t.Fatalf("due at 14s = %+v, want a/7", due)
	}
}

// Once expiry is decided, a renewal must answer lost: confirming it would
// tell the holder it has authority the next Expire takes away.
func TestDeadlinesNoRenewalAfterExpiryDecided(t *testing.T) {
	d := newDeadlines()
	t0 := time.Now()
	l := lease(3, time.Second)
	d.granted("a", l, t0)
	if due, _ := d.due(t0.Add(time.Second), 10); len(due) != 1 {
		t.Fatalf("due = %+v, want one", due)
	}
	r, _ := d.renew("a", t0.Add(time.Second), granted(l))
	if r.Outcome != fsm.Lost {
		t.Fatalf("renew after expiry decided = %v, want lost", r.Outcome)
	}
	if due, _ := d.due(t0.Add(time.Minute), 10); len(due) != 0 {
		t.Fatalf("an expiring lease was handed out twice: %+v", due)
	}
	d.retry("a", 3, t0.Add(2*time.Second))
	if due, _ := d.due(t0.Add(2*time.Second), 10); len(due) != 1 {
		t.Fatalf("retried expiry not due again: %+v", due)
	}
	d.ended("a", 3)
	if got := d.left("a", 3, t0); got != 0 {
		t.Fatalf("ended lease has %v left", got)
	}
}

// reset is what a new leader does: every held lease gets a full TTL from
// now, whatever deadline it had, and expiring marks are cleared.
func TestDeadlinesResetGivesFullTTL(t *testing.T) {
	d := newDeadlines()
	t0 := time.Now()
	a, b := lease(1, time.Second), lease(9, 5*time.Second)
	d.granted("a", a, t0)
	d.due(t0.Add(2*time.Second), 10) // a is expiring
	t1 := t0.Add(time.Hour)
	d.reset(2, maps.All(map[string]fsm.Lease{"a": a, "b": b}), t1)
	for scope, want := range map[string]time.Duration{"a": time.Second, "b": 5 * time.Second} {
		tok := map[string]uint64{"a": 1, "b": 9}[scope]
		if got := d.left(scope, tok, t1); got != want {
			t.Errorf("%s: left after reset = %v, want %v", scope, got, want)
		}
	}
	if due, _ := d.due(t1.Add(999*time.Millisecond), 10); len(due) != 0 {
		t.Fatalf("due before a full TTL after reset: %+v", due)
	}
}

func TestDeadlinesEndedIgnoresOtherToken(t *testing.T) {
	d := newDeadlines()
	t0 := time.Now()
	d.granted("a", lease(2, time.Second), t0)
	d.ended("a", 1) // an older lease's end must not drop the newer one
	if got := d.left("a", 2, t0); got != time.Second {
		t.Fatalf("left = %v, want 1s", got)
	}
}

func TestDeadlinesDueInOrder(t *testing.T) {
	d := newDeadlines()
	t0 := time.Now()
	for i, ttl := range []time.Duration{3, 1, 2} {
		d.granted(string(rune('a'+i)), lease(uint64(i+1), ttl*time.Second), t0)
	}
	due, next := d.due(t0.Add(2*time.Second), 10)
	if len(due) != 2 || due[0].scope != "b" || due[1].scope != "c" {
		t.Fatalf("due = %+v, want b then c", due)
	}
	if !next.Equal(t0.Add(3 * time.Second)) {
		t.Fatalf("next = %v, want t0+3s", next.Sub(t0))
	}
}

// TestDeadlineIsSmall: the leader keeps one deadline per held lease, a
// million of them at scale; a field added carelessly costs that many.
func TestDeadlineIsSmall(t *testing.T) {
	if n := unsafe.Sizeof(deadline{}); n > 48 {
		t.Fatalf("a deadline takes %d bytes, was 48", n)
	}
}
