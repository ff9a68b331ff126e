package fsm

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"pgregory.net/rapid"

	"github.com/fence-dev/fence"
)

// The model: the simplest thing that behaves like a State. Per scope it
// keeps the last token, the holder, the queue, and the last recentGrants
// grants (which answer "lost" to their lease ID and request ID). From log
// format 2 on, it forgets the scopes that have been idle longest beyond
// keep of them, and starts a scope it does not know at the highest token
// of every scope it forgot. The run checks every grant against every
// earlier token of its scope, forgotten or not (run.last).

type mLease struct {
	id    fence.LeaseID
	token uint64
	req   string
}

type mScope struct {
	last   uint64
	holder *mLease
	queue  []mLease
	recent []mLease
}

type model struct {
	scopes map[string]*mScope
	format int
	keep   int
	floor  uint64
	idle   []string // oldest first
}

func newModel(keep int) *model { return &model{scopes: map[string]*mScope{}, format: 1, keep: keep} }

// view is what the model predicts of a Result.
type view struct {
	Outcome Outcome
	Scope   string
	ID      fence.LeaseID
	Token   uint64
	Req     string
	Current uint64
	Events  []evView
}

type evView struct {
	Kind    EventKind
	Scope   string
	ID      fence.LeaseID
	Token   uint64
	Closing uint64
}

func viewOf(r Result) view {
	v := view{Outcome: r.Outcome, Scope: r.Scope, ID: r.Lease.ID, Token: r.Lease.Token, Req: r.Lease.RequestID, Current: r.Current}
	for _, e := range r.Events {
		v.Events = append(v.Events, evView{e.Kind, e.Scope, e.Lease.ID, e.Lease.Token, e.Closing})
	}
	return v
}

func (m *model) apply(c Command) view {
	v := m.applyOne(c)
	if m.format >= 2 && v.Outcome != Invalid {
		m.settle(c.Scope)
		for _, e := range v.Events {
			m.settle(e.Scope)
		}
		m.forget()
	}
	return v
}

// settle puts a scope with no holder and no queue at the end of the idle
// line, and takes a scope with either out of it.
func (m *model) settle(name string) {
	ms := m.scopes[name]
	if ms == nil {
		return
	}
	i := slices.Index(m.idle, name)
	busy := ms.holder != nil || len(ms.queue) > 0 || ms.last == fence.MaxToken // an exhausted scope is never forgotten
	switch {
	case busy && i >= 0:
		m.idle = slices.Delete(m.idle, i, i+1)
	case !busy && i < 0:
		m.idle = append(m.idle, name)
	}
}

func (m *model) forget() {
	for len(m.idle) > m.keep {
		name := m.idle[0]
		m.idle = m.idle[1:]
		m.floor = max(m.floor, m.scopes[name].last)
		delete(m.scopes, name)
	}
}

func (m *model) applyOne(c Command) view {
	if c.Validate() != nil {
		return view{Outcome: Invalid, Scope: c.Scope}
	}
	var v view
	switch c.Op {
	case OpSetFormat:
		if c.Format > m.format {
			if m.format < 2 {
				for _, name := range slices.Sorted(maps.Keys(m.scopes)) {
					m.settle(name)
				}
			}
			m.format = c.Format
		}
		return view{Outcome: NoOp}
	case OpAcquire:
		v = m.acquire(c.Scope, mLease{id: c.LeaseID, req: c.RequestID}, c.Wait)
	case OpRelease:
		v = m.release(c.Scope, c.LeaseID)
	case OpExpire:
		v = m.expire(c.Scope, c.Token)
	case OpExpireMany:
		v = view{Outcome: NoOp}
		for _, e := range c.Expiries {
			one := m.expire(e.Scope, e.Token)
			if one.Outcome == Expired {
				v.Outcome = Expired
			}
			v.Events = append(v.Events, one.Events...)
		}
	case OpCancel:
		v = m.cancel(c.Scope, c.LeaseID)
	case OpPromote:
		return m.promote(c.Token)
	}
	v.Scope = c.Scope
	return v
}

func (m *model) acquire(name string, l mLease, wait bool) view {
	ms := m.scopes[name]
	if ms == nil {
		if m.floor == fence.MaxToken {
			return view{Outcome: Exhausted}
		}
		ms = &mScope{last: m.floor}
		m.scopes[name] = ms
	}
	if l.req != "" {
		if h := ms.holder; h != nil && h.req == l.req {
			return view{Outcome: Granted, ID: h.id, Token: h.token, Req: h.req}
		}
		for _, w := range ms.queue {
			if w.req == l.req {
				return view{Outcome: Queued, ID: w.id, Req: w.req}
			}
		}
		for _, g := range ms.recent {
			if g.req == l.req {
				return view{Outcome: Lost, ID: g.id, Token: g.token, Current: ms.current()}
			}
		}
	}
	if h := ms.holder; h != nil {
		if !wait {
			return view{Outcome: Held, ID: h.id, Token: h.token, Req: h.req}
		}
		ms.queue = append(ms.queue, l)
		return view{Outcome: Queued, ID: l.id, Req: l.req}
	}
	var evs []evView
	if !ms.grant(name, l, &evs) {
		return view{Outcome: Exhausted}
	}
	return view{Outcome: Granted, ID: l.id, Token: ms.last, Req: l.req, Events: evs}
}

func (ms *mScope) grant(name string, l mLease, evs *[]evView) bool {
	if ms.last == fence.MaxToken {
		return false
	}
	ms.last++
	l.token = ms.last
	ms.holder = &l
	ms.recent = append(ms.recent, l)
	if len(ms.recent) > recentGrants {
		ms.recent = ms.recent[1:]
	}
	*evs = append(*evs, evView{EventGranted, name, l.id, l.token, 0})
	return true
}

// free ends the holder's lease; from CloseFormat on (closing) the end
// takes the next token, unless none is left.
func (ms *mScope) free(name string, kind EventKind, closing bool, evs *[]evView) {
	e := evView{kind, name, ms.holder.id, ms.holder.token, 0}
	if closing && ms.last < fence.MaxToken {
		ms.last++
		e.Closing = ms.last
	}
	*evs = append(*evs, e)
	ms.holder = nil
	if len(ms.queue) == 0 {
		return
	}
	next := ms.queue[0]
	ms.queue = ms.queue[1:]
	if !ms.grant(name, next, evs) {
		for _, w := range append([]mLease{next}, ms.queue...) {
			*evs = append(*evs, evView{EventCancelled, name, w.id, 0, 0})
		}
		ms.queue = nil
	}
}

func (ms *mScope) current() uint64 {
	if ms.holder == nil {
		return 0
	}
	return ms.holder.token
}

func (ms *mScope) notCurrent(id fence.LeaseID) view {
	for _, g := range ms.recent {
		if g.id == id {
			return view{Outcome: Lost, ID: g.id, Token: g.token, Current: ms.current()}
		}
	}
	return view{Outcome: NotHolder}
}

func (m *model) release(name string, id fence.LeaseID) view {
	ms := m.scopes[name]
	if ms == nil {
		return view{Outcome: NotHolder}
	}
	h := ms.holder
	if h == nil || h.id != id {
		return ms.notCurrent(id)
	}
	v := view{Outcome: Released, ID: h.id, Token: h.token, Req: h.req}
	ms.free(name, EventReleased, m.format >= CloseFormat, &v.Events)
	return v
}

func (m *model) expire(name string, token uint64) view {
	ms := m.scopes[name]
	if ms == nil || ms.holder == nil || ms.holder.token != token {
		return view{Outcome: NoOp}
	}
	h := ms.holder
	v := view{Outcome: Expired, ID: h.id, Token: h.token, Req: h.req}
	ms.free(name, EventExpired, m.format >= CloseFormat, &v.Events)
	return v
}

func (m *model) cancel(name string, id fence.LeaseID) view {
	ms := m.scopes[name]
	if ms == nil {
		return view{Outcome: NoOp}
	}
	if i := slices.IndexFunc(ms.queue, func(w mLease) bool { return w.id == id }); i >= 0 {
		w := ms.queue[i]
		ms.queue = slices.Delete(ms.queue, i, i+1)
		return view{Outcome: Cancelled, ID: w.id, Req: w.req, Events: []evView{{EventCancelled, name, w.id, 0, 0}}}
	}
	if ms.holder != nil && ms.holder.id == id {
		return m.release(name, id)
	}
	return view{Outcome: NoOp}
}

// promote drops every queue and, from FloorFormat on, raises every
// counter and the floor to the promote's token floor.
func (m *model) promote(floor uint64) view {
	v := view{Outcome: NoOp}
	if m.format < FloorFormat {
		floor = 0
	}
	m.floor = max(m.floor, floor)
	names := make([]string, 0, len(m.scopes))
	for name, ms := range m.scopes {
		ms.last = max(ms.last, floor)
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		for _, w := range m.scopes[name].queue {
			v.Events = append(v.Events, evView{EventCancelled, name, w.id, 0, 0})
		}
		m.scopes[name].queue = nil
	}
	return v
}

func (m *model) check(name string, id fence.LeaseID) view {
	v := view{Outcome: NotHolder}
	if ms := m.scopes[name]; ms != nil {
		if h := ms.holder; h != nil && h.id == id {
			v = view{Outcome: Granted, ID: h.id, Token: h.token, Req: h.req}
		} else {
			v = ms.notCurrent(id)
		}
	}
	v.Scope = name
	return v
}

// run is one random run: the state under test, a twin that is never
// restored from a snapshot, the model, and what the run has seen.
type run struct {
	s, twin *State
	m       *model
	scopes  []string
	ids     []fence.LeaseID            // every lease ID a command carried
	granted map[string][]fence.LeaseID // per scope, every lease ID granted
	tokenOf map[fence.LeaseID]uint64   // the token each lease ID was granted with
	last    map[string]uint64          // per scope, the last granted or closing token seen in events
	closed  map[string]map[uint64]bool // per scope, every closing token seen in events
	holder  map[string]fence.LeaseID   // per scope, the holder according to the events
	seen    map[Outcome]int            // outcomes of every run, to check the runs reach them all
}

func (r *run) newID() fence.LeaseID {
	n := len(r.ids) + 1
	id := fence.LeaseID{0: 0xa0, 14: byte(n >> 8), 15: byte(n)}
	r.ids = append(r.ids, id)
	return id
}

// pickID draws the lease ID of a release, cancel or check: the current
// one, a waiter's, an old grant's, any seen so far, or a new one.
func (r *run) pickID(t *rapid.T, name string) fence.LeaseID {
	var choices []fence.LeaseID
	if ms := r.m.scopes[name]; ms != nil {
		if ms.holder != nil {
			choices = append(choices, ms.holder.id, ms.holder.id) // twice: the common case
		}
		for _, w := range ms.queue {
			choices = append(choices, w.id)
		}
	}
	if g := r.granted[name]; len(g) > 0 {
		choices = append(choices, rapid.SampledFrom(g).Draw(t, "old"))
	}
	if len(r.ids) > 0 {
		choices = append(choices, rapid.SampledFrom(r.ids).Draw(t, "seen"))
	}
	if len(choices) == 0 || rapid.IntRange(0, 9).Draw(t, "fresh") == 0 {
		return r.newID()
	}
	return rapid.SampledFrom(choices).Draw(t, "id")
}

func (r *run) drawCommand(t *rapid.T) Command {
	name := rapid.SampledFrom(r.scopes).Draw(t, "scope")
	switch rapid.IntRange(0, 10).Draw(t, "op") {
	case 0, 1, 2:
		return Command{Op: OpAcquire, Scope: name, LeaseID: r.newID(), TTL: time.Second,
			Wait: rapid.Bool().Draw(t, "wait"), RequestID: rapid.SampledFrom([]string{"", "", "r1", "r2", "r3"}).Draw(t, "request")}
	case 3, 4:
		return Command{Op: OpRelease, Scope: name, LeaseID: r.pickID(t, name)}
	case 5, 6:
		return Command{Op: opCheck, Scope: name, LeaseID: r.pickID(t, name)}
	case 7:
		var last, cur uint64
		if ms := r.m.scopes[name]; ms != nil {
			last, cur = ms.last, ms.current()
		}
		if rapid.IntRange(0, 3).Draw(t, "expire many") == 0 {
			// Current and stale tokens of several scopes, a scope maybe
			// twice, as the leader's expiry loop would batch them.
			var es []Expiry
			for range rapid.IntRange(1, 5).Draw(t, "expiries") {
				name := rapid.SampledFrom(r.scopes).Draw(t, "expiry scope")
				var last uint64
				if ms := r.m.scopes[name]; ms != nil {
					last = ms.last
				}
				es = append(es, Expiry{Scope: name, Token: rapid.Uint64Range(1, last+1).Draw(t, "expiry token")})
			}
			return Command{Op: OpExpireMany, Expiries: es}
		}
		if cur != 0 && rapid.Bool().Draw(t, "current token") {
			return Command{Op: OpExpire, Scope: name, Token: cur}
		}
		return Command{Op: OpExpire, Scope: name, Token: rapid.Uint64Range(1, last+2).Draw(t, "token")}
	case 8:
		if ms := r.m.scopes[name]; ms != nil && len(ms.queue) > 0 && rapid.Bool().Draw(t, "cancel a waiter") {
			return Command{Op: OpCancel, Scope: name, LeaseID: rapid.SampledFrom(ms.queue).Draw(t, "waiter").id}
		}
		return Command{Op: OpCancel, Scope: name, LeaseID: r.pickID(t, name)}
	case 9:
		if rapid.IntRange(0, 3).Draw(t, "set format") == 0 {
			return Command{Op: OpSetFormat, Format: rapid.IntRange(1, LogFormat).Draw(t, "format")}
		}
		// A token floor near the tokens the run issues, or none.
		return Command{Op: OpPromote, Token: rapid.SampledFrom([]uint64{0, 0, 3, 20, 1 << 40}).Draw(t, "token floor")}
	default:
		return rapid.SampledFrom([]Command{
			{Op: OpAcquire, Scope: name + "/", LeaseID: r.newID(), TTL: time.Second},
			{Op: OpAcquire, Scope: name, LeaseID: r.newID()},
			{Op: OpAcquire, Scope: name, TTL: time.Second},
			{Op: OpAcquire, Scope: name, LeaseID: r.newID(), TTL: time.Second, RequestID: string(make([]byte, MaxRequestIDLen+1))},
			{Op: OpRelease, Scope: name},
			{Op: OpExpire, Scope: name},
			{Op: OpExpireMany},
			{Op: OpPromote, Token: fence.MaxToken},
			{Op: OpExpireMany, Expiries: []Expiry{{Scope: name, Token: 1}, {Scope: name}}},
			{Op: "renew", Scope: name},
		}).Draw(t, "invalid")
	}
}

// step applies c to the state, its twin and the model, and checks them.
func (r *run) step(t *rapid.T, i int, c Command) {
	before := r.s.Snapshot()
	var got, twin Result
	var want view
	if c.Op == opCheck {
		got, twin, want = r.s.Check(c.Scope, c.LeaseID), r.twin.Check(c.Scope, c.LeaseID), r.m.check(c.Scope, c.LeaseID)
	} else {
		got, twin, want = r.s.Apply(c), r.twin.Apply(c), r.m.apply(c)
	}
	r.seen[got.Outcome]++
	if diff := cmp.Diff(want, viewOf(got)); diff != "" {
		t.Fatalf("step %d: %+v: result (-model +state):\n%s", i, c, diff)
	}
	if diff := diffResults(twin, got); diff != "" {
		t.Fatalf("step %d: %+v: the restored state answers differently (-twin +state):\n%s", i, c, diff)
	}
	if len(got.Events) == 0 && got.Outcome != Queued && c.Op != OpSetFormat && c.Op != OpPromote && !bytes.Equal(before, r.s.Snapshot()) {
		t.Fatalf("step %d: %+v: %v with no event changed the state", i, c, got.Outcome)
	}
	// Invariant 3: renew (check) and release succeed only for the
	// current lease ID.
	if (got.Outcome == Released && c.Op == OpRelease) || (got.Outcome == Granted && c.Op == opCheck) {
		if l := r.holder[c.Scope]; got.Lease.ID != l || c.LeaseID != l {
			t.Fatalf("step %d: %s of %s succeeded, but the current lease is %s", i, c.Op, c.LeaseID, l)
		}
	}
	for _, e := range got.Events {
		r.event(t, i, e)
	}
}

// event checks one transition against what the run has seen so far.
func (r *run) event(t *rapid.T, i int, e Event) {
	switch e.Kind {
	case EventGranted:
		// Invariant 1: per scope, the tokens of successive grants
		// strictly increase, so no token is issued twice. Invariant 9:
		// a closing token is never granted, and every grant is above
		// every closing of its scope (r.last counts them).
		if e.Lease.Token <= r.last[e.Scope] {
			t.Fatalf("step %d: %s granted token %d after token %d", i, e.Scope, e.Lease.Token, r.last[e.Scope])
		}
		if r.closed[e.Scope][e.Lease.Token] {
			t.Fatalf("step %d: %s granted token %d, which closed a lease", i, e.Scope, e.Lease.Token)
		}
		if e.Closing != 0 {
			t.Fatalf("step %d: %s granted with closing token %d", i, e.Scope, e.Closing)
		}
		if e.Lease.Token > fence.MaxToken {
			t.Fatalf("step %d: %s granted token %d, above the maximum", i, e.Scope, e.Lease.Token)
		}
		// At most one lease per scope.
		if h := r.holder[e.Scope]; !h.IsZero() {
			t.Fatalf("step %d: %s granted to %s while %s holds it", i, e.Scope, e.Lease.ID, h)
		}
		r.last[e.Scope] = e.Lease.Token
		r.holder[e.Scope] = e.Lease.ID
		r.tokenOf[e.Lease.ID] = e.Lease.Token
		r.granted[e.Scope] = append(r.granted[e.Scope], e.Lease.ID)
	case EventReleased, EventExpired:
		if h := r.holder[e.Scope]; h != e.Lease.ID || r.tokenOf[h] != e.Lease.Token {
			t.Fatalf("step %d: %s %v lease %s/%d, but the holder is %s/%d", i, e.Scope, e.Kind, e.Lease.ID, e.Lease.Token, h, r.tokenOf[h])
		}
		delete(r.holder, e.Scope)
		// Invariant 9: from CloseFormat on, the end of a lease of token
		// N closes it with the scope's next token value (N+1, or above a
		// token floor a promote set meanwhile), above every token of the
		// scope before, unless no value is left; below it, nothing is
		// closed. The model checks the value itself.
		switch {
		case r.s.Format() < CloseFormat:
			if e.Closing != 0 {
				t.Fatalf("step %d: %s %v token %d closing %d under format %d", i, e.Scope, e.Kind, e.Lease.Token, e.Closing, r.s.Format())
			}
		case e.Closing == 0:
			if ms := r.m.scopes[e.Scope]; ms == nil || ms.last != fence.MaxToken {
				t.Fatalf("step %d: %s %v token %d closed nothing under format %d with tokens left", i, e.Scope, e.Kind, e.Lease.Token, r.s.Format())
			}
		case e.Closing <= e.Lease.Token || e.Closing <= r.last[e.Scope]:
			t.Fatalf("step %d: %s %v token %d closing %d, after token %d", i, e.Scope, e.Kind, e.Lease.Token, e.Closing, r.last[e.Scope])
		default:
			r.last[e.Scope] = e.Closing
			if r.closed[e.Scope] == nil {
				r.closed[e.Scope] = map[uint64]bool{}
			}
			r.closed[e.Scope][e.Closing] = true
		}
	case EventCancelled:
		if e.Closing != 0 {
			t.Fatalf("step %d: a cancelled waiter closes token %d", i, e.Closing)
		}
		if e.Lease.Token != 0 {
			t.Fatalf("step %d: a cancelled waiter has token %d", i, e.Lease.Token)
		}
	default:
		t.Fatalf("step %d: event kind %d", i, e.Kind)
	}
}

// compare checks the whole state against the model and the invariants.
func (r *run) compare(t *rapid.T, i int) {
	held := 0
	for _, ms := range r.m.scopes {
		if ms.holder != nil {
			held++
		}
	}
	if r.s.HeldCount() != held || r.twin.HeldCount() != held || len(maps.Collect(r.s.Leases())) != held {
		t.Fatalf("step %d: HeldCount() = %d (twin %d), Leases() has %d, the model holds %d", i, r.s.HeldCount(), r.twin.HeldCount(), len(maps.Collect(r.s.Leases())), held)
	}
	// Held pages through the held scopes in order, from its index.
	prefix := rapid.SampledFrom([]string{"", "a", "b", "a/", "c"}).Draw(t, "held prefix")
	after := rapid.SampledFrom(append([]string{"", "zz"}, r.scopes...)).Draw(t, "held after")
	limit := rapid.IntRange(0, 3).Draw(t, "held limit")
	var want []string
	for _, name := range slices.Sorted(maps.Keys(r.m.scopes)) {
		if r.m.scopes[name].holder != nil && strings.HasPrefix(name, prefix) && name > after && (limit == 0 || len(want) < limit) {
			want = append(want, name)
		}
	}
	for _, st := range []*State{r.s, r.twin} {
		var got []string
		for _, in := range st.Held(prefix, after, limit) {
			got = append(got, in.Scope)
		}
		if !slices.Equal(got, want) {
			t.Fatalf("step %d: Held(%q, %q, %d) = %q, want %q", i, prefix, after, limit, got, want)
		}
	}
	for _, name := range r.scopes {
		in, ms := r.s.Get(name), r.m.scopes[name]
		if ms == nil {
			ms = &mScope{last: r.m.floor}
		}
		// Last is never below a token the scope was granted or closed,
		// forgotten or not.
		if in.Last < r.last[name] {
			t.Fatalf("step %d: %s reports last %d, below its granted or closing token %d", i, name, in.Last, r.last[name])
		}
		if in.Last != ms.last || in.Waiters != len(ms.queue) || (in.Lease == nil) != (ms.holder == nil) {
			t.Fatalf("step %d: %s = %+v, model last %d, %d waiters, holder %v", i, name, in, ms.last, len(ms.queue), ms.holder)
		}
		// Waiters only on held scopes.
		if in.Waiters > 0 && in.Lease == nil {
			t.Fatalf("step %d: %s has %d waiters and no holder", i, name, in.Waiters)
		}
		if in.Lease != nil {
			// Invariant 2: renewing (Check) the current lease answers
			// the token it was granted with.
			id := in.Lease.ID
			if in.Lease.Token != r.tokenOf[id] || id != r.holder[name] {
				t.Fatalf("step %d: %s is held by %s/%d, granted as %s/%d", i, name, id, in.Lease.Token, r.holder[name], r.tokenOf[id])
			}
			if c := r.s.Check(name, id); c.Outcome != Granted || c.Lease.Token != r.tokenOf[id] {
				t.Fatalf("step %d: Check of the current lease of %s = %v with token %d, want granted with token %d",
					i, name, c.Outcome, c.Lease.Token, r.tokenOf[id])
			}
		}
		// Invariant 3: only the current lease ID checks out; every
		// other answers lost or not holder, as the model says.
		for _, id := range r.granted[name] {
			if diff := cmp.Diff(r.m.check(name, id), viewOf(r.s.Check(name, id))); diff != "" {
				t.Fatalf("step %d: Check(%s, %s) (-model +state):\n%s", i, name, id, diff)
			}
		}
	}
}

// TestApplyMatchesModel applies random commands to a State and to the model,
// step by step, and checks that they agree and that the invariants hold.
// At random points the state is replaced by its own snapshot, restored; a
// twin that is never restored must keep answering alike.
func TestApplyMatchesModel(t *testing.T) {
	seen := map[Outcome]int{}
	rapid.Check(t, func(t *rapid.T) {
		// Few idle records kept, so that scopes are forgotten and
		// created again often.
		keep := rapid.IntRange(0, 2).Draw(t, "idle records kept")
		r := &run{
			s: New(), twin: New(), m: newModel(keep), scopes: []string{"a", "b/1", "c"},
			granted: map[string][]fence.LeaseID{}, tokenOf: map[fence.LeaseID]uint64{},
			last: map[string]uint64{}, holder: map[string]fence.LeaseID{}, seen: seen, closed: map[string]map[uint64]bool{},
		}
		if rapid.Bool().Draw(t, "near the maximum token") {
			left := rapid.Uint64Range(0, 3).Draw(t, "tokens left")
			snap := frame(fmt.Sprintf(`{"scopes":[{"scope":"c","last":%d}]}`, fence.MaxToken-left))
			var err error
			if r.s, err = Restore(snap); err != nil {
				t.Fatal(err)
			}
			r.twin, _ = Restore(snap)
			r.m.scopes["c"] = &mScope{last: fence.MaxToken - left}
			r.last["c"] = fence.MaxToken - left
		}
		r.s.keepIdle, r.twin.keepIdle = keep, keep
		if rapid.Bool().Draw(t, "format 2 from the start") {
			r.step(t, -1, Command{Op: OpSetFormat, Format: 2})
		}
		// States frozen along the way must encode, at the end, as they
		// were when frozen: Raft encodes while commands go on.
		type frozen struct {
			step int
			f    *Frozen
			want []byte
		}
		var frozens []frozen
		for i := range rapid.IntRange(1, 150).Draw(t, "steps") {
			r.step(t, i, r.drawCommand(t))
			r.compare(t, i)
			if rapid.IntRange(0, 4).Draw(t, "freeze") == 0 {
				frozens = append(frozens, frozen{i, r.s.Freeze(), r.s.Snapshot()})
			}
			if rapid.IntRange(0, 9).Draw(t, "restore") == 0 {
				snap := r.s.Snapshot()
				restored, err := Restore(snap)
				if err != nil {
					t.Fatalf("step %d: restore: %v", i, err)
				}
				if again := restored.Snapshot(); !bytes.Equal(again, snap) {
					t.Fatalf("step %d: Snapshot→Restore→Snapshot changed the bytes:\n%s\n%s", i, snap, again)
				}
				if !bytes.Equal(snap, r.twin.Snapshot()) {
					t.Fatalf("step %d: the state and its twin differ", i)
				}
				restored.keepIdle = keep
				r.s = restored
			}
		}
		if !bytes.Equal(r.s.Snapshot(), r.twin.Snapshot()) {
			t.Fatal("at the end, the state and its twin differ")
		}
		for _, fz := range frozens {
			var b bytes.Buffer
			if _, err := fz.f.WriteTo(&b); err != nil {
				t.Fatal(err)
			}
			if got := b.Bytes(); !bytes.Equal(got, fz.want) {
				t.Fatalf("the state frozen at step %d encodes as\n%s\nbut was\n%s", fz.step, got, fz.want)
			}
			// Streamed one scope at a time, the body is still the bytes
			// of json.Marshal, the format's definition, once each scope's
			// current lease has joined its recent grants.
			full := snapshotBody{Scopes: []snapshotScope{}, Nodes: fz.f.nodes, Removed: fz.f.removed, Keys: fz.f.keys,
				Format: fz.f.format, Floor: fz.f.floor, Idle: fz.f.idle}
			for i := range fz.f.scopes {
				sc := fz.f.scopes[i].record()
				sc.complete(nil)
				full.Scopes = append(full.Scopes, sc)
			}
			whole, err := json.Marshal(full)
			if _, body, _ := bytes.Cut(b.Bytes(), []byte("\n")); err != nil || !bytes.Equal(body, whole) {
				t.Fatalf("the streamed body\n%s\nis not json.Marshal's\n%s (%v)", body, whole, err)
			}
		}
	})
	// A property test whose runs never reach an outcome proves nothing
	// about it.
	if !t.Failed() {
		for o := range Outcome(len(outcomeNames)) {
			if seen[o] == 0 {
				t.Errorf("no run reached the outcome %v", o)
			}
		}
		t.Logf("outcomes over all runs: %v", seen)
	}
}
