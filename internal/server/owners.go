package server

import (
	"fmt"
	"iter"
	"sync"

	"connectrpc.com/connect"

	"github.com/fence-dev/fence/internal/fsm"
)

// owners counts the leases each authenticated identity holds, for
// --max-leases-per-identity. The leader rebuilds it from the state when it
// takes office and keeps it current from the lease events; the identity is
// recorded with each lease (fsm.Lease.Owner), so it survives a leader
// change. The limit is checked before an acquire is proposed, so acquires
// racing each other may pass it by a few.
type owners struct {
	mu sync.Mutex
	n  map[string]int
}

func (o *owners) reset(leases iter.Seq2[string, fsm.Lease]) {
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

func (o *owners) event(e fsm.Event) {
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

// check refuses an acquire by id when id holds limit leases already.
func (o *owners) check(id string, limit int) error {
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
