package fsm

import (
	"bytes"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/fence-dev/fence"
)

// id returns a fixed lease ID for tests: id(1) != id(2).
func id(n byte) fence.LeaseID { return fence.LeaseID{15: n} }

func acq(scope string, lease byte, opts ...func(*Command)) Command {
	c := Command{Op: OpAcquire, Scope: scope, LeaseID: id(lease), Holder: "h" + string('0'+lease), TTL: time.Second, At: 1}
	for _, o := range opts {
		o(&c)
	}
	return c
}

func wait(c *Command)                  { c.Wait = true }
func req(r string) func(*Command)      { return func(c *Command) { c.RequestID = r } }
func rel(scope string, l byte) Command { return Command{Op: OpRelease, Scope: scope, LeaseID: id(l)} }
func exp(scope string, tok uint64) Command {
	return Command{Op: OpExpire, Scope: scope, Token: tok}
}
func cancelCmd(scope string, l byte) Command {
	return Command{Op: OpCancel, Scope: scope, LeaseID: id(l)}
}

// step is one command and what it must do.
type step struct {
	cmd     Command
	outcome Outcome
	token   uint64      // Result.Lease.Token, when checked
	events  []EventKind // kinds of Result.Events, in order
	evToken []uint64    // tokens of the events, when checked
}

func run(t *testing.T, steps []step) *State {
	t.Helper()
	s := New()
	for i, st := range steps {
		r := s.Apply(st.cmd)
		if r.Outcome != st.outcome {
			t.Fatalf("step %d %s %s: outcome %v, want %v (err %v)", i, st.cmd.Op, st.cmd.Scope, r.Outcome, st.outcome, r.Err)
		}
		if st.token != 0 && r.Lease.Token != st.token {
			t.Fatalf("step %d: token %d, want %d", i, r.Lease.Token, st.token)
		}
		var kinds []EventKind
		var toks []uint64
		for _, e := range r.Events {
			kinds = append(kinds, e.Kind)
			toks = append(toks, e.Lease.Token)
		}
		if diff := cmp.Diff(st.events, kinds); diff != "" {
			t.Fatalf("step %d: events (-want +got):\n%s", i, diff)
		}
		if st.evToken != nil {
			if diff := cmp.Diff(st.evToken, toks); diff != "" {
				t.Fatalf("step %d: event tokens (-want +got):\n%s", i, diff)
			}
		}
	}
	return s
}

var (
	granted   = []EventKind{EventGranted}
	released  = []EventKind{EventReleased}
	handOff   = []EventKind{EventReleased, EventGranted}
	expireOff = []EventKind{EventExpired, EventGranted}
)

func TestAcquireReleaseTokensIncrease(t *testing.T) {
	s := run(t, []step{
		{cmd: acq("a", 1), outcome: Granted, token: 1, events: granted},
		{cmd: acq("a", 2), outcome: Held, token: 1},
		{cmd: rel("a", 2), outcome: NotHolder},
		{cmd: rel("a", 1), outcome: Released, token: 1, events: released},
		{cmd: rel("a", 1), outcome: Lost},
		{cmd: acq("a", 2), outcome: Granted, token: 2, events: granted},
		{cmd: acq("b", 3), outcome: Granted, token: 1, events: granted}, // tokens are per scope
		{cmd: exp("a", 1), outcome: NoOp},                               // a stale expire changes nothing
		{cmd: exp("a", 2), outcome: Expired, token: 2, events: []EventKind{EventExpired}},
		{cmd: acq("a", 4), outcome: Granted, token: 3, events: granted},
	})
	if got := s.Get("a"); got.Last != 3 || got.Lease == nil || got.Lease.ID != id(4) {
		t.Fatalf("a = %+v", got)
	}
	if got := s.Get("never"); got.Last != 0 || got.Lease != nil {
		t.Fatalf("unknown scope = %+v", got)
	}
}

func TestWaitersAreServedInOrder(t *testing.T) {
	run(t, []step{
		{cmd: acq("a", 1), outcome: Granted, token: 1, events: granted},
		{cmd: acq("a", 2, wait), outcome: Queued},
		{cmd: acq("a", 3, wait), outcome: Queued},
		{cmd: acq("a", 4), outcome: Held, token: 1},
		{cmd: rel("a", 1), outcome: Released, events: handOff, evToken: []uint64{1, 2}},
		{cmd: rel("a", 3), outcome: NotHolder}, // 3 waits; it does not hold
		{cmd: exp("a", 2), outcome: Expired, events: expireOff, evToken: []uint64{2, 3}},
		{cmd: rel("a", 3), outcome: Released, events: released},
		{cmd: acq("a", 5), outcome: Granted, token: 4, events: granted},
	})
}

func TestCancel(t *testing.T) {
	run(t, []step{
		{cmd: acq("a", 1), outcome: Granted, events: granted},
		{cmd: acq("a", 2, wait), outcome: Queued},
		{cmd: acq("a", 3, wait), outcome: Queued},
		{cmd: cancelCmd("a", 2), outcome: Cancelled, events: []EventKind{EventCancelled}},
		{cmd: rel("a", 1), outcome: Released, events: handOff, evToken: []uint64{1, 2}},
		// 3 was granted before its cancel arrived: the cancel releases it.
		{cmd: cancelCmd("a", 3), outcome: Released, events: released},
		{cmd: cancelCmd("a", 3), outcome: NoOp},
		{cmd: cancelCmd("nope", 3), outcome: NoOp},
	})
}

func TestPromoteDropsWaitersInScopeOrder(t *testing.T) {
	s := New()
	for _, c := range []Command{acq("b", 1), acq("b", 2, wait), acq("a", 3), acq("a", 4, wait), acq("a", 5, wait)} {
		s.Apply(c)
	}
	r := s.Apply(Command{Op: OpPromote})
	var got []string
	for _, e := range r.Events {
		if e.Kind != EventCancelled {
			t.Fatalf("promote event %v", e.Kind)
		}
		got = append(got, e.Scope+":"+e.Lease.ID.String()[30:])
	}
	want := []string{"a:04", "a:05", "b:02"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("cancelled waiters (-want +got):\n%s", diff)
	}
	if s.Get("a").Waiters != 0 || s.Get("a").Lease == nil {
		t.Fatalf("after promote a = %+v, want held with no waiters", s.Get("a"))
	}
}

func TestRequestIDIsIdempotent(t *testing.T) {
	run(t, []step{
		{cmd: acq("a", 1, req("r1")), outcome: Granted, token: 1, events: granted},
		// A retry carries a fresh lease ID from its proposer but the same
		// request ID: the same grant, no event, no new token.
		{cmd: acq("a", 9, req("r1")), outcome: Granted, token: 1},
		{cmd: acq("a", 2, wait, req("r2")), outcome: Queued},
		{cmd: acq("a", 8, wait, req("r2")), outcome: Queued},
		{cmd: rel("a", 1), outcome: Released, events: handOff, evToken: []uint64{1, 2}},
		{cmd: acq("a", 7, req("r2")), outcome: Granted, token: 2},
		{cmd: rel("a", 2), outcome: Released, events: released},
		// The grant of r1 and r2 ended: a retry is told so, never given a
		// second token.
		{cmd: acq("a", 6, req("r1")), outcome: Lost, token: 1},
		{cmd: acq("a", 6, req("r2")), outcome: Lost, token: 2},
		{cmd: acq("a", 6, req("r3")), outcome: Granted, token: 3, events: granted},
	})
}

func TestCheck(t *testing.T) {
	s := run(t, []step{
		{cmd: acq("a", 1), outcome: Granted, events: granted},
		{cmd: rel("a", 1), outcome: Released, events: released},
		{cmd: acq("a", 2), outcome: Granted, events: granted},
	})
	if r := s.Check("a", id(2)); r.Outcome != Granted || r.Lease.Token != 2 {
		t.Fatalf("check current = %v token %d", r.Outcome, r.Lease.Token)
	}
	if r := s.Check("a", id(1)); r.Outcome != Lost || r.Current != 2 || r.Lease.Token != 1 {
		t.Fatalf("check superseded = %+v", r)
	}
	if r := s.Check("a", id(3)); r.Outcome != NotHolder {
		t.Fatalf("check unknown = %v", r.Outcome)
	}
	if r := s.Check("b", id(1)); r.Outcome != NotHolder {
		t.Fatalf("check other scope = %v", r.Outcome)
	}
}

func TestInvalidCommandsChangeNothing(t *testing.T) {
	s := New()
	s.Apply(acq("a", 1))
	before := s.Snapshot()
	long := string(bytes.Repeat([]byte("x"), 257))
	for name, c := range map[string]Command{
		"empty scope":     acq("", 2),
		"long scope":      acq(long, 2),
		"dot-dot":         acq("../a", 2),
		"nul":             acq("a\x00b", 2),
		"zero ttl":        acq("b", 2, func(c *Command) { c.TTL = 0 }),
		"negative ttl":    acq("b", 2, func(c *Command) { c.TTL = -time.Second }),
		"no lease id":     acq("b", 0),
		"long request id": acq("b", 2, req(string(bytes.Repeat([]byte("r"), MaxRequestIDLen+1)))),
		"long holder":     acq("b", 2, func(c *Command) { c.Holder = long }),
		"release no id":   {Op: OpRelease, Scope: "a"},
		"expire no token": {Op: OpExpire, Scope: "a"},
		"unknown op":      {Op: "steal", Scope: "a"},
	} {
		r := s.Apply(c)
		if r.Outcome != Invalid || r.Err == nil {
			t.Errorf("%s: outcome %v err %v, want invalid", name, r.Outcome, r.Err)
		}
		if !bytes.Equal(s.Snapshot(), before) {
			t.Fatalf("%s: state changed", name)
		}
	}
}

func TestExhaustedCounterRefusesRatherThanWraps(t *testing.T) {
	s := New()
	s.scopes["a"] = &scope{last: fence.MaxToken - 1}
	run := func(c Command) Result { return s.Apply(c) }
	if r := run(acq("a", 1)); r.Outcome != Granted || r.Lease.Token != fence.MaxToken {
		t.Fatalf("last grant = %v token %d", r.Outcome, r.Lease.Token)
	}
	run(acq("a", 2, wait))
	r := run(rel("a", 1))
	if r.Outcome != Released || len(r.Events) != 2 || r.Events[1].Kind != EventCancelled {
		t.Fatalf("release with an unservable waiter = %+v", r)
	}
	if r := run(acq("a", 3)); r.Outcome != Exhausted {
		t.Fatalf("acquire past the maximum = %v, want exhausted", r.Outcome)
	}
	if got := s.Get("a"); got.Last != fence.MaxToken || got.Lease != nil || got.Waiters != 0 {
		t.Fatalf("a = %+v", got)
	}
}

func TestHeldListsInOrderWithPaging(t *testing.T) {
	s := New()
	for i, name := range []string{"b/2", "a", "b/1", "c", "b/3"} {
		s.Apply(acq(name, byte(i+1)))
	}
	s.Apply(rel("c", 4))
	names := func(in []ScopeInfo) []string {
		var out []string
		for _, x := range in {
			out = append(out, x.Scope)
		}
		return out
	}
	if diff := cmp.Diff([]string{"a", "b/1", "b/2", "b/3"}, names(s.Held("", "", 0))); diff != "" {
		t.Fatal(diff)
	}
	if diff := cmp.Diff([]string{"b/1", "b/2"}, names(s.Held("b/", "", 2))); diff != "" {
		t.Fatal(diff)
	}
	if diff := cmp.Diff([]string{"b/3"}, names(s.Held("b/", "b/2", 2))); diff != "" {
		t.Fatal(diff)
	}
}

func TestCommandEncodingRoundTrips(t *testing.T) {
	for _, c := range []Command{
		acq("a/b", 1, wait, req("r")),
		rel("a", 2),
		exp("a", 7),
		cancelCmd("a", 3),
		{Op: OpPromote, At: 5},
	} {
		got, err := DecodeCommand(c.Encode())
		if err != nil {
			t.Fatalf("%s: %v", c.Op, err)
		}
		if diff := cmp.Diff(c, got); diff != "" {
			t.Fatalf("%s: (-want +got)\n%s", c.Op, diff)
		}
	}
	for _, bad := range []string{``, `{`, `{"op":"acquire"}`, `{"op":"promote","extra":1}`, `{"op":"promote"} {}`, `[]`} {
		if _, err := DecodeCommand([]byte(bad)); err == nil {
			t.Errorf("DecodeCommand(%q) succeeded", bad)
		}
	}
}
