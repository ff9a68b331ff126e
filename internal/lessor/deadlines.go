package lessor

import (
	"container/heap"
	"iter"
	"sync"
	"time"

	"github.com/fence-dev/fence/internal/fsm"
)

// deadlines keeps every held lease's deadline on this node's monotonic
// clock. Renewals change no token, so they stay off the Raft log and only
// move a deadline here; only the leader's deadlines decide expiry.
//
// A deadline is marked expiring, under the same lock renewals take, before
// its Expire command is proposed: from then on a renewal answers lost, so a
// lease is never confirmed to its holder and then expired.
//
// Lock order (see the package doc): the state machine's lock (Node.Read)
// before mu, never the other way round. Renewing and taking office need
// both, the state to check a lease and mu to move its deadline; the state
// machine's writer takes the state lock alone and then mu alone (Applied). Taking
// them in one order is what keeps a waiting writer from closing a cycle:
// sync.RWMutex holds new readers back behind it, so a reader holding mu and
// waiting for the state lock would wait for ever on one holding the state
// lock and waiting for mu. Nothing calls out of this type while holding mu
// except renew's check, which must not take the state lock.
type deadlines struct {
	mu   sync.Mutex
	by   map[string]*deadline // by scope
	heap deadlineHeap
	wake chan struct{} // signalled when an earlier deadline may exist
	base time.Time     // what deadline.at counts from, on the monotonic clock
}

// deadline is kept small, 48 bytes: there is one per held lease.
//
// The heap orders deadlines by key, which is never later than at: a renewal
// moves at alone, in constant time, and due keys the deadline at its new at
// when it comes to the top. A lease renewed many times a TTL moves in the
// heap at most once a TTL, off the renewal's path (eda15be:BENCHMARKS.md,
// "Renewals without the heap").
type deadline struct {
	scope    string
	token    uint64
	at       time.Duration // since deadlines.base
	key      time.Duration // the heap's order; key <= at
	index    int32         // in the heap
	expiring bool
}

func newDeadlines() *deadlines {
	return &deadlines{by: make(map[string]*deadline), wake: make(chan struct{}, 1), base: time.Now()}
}

// since returns t on the deadlines' clock.
func (d *deadlines) since(t time.Time) time.Duration { return t.Sub(d.base) }

// granted starts a full TTL for a new lease.
func (d *deadlines) granted(scope string, l fsm.Lease, now time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.setLocked(scope, l, now)
}

func (d *deadlines) setLocked(scope string, l fsm.Lease, now time.Time) {
	if old := d.by[scope]; old != nil {
		heap.Remove(&d.heap, int(old.index))
	}
	at := d.since(now) + l.TTL
	e := &deadline{scope: scope, token: l.Token, at: at, key: at}
	d.by[scope] = e
	heap.Push(&d.heap, e)
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

// ended forgets the lease with this token, if it is the one tracked.
func (d *deadlines) ended(scope string, token uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if e := d.by[scope]; e != nil && e.token == token {
		heap.Remove(&d.heap, int(e.index))
		delete(d.by, scope)
	}
}

// reset gives every held lease, n of them, a full TTL from now. A new
// leader calls it before expiring anything (invariant 5): its predecessor
// may have confirmed renewals it never heard of.
func (d *deadlines) reset(n int, leases iter.Seq2[string, fsm.Lease], now time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.by = make(map[string]*deadline, n)
	d.heap = d.heap[:0]
	for scope, l := range leases {
		d.setLocked(scope, l, now)
	}
}

// renew extends each of rs that check finds granted to a full TTL from
// now, unless its expiry has been decided, and puts what it decided in the
// same place of out. check reads the state machine's view of a lease ID;
// it runs under d's lock so that decision cannot slip in between, and one
// lock covers the whole batch. The caller already holds the state lock
// (see the lock order above): check must not take it. It reports whether
// it renewed any.
func (d *deadlines) renew(now time.Time, rs []Renewal, out []Renewed, check func(Renewal) fsm.Result) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	renewed := false
	for i, r := range rs {
		// Decided in place: a Renewed is some 200 bytes, and returning
		// it by value copied it twice more a renewal.
		out[i] = Renewed{Result: check(r)}
		d.renewLocked(r.Scope, &out[i], now)
		renewed = renewed || out[i].Outcome == fsm.Granted
	}
	return renewed
}

// renewLocked decides the renewal of scope's lease that r's check found:
// it leaves a refusal as it is, answers lost a lease whose expiry has been
// decided, and gives a renewed one its TTL.
func (d *deadlines) renewLocked(scope string, r *Renewed, now time.Time) {
	if r.Outcome != fsm.Granted {
		return
	}
	e := d.by[scope]
	switch {
	case e == nil || e.token != r.Lease.Token:
		// Granted but not yet tracked: cannot happen while events are
		// delivered before grants are answered; track it to be safe.
		d.setLocked(scope, r.Lease, now)
	case e.expiring:
		r.Result = fsm.Result{Outcome: fsm.Lost, Scope: scope, Lease: r.Lease, Current: r.Lease.Token}
		return
	default:
		e.at = max(e.at, d.since(now)+r.Lease.TTL)
	}
	r.TTL = r.Lease.TTL
}

// left reports the time left of the lease with this token, 0 if untracked.
func (d *deadlines) left(scope string, token uint64, now time.Time) time.Duration {
	d.mu.Lock()
	defer d.mu.Unlock()
	if e := d.by[scope]; e != nil && e.token == token && !e.expiring {
		return max(e.at-d.since(now), 0)
	}
	return 0
}

// due marks the leases whose deadline has passed as expiring and returns
// them, with the time of the next deadline (zero if none).
func (d *deadlines) due(now time.Time, limit int) ([]deadline, time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []deadline
	t := d.since(now)
	for len(d.heap) > 0 && len(out) < limit {
		e := d.heap[0]
		if e.key > t {
			return out, d.base.Add(e.key)
		}
		if e.at > t {
			// Renewed since it was keyed.
			e.key = e.at
			heap.Fix(&d.heap, 0)
			continue
		}
		e.expiring = true
		// Keep it tracked but out of the way until the Expire is applied
		// (ended) or fails (retry).
		e.at = t + time.Hour
		e.key = e.at
		heap.Fix(&d.heap, 0)
		out = append(out, *e)
	}
	if len(d.heap) > 0 {
		return out, d.base.Add(d.heap[0].key)
	}
	return out, time.Time{}
}

// retry puts back a lease whose Expire proposal failed, to be tried again
// at the given time.
func (d *deadlines) retry(scope string, token uint64, at time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if e := d.by[scope]; e != nil && e.token == token && e.expiring {
		e.at = d.since(at)
		e.key = e.at
		heap.Fix(&d.heap, int(e.index))
	}
}

type deadlineHeap []*deadline

func (h deadlineHeap) Len() int           { return len(h) }
func (h deadlineHeap) Less(i, j int) bool { return h[i].key < h[j].key }
func (h deadlineHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = int32(i), int32(j)
}
func (h *deadlineHeap) Push(x any) {
	e := x.(*deadline)
	e.index = int32(len(*h))
	*h = append(*h, e)
}
func (h *deadlineHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return e
}
