package authz

import (
	"fmt"
	"iter"
	"sync"

	"connectrpc.com/connect"

	"github.com/fence-dev/fence/internal/fsm"
)

// Owners counts the leases each authenticated identity holds, for
// --max-leases-per-identity. The leader rebuilds it from the state when it
// takes office and keeps it current from the lease events; the identity is
// recorded with each lease (fsm.Lease.Owner), so it survives a leader
// change. The limit is checked before an acquire is proposed, so acquires
// racing each other may pass it by a few.
type Owners struct {
	mu sync.Mutex
	n  map[string]int
}

// Reset counts the leases of the state anew.
func (o *Owners) Reset(leases iter.Seq2[string, fsm.Lease]) {
	n := make(map[string]int)
	for _, l := range leases {
		if l.Owner != "" {
			n[l.Owner]++
		}
	}
	o.mu.Lock()
	o.n = n
	o.mu.Unlock()
}

// Event counts a lease begun or ended.
func (o *Owners) Event(e fsm.Event) {
	if e.Lease.Owner == "" {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.n == nil {
		return // not leader yet: reset builds it
	}
	switch e.Kind {
	case fsm.EventGranted:
		o.n[e.Lease.Owner]++
	case fsm.EventReleased, fsm.EventExpired:
		if o.n[e.Lease.Owner]--; o.n[e.Lease.Owner] <= 0 {
			delete(o.n, e.Lease.Owner)
		}
	}
}

// Check refuses an acquire by id when id holds limit leases already.
func (o *Owners) Check(id string, limit int) error {
	if limit <= 0 || id == "" {
		return nil
	}
	o.mu.Lock()
	held := o.n[id]
	o.mu.Unlock()
	if held >= limit {
		return connect.NewError(connect.CodeResourceExhausted,
			fmt.Errorf("%q holds %d leases, the most one identity may hold (fenced --max-leases-per-identity); release one first", id, held))
	}
	return nil
}
