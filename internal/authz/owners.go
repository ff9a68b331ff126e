package authz

import (
	"fmt"
	"iter"
	"sync"

	"connectrpc.com/connect"

	"github.com/fence-dev/fence/internal/fsm"
)

// Owners counts, per owner, the leases held and the acquires under way, for
// --max-leases-per-identity and --max-waiters-per-identity. An owner is the
// authenticated identity with auth on; with auth off, the holder name the
// acquire gives. The holder is the client's own choice, so with auth off
// the limits stop a leaking or looping client, not a hostile one that
// changes its name (auth on stops that); they are by holder, not by remote
// address, because a follower forwards every caller's acquire from its own
// address, and because the holder is recorded with each lease, so the
// count survives a leader change.
//
// Every node keeps the lease counts from the lease events, in log order,
// and counts them anew from the state when a snapshot replaces it (Reset),
// both on the goroutine that applies the log: a count never misses a
// transition or takes one twice, and a node that takes office has them
// ready. Each admitted acquire
// counts as a lease until it is answered, so acquires racing each other,
// or a batch of many, cannot pass the limit. It is safe for concurrent use.
type Owners struct {
	mu      sync.Mutex
	n       map[owner]int // leases held
	pending map[owner]int // acquires admitted, not yet answered
	waiting map[owner]int // of which may wait in a line
}

// owner is whom a lease counts against: the identity, or with none the
// holder. A holder never counts against an identity of the same name.
type owner struct{ identity, holder string }

func ownerOf(identity, holder string) owner {
	if identity != "" {
		return owner{identity: identity}
	}
	return owner{holder: holder}
}

func (o owner) String() string {
	if o.identity != "" {
		return fmt.Sprintf("%q", o.identity)
	}
	return fmt.Sprintf("holder %q", o.holder)
}

// Reset counts the leases of the state anew. It is called where Event is,
// on the goroutine that applies the log, after a snapshot replaced the
// state: an event of an entry applied before the state read must not come
// after it, or it would be counted twice.
func (o *Owners) Reset(leases iter.Seq2[string, fsm.Lease]) {
	n := make(map[owner]int)
	for _, l := range leases {
		n[ownerOf(l.Owner, l.Holder)]++
	}
	o.mu.Lock()
	o.n = n
	o.mu.Unlock()
}

// Event counts a lease begun or ended.
func (o *Owners) Event(e fsm.Event) {
	k := ownerOf(e.Lease.Owner, e.Lease.Holder)
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.n == nil {
		o.n = make(map[owner]int)
	}
	switch e.Kind {
	case fsm.EventGranted:
		o.n[k]++
	case fsm.EventReleased, fsm.EventExpired:
		decrement(o.n, k)
	}
}

func (o *Owners) checkLeases(k owner, limit int) error {
	if held := o.n[k] + o.pending[k]; limit > 0 && held >= limit {
		return connect.NewError(connect.CodeResourceExhausted,
			fmt.Errorf("%s holds %d leases (or acquires under way), the most one %s may hold (fenced --max-leases-per-identity); release one first", k, held, k.kind()))
	}
	return nil
}

func (o owner) kind() string {
	if o.identity != "" {
		return "identity"
	}
	return "holder (auth off)"
}

// Admit refuses an acquire whose owner holds maxLeases leases, counting
// the acquires under way, or, for one that may wait, has maxWaiters such
// acquires under way already (0: no limit). An admitted acquire counts
// until done is called, once it is answered.
func (o *Owners) Admit(c fsm.Command, maxLeases, maxWaiters int) (done func(), err error) {
	k := ownerOf(c.Owner, c.Holder)
	o.mu.Lock()
	defer o.mu.Unlock()
	if err := o.checkLeases(k, maxLeases); err != nil {
		return nil, err
	}
	if c.Wait && maxWaiters > 0 && o.waiting[k] >= maxWaiters {
		return nil, connect.NewError(connect.CodeResourceExhausted,
			fmt.Errorf("%s has %d acquires waiting, the most one %s may have (fenced --max-waiters-per-identity); retry once one is answered", k, o.waiting[k], k.kind()))
	}
	if o.pending == nil {
		o.pending, o.waiting = make(map[owner]int), make(map[owner]int)
	}
	o.pending[k]++
	if c.Wait {
		o.waiting[k]++
	}
	return sync.OnceFunc(func() {
		o.mu.Lock()
		defer o.mu.Unlock()
		decrement(o.pending, k)
		if c.Wait {
			decrement(o.waiting, k)
		}
	}), nil
}

func decrement(m map[owner]int, k owner) {
	if m[k]--; m[k] <= 0 {
		delete(m, k)
	}
}
