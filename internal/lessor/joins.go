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
// or it has waited maxPark.
type joins struct {
	mu       sync.Mutex
	open     bool               // in office
	parked   map[string][]*join // by scope, in arrival order
	inflight map[string]int     // taken into an entry, not yet answered, by scope
	n        atomic.Int32       // parked
	kick     chan struct{}      // buffered: a parked scope may be free
	maxPark  time.Duration      // a test's, else maxPark
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
	return &joins{parked: make(map[string][]*join), inflight: make(map[string]int), kick: make(chan struct{}, 1), maxPark: maxPark}
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
	first := len(js.parked[c.Scope]) == 0 && js.inflight[c.Scope] == 0
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
	js.parked[c.Scope] = append(js.parked[c.Scope], j)
	now := first && !held
	if js.n.Add(1) == 1 && !now {
		js.wake() // for the flusher to time its maxPark
	}
	return j, now
}

// unpark takes j back if it is still parked, reporting whether it was:
// if not, an entry carries it and answers it.
func (js *joins) unpark(j *join) bool {
	js.mu.Lock()
	defer js.mu.Unlock()
	list := js.parked[j.c.Scope]
	for i, p := range list {
		if p == j {
			js.drop(j.c.Scope, append(list[:i:i], list[i+1:]...))
			js.n.Add(-1)
			return true
		}
	}
	return false
}

func (js *joins) drop(scope string, list []*join) {
	if len(list) == 0 {
		delete(js.parked, scope)
	} else {
		js.parked[scope] = list
	}
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
	var out []*join
	for scope, list := range js.parked {
		if js.inflight[scope] > 0 {
			continue
		}
		k := min(len(list), room-len(out))
		out = append(out, list[:k]...)
		js.inflight[scope] += k
		js.drop(scope, list[k:])
		if len(out) == room {
			break
		}
	}
	js.n.Add(-int32(len(out)))
	return out
}

// answer gives the acquires taken into an entry their results (rs, in
// their order, or err), and wakes the flusher if acquires parked behind
// them may now go.
func (js *joins) answer(taken []*join, rs []fsm.Result, err error) {
	js.mu.Lock()
	kick := false
	for _, j := range taken {
		if js.inflight[j.c.Scope]--; js.inflight[j.c.Scope] <= 0 {
			delete(js.inflight, j.c.Scope)
			kick = kick || len(js.parked[j.c.Scope]) > 0
		}
	}
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
	var oldest time.Time
	for scope, list := range js.parked {
		if js.inflight[scope] > 0 {
			continue
		}
		if at := list[0].at; oldest.IsZero() || at.Before(oldest) {
			oldest = at
		}
	}
	if oldest.IsZero() {
		return false, time.Time{}
	}
	if !now.Before(oldest.Add(js.maxPark)) {
		return true, time.Time{}
	}
	free := false
	n.Read(func(st *fsm.State) {
		for scope := range js.parked {
			if js.inflight[scope] == 0 && st.Get(scope).Lease == nil {
				free = true
				return
			}
		}
	})
	return free, oldest.Add(js.maxPark)
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
	parked := js.parked
	js.parked = make(map[string][]*join)
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
