package lessor

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/internal/fsm"
)

// maxPark bounds how long a waiting acquire stays parked on the leader
// before it is proposed in an entry of its own: until it is proposed it is
// not in the line that queries show.
const maxPark = 5 * time.Millisecond

// joins parks the waiting acquires on the leader until the next entry it
// proposes, which carries them (from fsm.WaitBatchFormat on), so that
// joining a line costs no fsync of its own. On a contended
// scope the holder's release and the previous holder's next acquire arrive
// together; proposed apart, the release waited for the acquire's fsync
// and then for its own, two a hand-off.
//
// The order of arrival is kept: every waiting acquire parks, in arrival
// order per scope, and an entry takes a scope's parked acquires from the
// front, and none while an entry that took some of the scope's is on its
// way: entries proposed at once reach the log in no set order, and a later
// one would put its acquires in line in front of the earlier one's. So the
// line is first come first served as the leader saw them come. One whose
// scope is free, with nothing of its scope parked or on its way, is
// proposed at once by its own caller, in an entry that takes it and
// whatever parked before it. Otherwise a parked acquire is proposed
// once its scope is free (a release or an expiry not carrying it freed it)
// or it has waited maxPark. Those rules are parked's, a pure structure;
// joins holds it under its lock, answers the acquires and wakes the
// flusher.
type joins struct {
	mu   sync.Mutex
	open bool          // in office
	p    parked        // the order they go in
	n    atomic.Int32  // parked: p.n, read without mu
	kick chan struct{} // buffered: a parked scope may be free
}

type join struct {
	c    fsm.Command
	at   time.Time
	done chan joined // buffered; answered once
}

type joined struct {
	r   fsm.Result
	err error
}

func newJoins() *joins {
	return &joins{p: newParked(maxPark), kick: make(chan struct{}, 1)}
}

// park puts c, a waiting acquire, at the end of its scope's parked joins
// and returns it, with now true if its caller is to propose an entry at
// once to carry it: its scope free (or held by c's own lease, a retry) and
// nothing of its scope parked or on its way before it. It returns nil out
// of office, or under a log format without waiting acquires in batches: c
// is then proposed on its own.
//
// A join let through so is parked like any other, and counted on its way
// once an entry takes it: an acquire for its scope that comes after it
// parks behind it and is never carried in front of it.
func (js *joins) park(n Node, c fsm.Command, at time.Time) (*join, bool) {
	js.mu.Lock()
	defer js.mu.Unlock()
	if !js.open {
		return nil, false
	}
	first := js.p.first(c.Scope)
	held := false
	if first {
		format := 0
		n.Read(func(st *fsm.State) {
			if format = st.Format(); format < fsm.WaitBatchFormat {
				return
			}
			l := st.Get(c.Scope).Lease
			held = l != nil && l.ID != c.LeaseID && (c.RequestID == "" || l.RequestID != c.RequestID)
		})
		if format < fsm.WaitBatchFormat {
			return nil, false
		}
	}
	j := &join{c: c, at: at, done: make(chan joined, 1)}
	parked := js.p.add(j)
	js.n.Store(int32(parked))
	now := first && !held
	if parked == 1 && !now {
		js.wake() // for the flusher to time its maxPark
	}
	return j, now
}

// unpark takes j back if it is still parked, reporting whether it was:
// if not, an entry carries it and answers it.
func (js *joins) unpark(j *join) bool {
	js.mu.Lock()
	defer js.mu.Unlock()
	if !js.p.remove(j) {
		return false
	}
	js.n.Store(int32(js.p.n))
	return true
}

// take takes up to room parked acquires into an entry about to be
// proposed; answer must follow. It leaves a scope's acquires parked while
// an entry that took some of them is on its way: answer wakes the flusher
// for them.
func (js *joins) take(room int) []*join {
	if js.n.Load() == 0 || room <= 0 {
		return nil
	}
	js.mu.Lock()
	defer js.mu.Unlock()
	out := js.p.take(room)
	js.n.Store(int32(js.p.n))
	return out
}

// answer gives the acquires taken into an entry their results (rs, in
// their order, or err), and wakes the flusher if acquires parked behind
// them may now go.
func (js *joins) answer(taken []*join, rs []fsm.Result, err error) {
	js.mu.Lock()
	kick := js.p.answered(taken)
	js.mu.Unlock()
	for i, j := range taken {
		if err != nil {
			j.done <- joined{err: err}
		} else {
			j.done <- joined{r: rs[i]}
		}
	}
	if kick {
		js.wake()
	}
}

// wake tells the flusher to look at the parked acquires again.
func (js *joins) wake() {
	select {
	case js.kick <- struct{}{}:
	default:
	}
}

// due reports whether a parked acquire must be proposed now, its scope
// free or its wait at maxPark, and if not, when the oldest will be (zero
// if none is parked). It passes over the scopes an entry on its way took
// acquires of, which take leaves parked until it is answered.
func (js *joins) due(n Node, now time.Time) (bool, time.Time) {
	if js.n.Load() == 0 {
		return false, time.Time{}
	}
	js.mu.Lock()
	defer js.mu.Unlock()
	due, next := js.p.due(now)
	if due || next.IsZero() {
		return due, next
	}
	free := false
	n.Read(func(st *fsm.State) {
		free = js.p.anyFree(func(scope string) bool { return st.Get(scope).Lease == nil })
	})
	return free, next
}

// enter opens the joins when the leader takes office.
func (js *joins) enter() {
	js.mu.Lock()
	defer js.mu.Unlock()
	js.open = true
}

// leave closes the joins when the leader leaves office, and answers every
// parked acquire: it was never proposed, and the next leader has no line
// to put it in.
func (js *joins) leave() {
	js.mu.Lock()
	js.open = false
	parked := js.p.clear()
	js.n.Store(0)
	js.mu.Unlock()
	for scope, list := range parked {
		for _, j := range list {
			j.done <- joined{err: leaderChanged(scope)}
		}
	}
}

// leaderChanged is the answer to a wait that a leader change ended, parked
// or in line: the caller retries at the next leader.
func leaderChanged(scope string) error {
	return fmt.Errorf("%w: the wait for %q was cancelled by a leader change; retry", fence.ErrUnavailable, scope)
}
