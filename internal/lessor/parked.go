package lessor

import "time"

// parked is the policy that orders the waiting acquires parked on the
// leader (see joins): which of them the next entry takes, and when one
// must be proposed without waiting for another entry. It is a pure
// structure, without locks, clocks or goroutines, so that its rules are
// tested as such; joins calls it under its lock and does the waking.
//
// The rules:
//   - A scope's acquires are taken in the order they were parked, from
//     the front.
//   - None of a scope's is taken while an entry that took some of them is
//     on its way (taken, not yet answered): entries proposed at once reach
//     the log in no set order.
//   - An entry takes at most the room it has left.
//   - One must be proposed once it has waited maxPark, or once its scope
//     is free (free says which are), unless its scope has one on its way.
type parked struct {
	by       map[string][]*join // by scope, in arrival order
	inflight map[string]int     // taken into an entry, not yet answered, by scope
	n        int                // parked
	maxPark  time.Duration
}

func newParked(maxPark time.Duration) parked {
	return parked{by: make(map[string][]*join), inflight: make(map[string]int), maxPark: maxPark}
}

// first reports whether nothing of scope is parked or on its way: an
// acquire of it parked now would be the next of its scope to go.
func (p *parked) first(scope string) bool {
	return len(p.by[scope]) == 0 && p.inflight[scope] == 0
}

// add parks j behind its scope's, and returns how many are parked.
func (p *parked) add(j *join) int {
	p.by[j.c.Scope] = append(p.by[j.c.Scope], j)
	p.n++
	return p.n
}

// remove takes j back if it is still parked, reporting whether it was.
func (p *parked) remove(j *join) bool {
	list := p.by[j.c.Scope]
	for i, q := range list {
		if q == j {
			p.set(j.c.Scope, append(list[:i:i], list[i+1:]...))
			p.n--
			return true
		}
	}
	return false
}

func (p *parked) set(scope string, list []*join) {
	if len(list) == 0 {
		delete(p.by, scope)
	} else {
		p.by[scope] = list
	}
}

// take takes up to room parked acquires into an entry, from the front of
// each scope that has none on its way, and counts them on their way until
// answered.
func (p *parked) take(room int) []*join {
	if p.n == 0 || room <= 0 {
		return nil
	}
	var out []*join
	for scope, list := range p.by {
		if p.inflight[scope] > 0 {
			continue
		}
		k := min(len(list), room-len(out))
		out = append(out, list[:k]...)
		p.inflight[scope] += k
		p.set(scope, list[k:])
		if len(out) == room {
			break
		}
	}
	p.n -= len(out)
	return out
}

// answered ends the way of acquires taken into an entry, and reports
// whether acquires parked behind them may now go.
func (p *parked) answered(taken []*join) bool {
	behind := false
	for _, j := range taken {
		if p.inflight[j.c.Scope]--; p.inflight[j.c.Scope] <= 0 {
			delete(p.inflight, j.c.Scope)
			behind = behind || len(p.by[j.c.Scope]) > 0
		}
	}
	return behind
}

// due reports whether a parked acquire must be proposed now, having waited
// maxPark; if not, next is when the oldest that may go will have (zero if
// none may: none is parked, or each scope has one on its way).
func (p *parked) due(now time.Time) (due bool, next time.Time) {
	if p.n == 0 {
		return false, time.Time{}
	}
	var oldest time.Time
	for scope, list := range p.by {
		if p.inflight[scope] > 0 {
			continue
		}
		if at := list[0].at; oldest.IsZero() || at.Before(oldest) {
			oldest = at
		}
	}
	if oldest.IsZero() {
		return false, time.Time{}
	}
	if !now.Before(oldest.Add(p.maxPark)) {
		return true, time.Time{}
	}
	return false, oldest.Add(p.maxPark)
}

// anyFree reports whether a scope that has acquires parked and none on its
// way is free, as free says.
func (p *parked) anyFree(free func(scope string) bool) bool {
	for scope := range p.by {
		if p.inflight[scope] == 0 && free(scope) {
			return true
		}
	}
	return false
}

// clear takes back every parked acquire, by scope.
func (p *parked) clear() map[string][]*join {
	by := p.by
	p.by = make(map[string][]*join)
	p.n = 0
	return by
}
