package eventlog

import (
	"fmt"
	"iter"
	"strings"
	"sync"

	"github.com/fence-dev/fence"
)

// RingSize is how many recent lease events the leader retains for watchers
// to resume from, and for the status page's timeline.
const RingSize = 10_000

// renewalSpacing spaces the renewals a lease records: one is recorded
// unless the same lease recorded one less than its TTL divided by this ago.
// Holders renew every third of the TTL (docs/protocol.md), so a quarter
// leaves room for the delays in between and records each of their
// renewals; a holder that renews more often, or names its lease many times
// in one batch, records at most four a TTL and cannot push the grants and
// closings of others out of the ring. A lease is lost for good, so its
// renewals answered lost record one loss while it is retained. Both are
// counted in the metrics all the same.
const renewalSpacing = 4

// rejectionShare bounds the ring's room for stale rejections: a stale
// token stays stale, so a rejection of the same token on the same scope
// is recorded once while it is retained, however often guards report it;
// and since a report is a claim nobody checks, in which a caller allowed
// to report may name a new token or a new scope every time, the
// rejections retained take at most a rejectionShare-th of the ring, the
// rest left out until some leave it. The metrics and the status page's
// counts (Rejections) take every one all the same.
const rejectionShare = 10

// termShift places the leader's term in a position's high bits, so that
// positions keep increasing across leaders: a new leader, in a higher term,
// starts after every position of its predecessors.
const termShift = 40

// Ring holds the recent lease events recorded by this node as the
// serving leader, each with a position: term<<40 | sequence within the
// term. Readers follow it with a cursor and wait on a channel that is
// closed at every append. A renewal or a loss is left out when the same
// lease recorded one lately (see renewalSpacing), a rejection when the
// same token's is retained or rejections have their share of the ring
// (see rejectionShare). It is safe for concurrent use.
type Ring struct {
	mu      sync.Mutex
	buf     []Event // circular; buf[(first-base)%len] is the oldest
	term    uint64
	first   uint64        // position of the oldest event retained
	next    uint64        // position of the next event
	changed chan struct{} // closed and replaced at every append
	closed  bool
	// repeats is the position of each lease's newest renewal and newest
	// loss, and of each rejected token's rejection, still retained; and,
	// under holderKey, of each token's newest event retained that names
	// its holder, so that Holder reads one slot where it scanned the ring
	// for every rejection reported. At most two entries an event.
	repeats map[repeatKey]uint64
	// rejections counts the rejections retained.
	rejections int
	// holderReads counts the slots holder lookups read, for tests to check
	// that a lookup costs one at most, whatever the ring holds.
	holderReads int
}

// repeatKey names the events of one kind of one lease, or, for
// rejections, which name no lease, of one token of a scope.
type repeatKey struct {
	kind  Kind
	scope string
	token uint64
	lease fence.LeaseID
}

func keyOf(e *Event) repeatKey { return repeatKey{e.Kind, e.Scope, e.Token, e.LeaseID} }

// holderKey names the events of a scope's token that name its holder,
// under kind 0, which no event has: Kind starts at 1.
func holderKey(scope string, token uint64) repeatKey {
	return repeatKey{scope: scope, token: token}
}

// NewRing returns an empty ring that retains the last size events.
func NewRing(size int) *Ring {
	return &Ring{buf: make([]Event, size), changed: make(chan struct{}), repeats: make(map[repeatKey]uint64)}
}

// Append records e as the next event of term; a new term starts the ring
// afresh. It returns e with its position, or with position 0 if e is a
// renewal, a loss or a rejection left out (see renewalSpacing and
// rejectionShare). A loss recorded without a holder gets the one its
// token's newest event still retained names (see Holder).
func (r *Ring) Append(term uint64, e Event) Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	e = r.appendLocked(term, e)
	if e.Position != 0 {
		r.wakeLocked()
	}
	return e
}

// AppendAll records the events of es as the next events of term, in
// order, taking the lock and waking the readers once: a batch of renewals
// publishes this way. es runs under the ring's lock.
func (r *Ring) AppendAll(term uint64, es iter.Seq[Event]) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for e := range es {
		if r.appendLocked(term, e).Position != 0 {
			n++
		}
	}
	if n > 0 {
		r.wakeLocked()
	}
}

// appendLocked records e and returns it as recorded, with position 0 if
// it is a renewal, a loss or a rejection left out.
func (r *Ring) appendLocked(term uint64, e Event) Event {
	if term != r.term || r.next == 0 {
		r.term = term
		r.first = term<<termShift | 1
		r.next = r.first
		clear(r.repeats)
		r.rejections = 0
	}
	if r.leftOut(e) {
		e.Position = 0
		return e
	}
	if e.Kind == Lost && e.Holder == "" {
		// A renewal answered lost after its lease left the state names no
		// holder: the ring may still know it.
		e.Holder = r.holderLocked(e.Scope, e.Token)
	}
	e.Position = r.next
	r.next++
	slot := &r.buf[e.Position%uint64(len(r.buf))]
	// Positions increase across terms: a slot at or after the oldest
	// retained position holds the event that leaves the ring now.
	if slot.Position >= r.first {
		for _, k := range [...]repeatKey{keyOf(slot), holderKey(slot.Scope, slot.Token)} {
			if r.repeats[k] == slot.Position {
				delete(r.repeats, k) // the newest of its kind and lease (or token) leaves
			}
		}
		if slot.Kind == Rejected {
			r.rejections--
		}
	}
	*slot = e
	switch e.Kind {
	case Rejected:
		r.rejections++
		fallthrough
	case Renewed, Lost:
		r.repeats[keyOf(&e)] = e.Position
	}
	if e.Holder != "" {
		r.repeats[holderKey(e.Scope, e.Token)] = e.Position
	}
	if r.next-r.first > uint64(len(r.buf)) {
		r.first = r.next - uint64(len(r.buf))
	}
	return e
}

// leftOut reports whether e is a renewal of a lease that recorded one
// less than its TTL/renewalSpacing before, a loss of a lease whose loss is
// retained, or a rejection of a token whose rejection is retained or past
// the rejections' share of the ring. r.mu is held.
func (r *Ring) leftOut(e Event) bool {
	p, ok := r.repeats[keyOf(&e)]
	switch e.Kind {
	case Renewed:
		return ok && e.At.Sub(r.buf[p%uint64(len(r.buf))].At) < e.TTL/renewalSpacing
	case Lost:
		return ok
	case Rejected:
		return ok || r.rejections >= max(len(r.buf)/rejectionShare, 1)
	}
	return false
}

func (r *Ring) wakeLocked() {
	close(r.changed)
	r.changed = make(chan struct{})
}

// Position returns where a watch starting now in term begins: the
// position the next event will get.
func (r *Ring) Position(term uint64) uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.next == 0 || r.term != term {
		return term<<termShift | 1
	}
	return r.next
}

// errClosed ends reads when the server stops.
var errClosed = fmt.Errorf("%w: the server is shutting down", fence.ErrUnavailable)

// Read returns up to limit events from position from on whose scope
// starts with prefix, the position to read from next, and a channel that
// is closed when more may have arrived. It fails with a *missedError when
// from is no longer (or was never) retained.
func (r *Ring) Read(from uint64, prefix string, limit int) ([]Event, uint64, <-chan struct{}, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, from, nil, errClosed
	}
	if r.next == 0 || from>>termShift > r.term {
		// A term that has recorded nothing here yet: only its first
		// position is a place to wait at.
		if from&(1<<termShift-1) == 1 {
			return nil, from, r.changed, nil
		}
		return nil, from, nil, r.missedLocked(from)
	}
	if from < r.first || from > r.next {
		return nil, from, nil, r.missedLocked(from)
	}
	var out []Event
	for ; from < r.next && len(out) < limit; from++ {
		e := r.buf[from%uint64(len(r.buf))]
		if strings.HasPrefix(e.Scope, prefix) {
			out = append(out, e)
		}
	}
	return out, from, r.changed, nil
}

// Start checks that a reader can begin at from while the leader is in
// term: at a retained position or the next one, or at the first position
// of a term that has recorded nothing yet, but not in a term to come.
func (r *Ring) Start(from, term uint64) error {
	if from>>termShift > term {
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.missedLocked(from)
	}
	_, _, _, err := r.Read(from, "", 0)
	return err
}

func (r *Ring) missedLocked(from uint64) error {
	e := &missedError{position: from}
	if r.next != 0 {
		e.oldest, e.next = r.first, r.next
	}
	return e
}

// missedError explains why a watch cannot resume where it asked to. It
// unwraps to fence.ErrMissedEvents.
type missedError struct {
	position, oldest, next uint64
}

func (e *missedError) Error() string {
	msg := fmt.Sprintf("%v: position %d (%s) is not retained by the leader", fence.ErrMissedEvents, e.position, describePosition(e.position))
	if e.next != 0 {
		msg += fmt.Sprintf(", which holds %d to %d (%s to %s)", e.oldest, e.next-1, describePosition(e.oldest), describePosition(e.next-1))
	} else {
		msg += ", which has recorded no events yet"
	}
	return msg + fmt.Sprintf("; it keeps the last %d events of its term only, so events may have been missed: read the current state again (List, or Watch with include_held) and watch from now", RingSize)
}

func (e *missedError) Unwrap() error { return fence.ErrMissedEvents }

// describePosition spells out a position for people.
func describePosition(p uint64) string {
	return fmt.Sprintf("term %d, event %d", p>>termShift, p&(1<<termShift-1))
}

// Recent returns the retained events whose scope starts with prefix,
// oldest first, at most limit of them (the newest).
func (r *Ring) Recent(prefix string, limit int, keep func(Event) bool) []Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []Event
	for p := r.next; p > r.first && len(out) < limit; p-- {
		e := r.buf[(p-1)%uint64(len(r.buf))]
		if strings.HasPrefix(e.Scope, prefix) && (keep == nil || keep(e)) {
			out = append(out, e)
		}
	}
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return out
}

// Close ends every read, now and later.
func (r *Ring) Close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.closed {
		r.closed = true
		close(r.changed)
	}
}

// Holder returns the holder of the lease with this token of scope, as
// the newest retained event of it that names one says (its grant, a
// renewal, its end); "" if none is retained. It reads one event at most:
// guards report rejections of any token, up to a thousand a report.
func (r *Ring) Holder(scope string, token uint64) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.holderLocked(scope, token)
}

func (r *Ring) holderLocked(scope string, token uint64) string {
	p, ok := r.repeats[holderKey(scope, token)]
	if !ok {
		return ""
	}
	r.holderReads++
	return r.buf[p%uint64(len(r.buf))].Holder
}
