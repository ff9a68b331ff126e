package fsm

import (
	"errors"
	"fmt"
	"iter"
	"slices"
	"strings"
	"time"
	"unique"

	"github.com/google/btree"

	"github.com/fence-dev/fence"
)

// recentGrants is how many past grants a scope remembers, so a retried
// acquire returns its own grant instead of a second token, and a renew or
// release with a recently superseded lease ID answers "lost" rather than
// "not holder".
const recentGrants = 4

// Lease is a grant as the state machine records it.
type Lease struct {
	Token     uint64        `json:"token"`
	ID        fence.LeaseID `json:"id"`
	Holder    string        `json:"holder,omitempty"`
	TTL       time.Duration `json:"ttl"`
	RequestID string        `json:"request_id,omitempty"`
	GrantedAt int64         `json:"granted_at,omitempty"` // Unix nanoseconds, from the command
	Owner     string        `json:"owner,omitempty"`      // the authenticated identity that asked, when auth is on
}

// Waiter is an acquire queued behind the current lease.
type Waiter struct {
	ID        fence.LeaseID `json:"id"`
	Holder    string        `json:"holder,omitempty"`
	TTL       time.Duration `json:"ttl"`
	RequestID string        `json:"request_id,omitempty"`
	Owner     string        `json:"owner,omitempty"`
}

// grant remembers a past grant of a scope. Holder is recorded when the
// grant has a request ID, which only a retry by the same holder may present.
type grant struct {
	Token     uint64        `json:"token"`
	ID        fence.LeaseID `json:"id"`
	Holder    string        `json:"holder,omitempty"`
	RequestID string        `json:"request_id,omitempty"`
}

// scope is one scope's record. Under log format 1 it is never deleted: its
// counter must outlive every lease. From format 2 on, a scope with no lease
// and no waiter is idle, and the oldest idle records are dropped once more
// than keepIdle of them are kept; the state's floor then stands in for
// their counters (see State.floor).
type scope struct {
	last  uint64 // the highest token issued; 0 before the first grant
	lease *Lease // nil when free
	// more is nil until the scope has a waiter or a lease of it ends: a
	// million scopes each granted once need neither, and the two slices
	// would more than double what each of them costs.
	more *scopeMore
}

type scopeMore struct {
	waiters []Waiter
	// ended holds the grants that ended, oldest first: with the current
	// lease, if any, the scope's last recentGrants grants. The current
	// lease is not copied here, which a million held scopes would pay for,
	// except as restored from a snapshot written before grants recorded
	// their holder, where its copy is kept as it was (see hasCurrent).
	ended []grant
	// idle is the scope's place in the line of idle records, 0 while it
	// has a lease or a waiter (and always, under format 1). It lives here,
	// not in scope, because a held scope, the common one, needs none.
	idle uint64
}

func (sc *scope) waiters() []Waiter {
	if sc.more == nil {
		return nil
	}
	return sc.more.waiters
}

func (sc *scope) ended() []grant {
	if sc.more == nil {
		return nil
	}
	return sc.more.ended
}

// grow returns sc.more, made if need be, for a change to either slice.
func (sc *scope) grow() *scopeMore {
	if sc.more == nil {
		sc.more = &scopeMore{}
	}
	return sc.more
}

// grantOf is what a scope remembers of l once it has ended.
func grantOf(l *Lease) grant {
	g := grant{Token: l.Token, ID: l.ID, RequestID: l.RequestID}
	if l.RequestID != "" {
		g.Holder = l.Holder // only a retry, by the same holder, looks for it
	}
	return g
}

// hasCurrent reports whether ended already ends with the current lease's
// grant, which only a restored snapshot can make so.
func (sc *scope) hasCurrent() bool {
	ended := sc.ended()
	n := len(ended)
	return sc.lease != nil && n > 0 && ended[n-1].Token == sc.lease.Token
}

// Outcome is what a command or lookup did.
type Outcome uint8

// The outcomes.
const (
	Invalid   Outcome = iota // the command was malformed, or presented another holder's request ID; nothing changed
	Granted                  // Result.Lease is the (possibly earlier, same) grant
	Queued                   // the acquire waits in line; Result.Lease is its future lease, without token
	Held                     // the scope is held; Result.Lease is the holder's lease
	Released                 // Result.Lease was released
	Expired                  // Result.Lease was expired
	Cancelled                // the waiter left the queue
	Lost                     // the lease ID was recently current but is not any more; Result.Current is the current token, 0 if free
	NotHolder                // the lease ID is unknown for this scope
	Exhausted                // the scope's counter reached fence.MaxToken
	NoOp                     // nothing to do (an expire that lost a race, a promote)
)

var outcomeNames = [...]string{"invalid", "granted", "queued", "held", "released", "expired", "cancelled", "lost", "not holder", "exhausted", "no-op"}

func (o Outcome) String() string {
	if int(o) < len(outcomeNames) {
		return outcomeNames[o]
	}
	return fmt.Sprintf("outcome(%d)", o)
}

// EventKind names a lease transition.
type EventKind uint8

// The transitions.
const (
	EventGranted   EventKind = iota + 1 // a new lease began
	EventReleased                       // its holder released it
	EventExpired                        // the leader expired it
	EventCancelled                      // a waiter left the queue ungranted
)

var eventNames = [...]string{"", "granted", "released", "expired", "cancelled"}

func (k EventKind) String() string {
	if int(k) >= len(eventNames) || k == 0 {
		return fmt.Sprintf("EventKind(%d)", k)
	}
	return eventNames[k]
}

// Event is a lease transition caused by applying a command.
type Event struct {
	Kind  EventKind
	Scope string
	Lease Lease // for cancelled: the waiter's would-be lease, token 0
	// Closing is, for released and expired from CloseFormat on, the token
	// value the end of the lease consumed and granted to nobody: the
	// lease's token + 1. A guard whose mark is advanced to it refuses the
	// ended lease's token, and every later grant of the scope is above it.
	// It is 0 below CloseFormat, and when the lease's token was
	// fence.MaxToken, which leaves no value to consume.
	Closing uint64
}

// ErrLineFull is Result.Err of an acquire refused as held because the
// scope's line of waiters is at the command's MaxWaiters.
var ErrLineFull = errors.New("the line of waiters is full")

// Result is what applying a command did.
type Result struct {
	Outcome Outcome
	Scope   string
	Lease   Lease
	Current uint64  // for Lost: the scope's current token, 0 if free
	Err     error   // for Invalid: what was wrong; for Held: ErrLineFull if the line was full
	Events  []Event // transitions, in the order they happened
	// Results are an OpBatch's results, one per command in order; the
	// batch's own Events are theirs, in that order.
	Results []Result
}

// State is the replicated lease state. The zero value is not usable; call
// New. A State is not safe for concurrent use: its owner serialises Apply
// and the queries.
type State struct {
	// format is the cluster's log format, which says how commands apply:
	// 0 and 1 are the first format, 2 drops idle scopes. Only OpSetFormat
	// raises it, never lowers it.
	format int
	scopes map[string]*scope
	// floor is at least every token of every scope whose record was
	// dropped, so a scope created anew starts above it: its tokens stay
	// above every token the scope had before it was forgotten. From
	// FloorFormat on it is also at least the last promote's token floor.
	floor uint64
	// idle orders the idle records, oldest first, by the place each
	// scope took in the line when it became idle (scopeMore.idle); idleSeq
	// is the last place given.
	idle    *btree.BTreeG[idleScope]
	idleSeq uint64
	// keepIdle is how many idle records are kept: Lost answers and
	// request-ID retries need a scope's recent grants for a while after
	// it is freed. Replicas must agree on it, so it is a constant of the
	// format (idleKept); tests lower it to reach the drop often.
	keepIdle int
	nodes    map[string]string // node ID → API address
	removed  map[string]bool   // node IDs removed from the cluster
	keys     []SigningKey      // oldest first; the last one signs
	// held indexes the scopes with a lease in order, so that listing a
	// page costs the page, not a sort of every scope.
	held *btree.BTreeG[string]
}

// idleKept is how many idle scope records a state of log format 2 keeps:
// about a megabyte, and, at ten thousand releases a second, most of a
// second for a client to retry an acquire or release whose answer it
// lost and still get the answer it missed (afterwards: a new grant, or
// NotHolder). Changing it changes what replicas answer, so it needs a new
// log format.
const idleKept = 4096

type idleScope struct {
	seq  uint64
	name string
}

func idleLess(a, b idleScope) bool { return a.seq < b.seq }

// New returns an empty State, of log format 1 until an OpSetFormat raises
// it.
func New() *State {
	return &State{scopes: make(map[string]*scope), nodes: make(map[string]string), removed: make(map[string]bool),
		held: btree.NewOrderedG[string](32), idle: btree.NewG(32, idleLess), keepIdle: idleKept}
}

// Format returns the cluster's log format: 1 until an OpSetFormat raised
// it.
func (s *State) Format() int { return max(s.format, 1) }

// Records returns how many scope records the state keeps: held, with
// waiters, or idle. From log format 2 on it stays within the scopes held
// or waited for plus a few thousand, however many scopes were ever used.
func (s *State) Records() int { return len(s.scopes) }

// Apply applies one command and reports what it did. It is deterministic:
// the same commands in the same order give the same state and results.
func (s *State) Apply(c Command) Result {
	if err := c.Validate(); err != nil {
		return Result{Outcome: Invalid, Scope: c.Scope, Err: err}
	}
	if c.Op == OpBatch {
		return s.batch(c)
	}
	r := s.apply(c)
	for _, e := range r.Events {
		switch e.Kind {
		case EventGranted:
			s.held.ReplaceOrInsert(e.Scope)
		case EventReleased, EventExpired:
			s.held.Delete(e.Scope)
		}
	}
	if s.format >= 2 {
		if c.Scope != "" {
			s.settle(c.Scope)
		}
		for _, e := range r.Events {
			s.settle(e.Scope)
		}
		s.trim()
	}
	return r
}

// batch applies each command as Apply would apply it alone. Below
// BatchFormat it refuses the batch whole: the leader proposes none there,
// and a build that knew no batch halted at it. Below WaitBatchFormat it
// refuses a batch with a waiting acquire whole, as the builds before that
// format did.
func (s *State) batch(c Command) Result {
	if s.Format() < BatchFormat {
		return Result{Outcome: Invalid, Err: &fence.InvalidError{Field: "op",
			Reason: fmt.Sprintf("batch under log format %d, from %d on", s.Format(), BatchFormat)}}
	}
	if s.Format() < WaitBatchFormat {
		for i, b := range c.Commands {
			if b.Wait {
				return Result{Outcome: Invalid, Err: &fence.InvalidError{Field: fmt.Sprintf("commands[%d].wait", i),
					Reason: fmt.Sprintf("a waiting acquire in a batch under log format %d, from %d on", s.Format(), WaitBatchFormat)}}
			}
		}
	}
	r := Result{Outcome: NoOp, Results: make([]Result, len(c.Commands))}
	for i, b := range c.Commands {
		r.Results[i] = s.Apply(b)
		r.Events = append(r.Events, r.Results[i].Events...)
	}
	return r
}

// settle puts the named scope in the line of idle records if it has
// neither lease nor waiter, and takes it out if it has either.
func (s *State) settle(name string) {
	sc := s.scopes[name]
	if sc == nil {
		return
	}
	busy := !sc.droppable()
	switch idle := sc.idleSeq(); {
	case busy && idle != 0:
		s.idle.Delete(idleScope{idle, name})
		sc.more.idle = 0
	case !busy && idle == 0:
		s.queueIdle(name, sc)
	}
}

// queueIdle puts the scope last in the line of idle records.
func (s *State) queueIdle(name string, sc *scope) {
	s.idleSeq++
	sc.grow().idle = s.idleSeq
	s.idle.ReplaceOrInsert(idleScope{s.idleSeq, name})
}

// droppable reports whether the scope's record may be dropped once idle
// long enough: it has no lease and no waiter, and its counter is not at
// the maximum. An exhausted scope's record is kept for good: dropped, it
// would raise the floor to the maximum and leave no token for any scope
// created afterwards, where keeping it costs one record per scope that
// ever issued 2^63-1 tokens.
func (sc *scope) droppable() bool {
	return sc.lease == nil && len(sc.waiters()) == 0 && sc.last < fence.MaxToken
}

// idleSeq returns the scope's place in the line of idle records, 0 if it
// is not in it.
func (sc *scope) idleSeq() uint64 {
	if sc.more == nil {
		return 0
	}
	return sc.more.idle
}

// trim drops the oldest idle records until keepIdle are left, raising the
// floor to their counters first: the floor is what keeps a scope created
// again under a dropped name from reusing a token.
func (s *State) trim() {
	for s.idle.Len() > s.keepIdle {
		old, _ := s.idle.DeleteMin()
		s.floor = max(s.floor, s.scopes[old.name].last)
		delete(s.scopes, old.name)
	}
}

func (s *State) apply(c Command) Result {
	switch c.Op {
	case OpAcquire:
		return s.acquire(c)
	case OpRelease:
		return s.release(c)
	case OpExpire:
		return s.expire(c)
	case OpExpireMany:
		return s.expireMany(c)
	case OpCancel:
		return s.cancel(c)
	case OpSetNode:
		return s.setNode(c)
	case OpForgetNode:
		return s.forgetNode(c)
	case OpAddKey:
		return s.addKey(c)
	case OpSetFormat:
		return s.setFormat(c)
	default: // OpPromote
		return s.promote(c)
	}
}

func (s *State) acquire(c Command) Result {
	sc := s.scopes[c.Scope]
	if sc == nil {
		if s.floor >= fence.MaxToken {
			return Result{Outcome: Exhausted, Scope: c.Scope} // and no record for it
		}
		// New, or dropped and forgotten: every token it may have had is
		// at most the floor.
		sc = &scope{last: s.floor}
		s.scopes[c.Scope] = sc
	}
	if c.RequestID != "" {
		if r, ok := sc.retried(c); ok {
			return r
		}
	}
	if sc.lease != nil {
		if !c.Wait {
			return Result{Outcome: Held, Scope: c.Scope, Lease: *sc.lease}
		}
		if c.MaxWaiters > 0 && len(sc.waiters()) >= c.MaxWaiters {
			return Result{Outcome: Held, Scope: c.Scope, Lease: *sc.lease, Err: ErrLineFull}
		}
		w := newWaiter(c)
		m := sc.grow()
		m.waiters = append(m.waiters, w)
		return Result{Outcome: Queued, Scope: c.Scope, Lease: w.lease()}
	}
	var r Result
	sc.grant(c.Scope, newWaiter(c), c.At, &r)
	return r
}

// newWaiter is the acquire c as a waiter: the lease to grant, or the place
// in line.
func newWaiter(c Command) Waiter {
	return Waiter{ID: c.LeaseID, Holder: intern(c.Holder), TTL: c.TTL, RequestID: c.RequestID, Owner: intern(c.Owner)}
}

// intern returns the one copy of s that every lease shares: holders and
// owners repeat across leases, and each command decoded from the log
// brings its own copy, which a million leases would each keep.
func intern(s string) string {
	if s == "" {
		return s
	}
	return unique.Make(s).Value()
}

// retried answers an acquire whose request ID this scope has seen: the
// same grant, the same place in line, or lost if that grant has ended. A
// request ID is one holder's retry key: presented by another holder (a
// replay, or a collision) it is refused, and nothing changes, so that no one
// obtains the lease ID of another holder's grant by presenting its request
// ID.
func (sc *scope) retried(c Command) (Result, bool) {
	var (
		r      Result
		holder string
	)
	waiters, ended := sc.waiters(), sc.ended()
	switch i := slices.IndexFunc(waiters, func(w Waiter) bool { return w.RequestID == c.RequestID }); {
	case sc.lease != nil && sc.lease.RequestID == c.RequestID:
		r, holder = Result{Outcome: Granted, Scope: c.Scope, Lease: *sc.lease}, sc.lease.Holder
	case i >= 0:
		r, holder = Result{Outcome: Queued, Scope: c.Scope, Lease: waiters[i].lease()}, waiters[i].Holder
	default:
		j := slices.IndexFunc(ended, func(g grant) bool { return g.RequestID == c.RequestID })
		if j < 0 {
			return Result{}, false
		}
		g := ended[j]
		r, holder = Result{Outcome: Lost, Scope: c.Scope, Lease: Lease{Token: g.Token, ID: g.ID}, Current: sc.current()}, g.Holder
	}
	if holder != c.Holder {
		return Result{Outcome: Invalid, Scope: c.Scope, Err: &fence.InvalidError{Field: "request_id",
			Reason: fmt.Sprintf("%q was already used by another holder's acquire of this scope; only that holder may retry with it, every other acquire needs its own request ID", c.RequestID)}}, true
	}
	return r, true
}

// grant makes w the holder with the next token and records the event in r.
func (sc *scope) grant(name string, w Waiter, at int64, r *Result) {
	r.Scope = name
	if sc.last >= fence.MaxToken {
		r.Outcome = Exhausted
		return
	}
	sc.last++
	l := Lease{Token: sc.last, ID: w.ID, Holder: w.Holder, TTL: w.TTL, RequestID: w.RequestID, GrantedAt: at, Owner: w.Owner}
	sc.lease = &l
	if n := len(sc.ended()); n > recentGrants-1 {
		sc.more.ended = slices.Delete(sc.more.ended, 0, n-(recentGrants-1))
	}
	r.Outcome, r.Lease = Granted, l
	r.Events = append(r.Events, Event{Kind: EventGranted, Scope: name, Lease: l})
}

// free ends the current lease with the given event and hands the scope to
// the first waiter, if any. With closing (from CloseFormat on) the end
// consumes the next token value, granted to nobody, so the lease's token
// is closed: a guard advanced to the closing value refuses it, and the
// next grant, a waiter's included, is above it.
func (sc *scope) free(name string, kind EventKind, at int64, closing bool, r *Result) {
	l := *sc.lease
	if !sc.hasCurrent() {
		m := sc.grow()
		m.ended = append(m.ended, grantOf(&l)) // at most recentGrants: held, it kept one fewer
	}
	sc.lease = nil
	e := Event{Kind: kind, Scope: name, Lease: l}
	if closing && sc.last < fence.MaxToken {
		sc.last++
		e.Closing = sc.last
	}
	r.Events = append(r.Events, e)
	if len(sc.waiters()) == 0 {
		return
	}
	next := sc.more.waiters[0]
	sc.more.waiters = slices.Delete(sc.more.waiters, 0, 1)
	var g Result
	sc.grant(name, next, at, &g)
	if g.Outcome == Exhausted {
		// No token is left for anyone: the queue can never be served.
		for _, w := range append([]Waiter{next}, sc.more.waiters...) {
			r.Events = append(r.Events, Event{Kind: EventCancelled, Scope: name, Lease: w.lease()})
		}
		sc.more.waiters = nil
		return
	}
	r.Events = append(r.Events, g.Events...)
}

func (s *State) release(c Command) Result {
	sc := s.scopes[c.Scope]
	if sc == nil {
		return Result{Outcome: NotHolder, Scope: c.Scope}
	}
	if sc.lease == nil || sc.lease.ID != c.LeaseID {
		return sc.notCurrent(c)
	}
	r := Result{Outcome: Released, Scope: c.Scope, Lease: *sc.lease}
	sc.free(c.Scope, EventReleased, c.At, s.Format() >= CloseFormat, &r)
	return r
}

func (s *State) expire(c Command) Result {
	sc := s.scopes[c.Scope]
	if sc == nil || sc.lease == nil || sc.lease.Token != c.Token {
		return Result{Outcome: NoOp, Scope: c.Scope}
	}
	r := Result{Outcome: Expired, Scope: c.Scope, Lease: *sc.lease}
	sc.free(c.Scope, EventExpired, c.At, s.Format() >= CloseFormat, &r)
	return r
}

// expireMany expires each lease in turn, as that many Expire commands
// would; its outcome is Expired if any was, with all their events.
func (s *State) expireMany(c Command) Result {
	r := Result{Outcome: NoOp}
	for _, e := range c.Expiries {
		one := s.expire(Command{Op: OpExpire, Scope: e.Scope, Token: e.Token, At: c.At})
		if one.Outcome == Expired {
			r.Outcome = Expired
		}
		r.Events = append(r.Events, one.Events...)
	}
	return r
}

func (s *State) cancel(c Command) Result {
	sc := s.scopes[c.Scope]
	if sc == nil {
		return Result{Outcome: NoOp, Scope: c.Scope}
	}
	for i, w := range sc.waiters() {
		if w.ID == c.LeaseID {
			sc.more.waiters = slices.Delete(sc.more.waiters, i, i+1)
			l := w.lease()
			return Result{Outcome: Cancelled, Scope: c.Scope, Lease: l,
				Events: []Event{{Kind: EventCancelled, Scope: c.Scope, Lease: l}}}
		}
	}
	if sc.lease != nil && sc.lease.ID == c.LeaseID {
		return s.release(c)
	}
	return Result{Outcome: NoOp, Scope: c.Scope}
}

// setFormat raises the log format. Raising it to 2 puts every free scope
// in the line of idle records, by name, and drops the oldest beyond
// keepIdle, as if each had just become idle.
func (s *State) setFormat(c Command) Result {
	if c.Format <= s.Format() {
		return Result{Outcome: NoOp}
	}
	from := s.Format()
	s.format = c.Format
	if from < 2 {
		for _, name := range s.sortedScopes("") {
			s.settle(name)
		}
		s.trim()
	}
	return Result{Outcome: NoOp}
}

func (s *State) promote(c Command) Result {
	r := Result{Outcome: NoOp}
	floor := uint64(0)
	if s.Format() >= FloorFormat {
		floor = c.Token
		s.floor = max(s.floor, floor)
	}
	// Only the scopes with waiters are sorted, for the events' order: a
	// new leader takes office with up to a million held scopes.
	var names []string
	for name, sc := range s.scopes {
		// A held scope keeps its lease and token; its next grant comes
		// after the floor.
		sc.last = max(sc.last, floor)
		if len(sc.waiters()) > 0 {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	for _, name := range names {
		sc := s.scopes[name]
		for _, w := range sc.waiters() {
			r.Events = append(r.Events, Event{Kind: EventCancelled, Scope: name, Lease: w.lease()})
		}
		if sc.more != nil {
			sc.more.waiters = nil
		}
	}
	return r
}

// notCurrent answers a renew or release whose lease ID is not current.
func (sc *scope) notCurrent(c Command) Result {
	for _, g := range sc.ended() {
		if g.ID == c.LeaseID {
			return Result{Outcome: Lost, Scope: c.Scope, Lease: Lease{Token: g.Token, ID: g.ID}, Current: sc.current()}
		}
	}
	return Result{Outcome: NotHolder, Scope: c.Scope}
}

func (sc *scope) current() uint64 {
	if sc.lease == nil {
		return 0
	}
	return sc.lease.Token
}

func (w Waiter) lease() Lease {
	return Lease{ID: w.ID, Holder: w.Holder, TTL: w.TTL, RequestID: w.RequestID, Owner: w.Owner}
}

// Check reports whether id is the current lease of the scope: Granted with
// the lease, Lost, or NotHolder. Renewals use it; they change no state.
func (s *State) Check(name string, id fence.LeaseID) Result {
	sc := s.scopes[name]
	if sc == nil {
		return Result{Outcome: NotHolder, Scope: name}
	}
	if sc.lease != nil && sc.lease.ID == id {
		return Result{Outcome: Granted, Scope: name, Lease: *sc.lease}
	}
	return sc.notCurrent(Command{Scope: name, LeaseID: id})
}

// ScopeInfo is what a query reports about one scope.
type ScopeInfo struct {
	Scope   string
	Last    uint64 // highest token ever issued; for a scope without a record, the floor (see Get)
	Lease   *Lease // the current lease, nil if free
	Waiters int
}

// Get reports the state of one scope. A scope without a record (never
// acquired, or idle so long that its record was dropped) reports the
// floor as Last: at least every token it was ever granted, and below
// every token it will be, which is what a reader checking tokens against
// Last relies on. Under log format 1 the floor is 0.
func (s *State) Get(name string) ScopeInfo {
	sc := s.scopes[name]
	if sc == nil {
		return ScopeInfo{Scope: name, Last: s.floor}
	}
	return sc.info(name)
}

func (sc *scope) info(name string) ScopeInfo {
	in := ScopeInfo{Scope: name, Last: sc.last, Waiters: len(sc.waiters())}
	if sc.lease != nil {
		l := *sc.lease
		in.Lease = &l
	}
	return in
}

// Held lists the held scopes whose names start with prefix and sort after
// the scope named after, in order, at most limit of them (no limit if
// limit <= 0).
func (s *State) Held(prefix, after string, limit int) []ScopeInfo {
	var out []ScopeInfo
	start := prefix
	if after >= start {
		start = after + "\x00" // the least name after it
	}
	s.held.AscendGreaterOrEqual(start, func(name string) bool {
		if !strings.HasPrefix(name, prefix) {
			return false
		}
		out = append(out, s.scopes[name].info(name))
		return limit <= 0 || len(out) < limit
	})
	return out
}

// HeldCount returns the number of scopes held by a lease.
func (s *State) HeldCount() int { return s.held.Len() }

// Leases yields every current lease, by scope, as a copy. The leader uses
// it to give each held lease a full TTL when it takes office. It builds
// nothing: at a million leases, a map of them all would cost hundreds of
// megabytes.
func (s *State) Leases() iter.Seq2[string, Lease] {
	return func(yield func(string, Lease) bool) {
		for name, sc := range s.scopes {
			if sc.lease != nil && !yield(name, *sc.lease) {
				return
			}
		}
	}
}

func (s *State) sortedScopes(prefix string) []string {
	names := make([]string, 0, len(s.scopes))
	for name := range s.scopes {
		if strings.HasPrefix(name, prefix) {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return names
}
