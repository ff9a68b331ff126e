package lessor

import (
	"maps"
	"testing"
	"time"
	"unsafe"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/internal/fsm"
	"pgregory.net/rapid"
)

func lease(token uint64, ttl time.Duration) fsm.Lease {
	return fsm.Lease{Token: token, ID: fence.NewLeaseID(), TTL: ttl}
}

// renewOne renews scope's lease l, which the state machine holds granted.
func renewOne(d *deadlines, scope string, now time.Time, l fsm.Lease) (fsm.Result, time.Duration) {
	out := make([]Renewed, 1)
	d.renew(now, []Renewal{{Scope: scope, ID: l.ID}}, out, func(Renewal) fsm.Result { return fsm.Result{Outcome: fsm.Granted, Lease: l} })
	return out[0].Result, out[0].TTL
}

func TestDeadlinesRenewExtendsFromNow(t *testing.T) {
	d := newDeadlines()
	t0 := time.Now()
	l := lease(7, 10*time.Second)
	d.granted("a", l, t0)
	if got := d.left("a", 7, t0.Add(4*time.Second)); got != 6*time.Second {
		t.Fatalf("left after 4s = %v, want 6s", got)
	}
	r, ttl := renewOne(d, "a", t0.Add(4*time.Second), l)
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
	r, _ := renewOne(d, "a", t0.Add(time.Second), l)
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

// TestDeadlinesAgainstModel drives deadlines through random grants,
// renewals, expiry decisions, retries and ends, on a clock that only moves
// forward, and checks each answer against a plain map of true deadlines:
// due hands out only leases whose deadline passed, as many as it may, and
// the next wake-up it names is never later than the earliest deadline, so
// a renewal that moves a deadline without touching the heap cannot make a
// lease outlive it unexpired or expire early.
func TestDeadlinesAgainstModel(t *testing.T) {
	type want struct {
		l        fsm.Lease
		at       time.Duration // since t0
		expiring bool
	}
	rapid.Check(t, func(rt *rapid.T) {
		d := newDeadlines()
		t0 := d.base
		var now time.Duration
		model := map[string]*want{}
		var token uint64
		scopes := []string{"a", "b", "c", "d", "e"}
		for range rapid.IntRange(1, 200).Draw(rt, "steps") {
			scope := rapid.SampledFrom(scopes).Draw(rt, "scope")
			m := model[scope]
			switch rapid.IntRange(0, 6).Draw(rt, "op") {
			case 0: // grant (a new lease replaces an old one)
				token++
				l := lease(token, time.Duration(rapid.IntRange(1, 5).Draw(rt, "ttl"))*time.Second)
				d.granted(scope, l, t0.Add(now))
				model[scope] = &want{l: l, at: now + l.TTL}
			case 1, 2: // renew
				if m == nil {
					continue
				}
				r, ttl := renewOne(d, scope, t0.Add(now), m.l)
				if m.expiring {
					if r.Outcome != fsm.Lost {
						rt.Fatalf("renew of %s after its expiry was decided = %v; want lost", scope, r.Outcome)
					}
					continue
				}
				if r.Outcome != fsm.Granted || ttl != m.l.TTL {
					rt.Fatalf("renew of %s = %v %v; want granted %v", scope, r.Outcome, ttl, m.l.TTL)
				}
				m.at = max(m.at, now+m.l.TTL)
			case 3: // the expiry loop
				limit := rapid.IntRange(1, 3).Draw(rt, "limit")
				due, next := d.due(t0.Add(now), limit)
				ready := 0
				earliest := time.Duration(-1)
				for _, w := range model {
					if w.at <= now {
						ready++
					}
				}
				if len(due) != min(limit, ready) {
					rt.Fatalf("at %v: due handed out %d of %d leases past their deadline (limit %d)", now, len(due), ready, limit)
				}
				for _, e := range due {
					w := model[e.scope]
					if w == nil || w.l.Token != e.token || w.at > now {
						rt.Fatalf("at %v: due handed out %s/%d, not past its deadline (model %+v)", now, e.scope, e.token, w)
					}
					w.expiring, w.at = true, now+time.Hour
				}
				for _, w := range model {
					if earliest < 0 || w.at < earliest {
						earliest = w.at
					}
				}
				switch {
				case earliest < 0 && !next.IsZero():
					rt.Fatalf("at %v: next %v with no lease held", now, next.Sub(t0))
				case earliest >= 0 && (next.IsZero() || next.Sub(t0) > earliest):
					rt.Fatalf("at %v: next wake-up %v is after the earliest deadline %v", now, next.Sub(t0), earliest)
				}
			case 4: // the Expire failed: try again a little later
				if m == nil || !m.expiring {
					continue
				}
				m.at = now + 100*time.Millisecond
				d.retry(scope, m.l.Token, t0.Add(m.at))
			case 5: // released or expired
				if m == nil {
					continue
				}
				d.ended(scope, m.l.Token)
				delete(model, scope)
			case 6:
				now += time.Duration(rapid.IntRange(0, 3000).Draw(rt, "ms")) * time.Millisecond
			}
			for s, w := range model {
				left := max(w.at-now, 0)
				if w.expiring {
					left = 0
				}
				if got := d.left(s, w.l.Token, t0.Add(now)); got != left {
					rt.Fatalf("at %v: %s has %v left; want %v", now, s, got, left)
				}
			}
		}
	})
}

// TestRestoreForgetsEndedLeases: on a follower, a snapshot installed from
// the leader replaces the state without the events of the entries it
// covers; the deadlines of leases that ended meanwhile are forgotten and
// those granted meanwhile tracked, not left as they were until the node
// takes office (issue 33, item 12).
func TestRestoreForgetsEndedLeases(t *testing.T) {
	l := New(Config{}) // a follower: never in office
	now := time.Now()
	apply := func(st *fsm.State, c fsm.Command) fsm.Result {
		r := st.Apply(c)
		l.Applied(r.Events, now)
		return r
	}
	acquire := func(scope string) fsm.Command {
		return fsm.Command{Op: fsm.OpAcquire, Scope: scope, LeaseID: fence.NewLeaseID(), Holder: "h", TTL: time.Minute, At: now.UnixNano()}
	}
	st := fsm.New()
	ended := apply(st, acquire("ended")).Lease
	kept := apply(st, acquire("kept")).Lease
	// The leader's state, which the snapshot carries: "ended" was released
	// and "new" granted in entries this follower never applied.
	leader := fsm.New()
	leader.Apply(fsm.Command{Op: fsm.OpAcquire, Scope: "ended", LeaseID: ended.ID, Holder: "h", TTL: time.Minute, At: now.UnixNano()})
	leader.Apply(fsm.Command{Op: fsm.OpAcquire, Scope: "kept", LeaseID: kept.ID, Holder: "h", TTL: time.Minute, At: now.UnixNano()})
	leader.Apply(fsm.Command{Op: fsm.OpRelease, Scope: "ended", LeaseID: ended.ID, At: now.UnixNano()})
	added := leader.Apply(acquire("new")).Lease
	l.Restored(leader, now)
	if got := l.Left("ended", ended.Token, now); got != 0 {
		t.Errorf("a lease that ended before the snapshot: %v left; want forgotten", got)
	}
	if got := l.Left("kept", kept.Token, now); got != time.Minute {
		t.Errorf("a lease held throughout: %v left; want a minute", got)
	}
	if got := l.Left("new", added.Token, now); got != time.Minute {
		t.Errorf("a lease granted before the snapshot: %v left; want a minute", got)
	}
	if n := len(l.deadlines.by); n != 2 {
		t.Errorf("%d deadlines tracked, want 2", n)
	}
}
