package fsm

import (
	"bytes"
	"errors"
	"fmt"
	"hash/crc32"
	"maps"
	"reflect"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/fence-dev/fence"
)

// The test vocabulary. Lease n has the ID lid(n), the holder "wN" and a TTL
// of n seconds, so a mix-up of two leases shows in every field. lid(0) is
// the zero ID, which is never issued.
func lid(n byte) fence.LeaseID {
	if n == 0 {
		return fence.LeaseID{}
	}
	return fence.LeaseID{0: 0xf0, 15: n}
}

func holder(n byte) string          { return fmt.Sprintf("w%d", n) }
func ttl(n byte) time.Duration      { return time.Duration(n) * time.Second }
func wait(c *Command)               { c.Wait = true }
func reqID(r string) func(*Command) { return func(c *Command) { c.RequestID = r } }
func at(ns int64) func(*Command)    { return func(c *Command) { c.At = ns } }
func noLeaseID(c *Command)          { c.LeaseID = fence.LeaseID{} }

// as makes a command come from holder(n): a retry of lease n's acquire
// carries a fresh lease ID but the same holder.
func as(n byte) func(*Command) { return func(c *Command) { c.Holder = holder(n) } }

// acquire is an acquire of scope by lease n, as a proposer stamps it.
func acquire(scope string, n byte, opts ...func(*Command)) Command {
	c := Command{Op: OpAcquire, Scope: scope, LeaseID: lid(n), Holder: holder(n), TTL: ttl(n)}
	for _, o := range opts {
		o(&c)
	}
	return c
}

func release(scope string, n byte, opts ...func(*Command)) Command {
	c := Command{Op: OpRelease, Scope: scope, LeaseID: lid(n)}
	for _, o := range opts {
		o(&c)
	}
	return c
}

func expire(scope string, token uint64, opts ...func(*Command)) Command {
	c := Command{Op: OpExpire, Scope: scope, Token: token}
	for _, o := range opts {
		o(&c)
	}
	return c
}

func cancel(scope string, n byte) Command {
	return Command{Op: OpCancel, Scope: scope, LeaseID: lid(n)}
}

var promote = Command{Op: OpPromote}

// opCheck is no operation of the machine: the test runner turns a command
// with it into State.Check(Scope, LeaseID), the query a renewal makes.
const opCheck Op = "test-only:check"

func check(scope string, n byte) Command { return Command{Op: opCheck, Scope: scope, LeaseID: lid(n)} }

// leaseOf is lease n as granted with token; waiterOf is lease n waiting in
// line, without a token.
func leaseOf(n byte, token uint64) Lease {
	return Lease{Token: token, ID: lid(n), Holder: holder(n), TTL: ttl(n)}
}

func waiterOf(n byte) Lease { return leaseOf(n, 0) }

func withRequest(l Lease, r string) Lease { l.RequestID = r; return l }

func grantedAt(l Lease, ns int64) Lease { l.GrantedAt = ns; return l }

// lostOf is what Lost reports about a past grant: its token and ID only.
func lostOf(n byte, token uint64) Lease { return Lease{Token: token, ID: lid(n)} }

func ev(kind EventKind, scope string, l Lease) Event {
	return Event{Kind: kind, Scope: scope, Lease: l}
}

// frame wraps a hand-written snapshot body in the snapshot header: the
// format is spelled out here rather than borrowed from snapshot.go, so the
// tests notice if it changes.
func frame(body string) []byte {
	sum := crc32.Checksum([]byte(body), crc32.MakeTable(crc32.Castagnoli))
	return fmt.Appendf(nil, "fence-fsm-snapshot v1 crc32c=%08x\n%s", sum, body)
}

// mustRestore restores a hand-written snapshot body.
func mustRestore(tb testing.TB, body string) *State {
	tb.Helper()
	s, err := Restore(frame(body))
	if err != nil {
		tb.Fatalf("restore %s: %v", body, err)
	}
	return s
}

// leaseJSON is lease n with token as a snapshot records it.
func leaseJSON(n byte, token uint64) string {
	return fmt.Sprintf(`{"token":%d,"id":"%s","holder":"%s","ttl":%d}`, token, lid(n), holder(n), ttl(n))
}

func waiterJSON(n byte) string {
	return fmt.Sprintf(`{"id":"%s","holder":"%s","ttl":%d}`, lid(n), holder(n), ttl(n))
}

// step is one command, or one check, and the result it must give.
type step struct {
	cmd  Command
	want Result // Err is compared by its InvalidError field only
}

// resultOpts compares Results: nil and empty event lists are equal, and
// errors are checked by applyStep.
var resultOpts = cmp.Options{cmpopts.EquateEmpty(), cmpopts.IgnoreFields(Result{}, "Err")}

// diffResults is cmp.Diff(want, got, resultOpts) with a fast path: the
// replay and property tests compare many results, and cmp is slow.
func diffResults(want, got any) string {
	if reflect.DeepEqual(want, got) {
		return ""
	}
	return cmp.Diff(want, got, resultOpts)
}

// applyStep applies st to s and reports any difference from st.want. It
// also checks the rule every command keeps: one that reports no event and
// does not join a queue changes nothing at all.
func applyStep(tb testing.TB, s *State, i int, st step) Result {
	tb.Helper()
	before := s.Snapshot()
	var r Result
	if st.cmd.Op == opCheck {
		r = s.Check(st.cmd.Scope, st.cmd.LeaseID)
	} else {
		r = s.Apply(st.cmd)
	}
	if diff := cmp.Diff(st.want, r, resultOpts); diff != "" {
		tb.Errorf("step %d, %s %q: result (-want +got):\n%s", i, st.cmd.Op, st.cmd.Scope, diff)
	}
	checkErr(tb, i, st.want.Err, r)
	if len(r.Events) == 0 && r.Outcome != Queued && !bytes.Equal(before, s.Snapshot()) {
		tb.Errorf("step %d, %s %q: %v with no event changed the state:\nbefore %s\nafter  %s",
			i, st.cmd.Op, st.cmd.Scope, r.Outcome, before, s.Snapshot())
	}
	return r
}

// checkErr checks that exactly the Invalid results carry an error, an
// *fence.InvalidError naming the field want names.
func checkErr(tb testing.TB, i int, want error, r Result) {
	tb.Helper()
	if (r.Outcome == Invalid) != (r.Err != nil) {
		tb.Errorf("step %d: outcome %v with error %v", i, r.Outcome, r.Err)
		return
	}
	if r.Err == nil {
		return
	}
	var ie *fence.InvalidError
	if !errors.Is(r.Err, fence.ErrInvalid) || !errors.As(r.Err, &ie) {
		tb.Errorf("step %d: error %v is not a *fence.InvalidError", i, r.Err)
		return
	}
	var wantIE *fence.InvalidError
	if errors.As(want, &wantIE) && ie.Field != wantIE.Field {
		tb.Errorf("step %d: error %v names field %q, want %q", i, r.Err, ie.Field, wantIE.Field)
	}
}

func invalidField(field string) error { return &fence.InvalidError{Field: field} }

const maxTok = uint64(fence.MaxToken)

// applyCases covers every Op and every Outcome; TestApply fails if one is
// left out.
var applyCases = []struct {
	name  string
	start string // snapshot body to restore first; empty for New()
	steps []step
	after func(testing.TB, *State)
}{
	{
		name: "grants take the next token of their scope",
		steps: []step{
			{acquire("a", 1), Result{Outcome: Granted, Scope: "a", Lease: leaseOf(1, 1),
				Events: []Event{ev(EventGranted, "a", leaseOf(1, 1))}}},
			{release("a", 1), Result{Outcome: Released, Scope: "a", Lease: leaseOf(1, 1),
				Events: []Event{ev(EventReleased, "a", leaseOf(1, 1))}}},
			{acquire("a", 2), Result{Outcome: Granted, Scope: "a", Lease: leaseOf(2, 2),
				Events: []Event{ev(EventGranted, "a", leaseOf(2, 2))}}},
			{expire("a", 2), Result{Outcome: Expired, Scope: "a", Lease: leaseOf(2, 2),
				Events: []Event{ev(EventExpired, "a", leaseOf(2, 2))}}},
			{acquire("a", 3), Result{Outcome: Granted, Scope: "a", Lease: leaseOf(3, 3),
				Events: []Event{ev(EventGranted, "a", leaseOf(3, 3))}}},
			// Tokens are per scope.
			{acquire("b", 4), Result{Outcome: Granted, Scope: "b", Lease: leaseOf(4, 1),
				Events: []Event{ev(EventGranted, "b", leaseOf(4, 1))}}},
		},
		after: func(tb testing.TB, s *State) {
			tb.Helper()
			want := []ScopeInfo{{Scope: "a", Last: 3, Lease: ptr(leaseOf(3, 3))}, {Scope: "b", Last: 1, Lease: ptr(leaseOf(4, 1))}}
			if diff := cmp.Diff(want, []ScopeInfo{s.Get("a"), s.Get("b")}); diff != "" {
				tb.Errorf("Get (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(ScopeInfo{Scope: "never"}, s.Get("never")); diff != "" {
				tb.Errorf("Get of a scope never acquired (-want +got):\n%s", diff)
			}
		},
	},
	{
		name: "a grant records the time stamped into its command",
		steps: []step{
			{acquire("a", 1, at(100)), Result{Outcome: Granted, Scope: "a", Lease: grantedAt(leaseOf(1, 1), 100),
				Events: []Event{ev(EventGranted, "a", grantedAt(leaseOf(1, 1), 100))}}},
			{acquire("a", 2, wait, at(200)), Result{Outcome: Queued, Scope: "a", Lease: waiterOf(2)}},
			// A hand-off is granted at the time of the command that freed
			// the scope, not at the time of the queued acquire.
			{release("a", 1, at(300)), Result{Outcome: Released, Scope: "a", Lease: grantedAt(leaseOf(1, 1), 100),
				Events: []Event{
					ev(EventReleased, "a", grantedAt(leaseOf(1, 1), 100)),
					ev(EventGranted, "a", grantedAt(leaseOf(2, 2), 300)),
				}}},
		},
	},
	{
		name: "acquire of a held scope without wait answers held with the holder's lease",
		steps: []step{
			{acquire("a", 1, reqID("r1")), Result{Outcome: Granted, Scope: "a", Lease: withRequest(leaseOf(1, 1), "r1"),
				Events: []Event{ev(EventGranted, "a", withRequest(leaseOf(1, 1), "r1"))}}},
			{acquire("a", 2), Result{Outcome: Held, Scope: "a", Lease: withRequest(leaseOf(1, 1), "r1")}},
			{acquire("a", 3, reqID("r3")), Result{Outcome: Held, Scope: "a", Lease: withRequest(leaseOf(1, 1), "r1")}},
		},
	},
	{
		name: "waiters are granted first come first served on release and on expiry",
		steps: []step{
			{acquire("a", 1), Result{Outcome: Granted, Scope: "a", Lease: leaseOf(1, 1),
				Events: []Event{ev(EventGranted, "a", leaseOf(1, 1))}}},
			{acquire("a", 2, wait), Result{Outcome: Queued, Scope: "a", Lease: waiterOf(2)}},
			{acquire("a", 3, wait), Result{Outcome: Queued, Scope: "a", Lease: waiterOf(3)}},
			{acquire("a", 4, wait), Result{Outcome: Queued, Scope: "a", Lease: waiterOf(4)}},
			{acquire("a", 5), Result{Outcome: Held, Scope: "a", Lease: leaseOf(1, 1)}},
			{release("a", 1), Result{Outcome: Released, Scope: "a", Lease: leaseOf(1, 1),
				Events: []Event{ev(EventReleased, "a", leaseOf(1, 1)), ev(EventGranted, "a", leaseOf(2, 2))}}},
			{expire("a", 2), Result{Outcome: Expired, Scope: "a", Lease: leaseOf(2, 2),
				Events: []Event{ev(EventExpired, "a", leaseOf(2, 2)), ev(EventGranted, "a", leaseOf(3, 3))}}},
			// A waiter does not hold the scope: it cannot release it.
			{release("a", 4), Result{Outcome: NotHolder, Scope: "a"}},
			{release("a", 3), Result{Outcome: Released, Scope: "a", Lease: leaseOf(3, 3),
				Events: []Event{ev(EventReleased, "a", leaseOf(3, 3)), ev(EventGranted, "a", leaseOf(4, 4))}}},
			{release("a", 4), Result{Outcome: Released, Scope: "a", Lease: leaseOf(4, 4),
				Events: []Event{ev(EventReleased, "a", leaseOf(4, 4))}}},
			{acquire("a", 6), Result{Outcome: Granted, Scope: "a", Lease: leaseOf(6, 5),
				Events: []Event{ev(EventGranted, "a", leaseOf(6, 5))}}},
		},
	},
	{
		name: "an expire whose token is not current changes nothing",
		steps: []step{
			{expire("never", 1), Result{Outcome: NoOp, Scope: "never"}},
			{acquire("a", 1), Result{Outcome: Granted, Scope: "a", Lease: leaseOf(1, 1),
				Events: []Event{ev(EventGranted, "a", leaseOf(1, 1))}}},
			{release("a", 1), Result{Outcome: Released, Scope: "a", Lease: leaseOf(1, 1),
				Events: []Event{ev(EventReleased, "a", leaseOf(1, 1))}}},
			{expire("a", 1), Result{Outcome: NoOp, Scope: "a"}}, // raced with the release: the scope is free
			{acquire("a", 2), Result{Outcome: Granted, Scope: "a", Lease: leaseOf(2, 2),
				Events: []Event{ev(EventGranted, "a", leaseOf(2, 2))}}},
			{expire("a", 1), Result{Outcome: NoOp, Scope: "a"}}, // raced with a new grant
			{expire("a", 3), Result{Outcome: NoOp, Scope: "a"}}, // a token never issued
			{expire("a", maxTok), Result{Outcome: NoOp, Scope: "a"}},
			{check("a", 2), Result{Outcome: Granted, Scope: "a", Lease: leaseOf(2, 2)}},
		},
	},
	{
		name: "release by a lease ID that never held the scope answers not holder",
		steps: []step{
			{release("never", 1), Result{Outcome: NotHolder, Scope: "never"}},
			{check("never", 1), Result{Outcome: NotHolder, Scope: "never"}},
			{acquire("a", 1), Result{Outcome: Granted, Scope: "a", Lease: leaseOf(1, 1),
				Events: []Event{ev(EventGranted, "a", leaseOf(1, 1))}}},
			{release("a", 2), Result{Outcome: NotHolder, Scope: "a"}},
			{check("a", 2), Result{Outcome: NotHolder, Scope: "a"}},
			{release("b", 1), Result{Outcome: NotHolder, Scope: "b"}}, // a lease ID is bound to its scope
			{check("b", 1), Result{Outcome: NotHolder, Scope: "b"}},
			{check("a", 1), Result{Outcome: Granted, Scope: "a", Lease: leaseOf(1, 1)}},
		},
	},
	{
		name: "a recently superseded lease ID answers lost with the current token",
		steps: []step{
			{acquire("a", 1), Result{Outcome: Granted, Scope: "a", Lease: leaseOf(1, 1),
				Events: []Event{ev(EventGranted, "a", leaseOf(1, 1))}}},
			{expire("a", 1), Result{Outcome: Expired, Scope: "a", Lease: leaseOf(1, 1),
				Events: []Event{ev(EventExpired, "a", leaseOf(1, 1))}}},
			{check("a", 1), Result{Outcome: Lost, Scope: "a", Lease: lostOf(1, 1), Current: 0}},
			{release("a", 1), Result{Outcome: Lost, Scope: "a", Lease: lostOf(1, 1), Current: 0}},
			{acquire("a", 2), Result{Outcome: Granted, Scope: "a", Lease: leaseOf(2, 2),
				Events: []Event{ev(EventGranted, "a", leaseOf(2, 2))}}},
			{check("a", 1), Result{Outcome: Lost, Scope: "a", Lease: lostOf(1, 1), Current: 2}},
			{release("a", 1), Result{Outcome: Lost, Scope: "a", Lease: lostOf(1, 1), Current: 2}},
			// A renewal (check) of the current lease keeps its token.
			{check("a", 2), Result{Outcome: Granted, Scope: "a", Lease: leaseOf(2, 2)}},
			{check("a", 2), Result{Outcome: Granted, Scope: "a", Lease: leaseOf(2, 2)}},
			{release("a", 2), Result{Outcome: Released, Scope: "a", Lease: leaseOf(2, 2),
				Events: []Event{ev(EventReleased, "a", leaseOf(2, 2))}}},
			{release("a", 2), Result{Outcome: Lost, Scope: "a", Lease: lostOf(2, 2), Current: 0}},
		},
	},
	{
		name: "a superseded lease ID is remembered for the last few grants only",
		steps: []step{
			{acquire("a", 1), Result{Outcome: Granted, Scope: "a", Lease: leaseOf(1, 1),
				Events: []Event{ev(EventGranted, "a", leaseOf(1, 1))}}},
			{acquire("a", 2, wait), Result{Outcome: Queued, Scope: "a", Lease: waiterOf(2)}},
			{acquire("a", 3, wait), Result{Outcome: Queued, Scope: "a", Lease: waiterOf(3)}},
			{acquire("a", 4, wait), Result{Outcome: Queued, Scope: "a", Lease: waiterOf(4)}},
			{acquire("a", 5, wait), Result{Outcome: Queued, Scope: "a", Lease: waiterOf(5)}},
			{release("a", 1), Result{Outcome: Released, Scope: "a", Lease: leaseOf(1, 1),
				Events: []Event{ev(EventReleased, "a", leaseOf(1, 1)), ev(EventGranted, "a", leaseOf(2, 2))}}},
			{release("a", 2), Result{Outcome: Released, Scope: "a", Lease: leaseOf(2, 2),
				Events: []Event{ev(EventReleased, "a", leaseOf(2, 2)), ev(EventGranted, "a", leaseOf(3, 3))}}},
			{release("a", 3), Result{Outcome: Released, Scope: "a", Lease: leaseOf(3, 3),
				Events: []Event{ev(EventReleased, "a", leaseOf(3, 3)), ev(EventGranted, "a", leaseOf(4, 4))}}},
			// Grant 1 is the oldest of the last recentGrants (4) grants.
			{check("a", 1), Result{Outcome: Lost, Scope: "a", Lease: lostOf(1, 1), Current: 4}},
			{release("a", 4), Result{Outcome: Released, Scope: "a", Lease: leaseOf(4, 4),
				Events: []Event{ev(EventReleased, "a", leaseOf(4, 4)), ev(EventGranted, "a", leaseOf(5, 5))}}},
			// Five grants later it is forgotten: no longer "lost", only
			// "not holder". Either way it is refused.
			{check("a", 1), Result{Outcome: NotHolder, Scope: "a"}},
			{release("a", 1), Result{Outcome: NotHolder, Scope: "a"}},
			{check("a", 2), Result{Outcome: Lost, Scope: "a", Lease: lostOf(2, 2), Current: 5}},
		},
	},
	{
		name: "cancel withdraws a waiter, or releases the grant it already got",
		steps: []step{
			{cancel("never", 1), Result{Outcome: NoOp, Scope: "never"}},
			{acquire("a", 1), Result{Outcome: Granted, Scope: "a", Lease: leaseOf(1, 1),
				Events: []Event{ev(EventGranted, "a", leaseOf(1, 1))}}},
			{acquire("a", 2, wait), Result{Outcome: Queued, Scope: "a", Lease: waiterOf(2)}},
			{acquire("a", 3, wait, reqID("r3")), Result{Outcome: Queued, Scope: "a", Lease: withRequest(waiterOf(3), "r3")}},
			{acquire("a", 4, wait), Result{Outcome: Queued, Scope: "a", Lease: waiterOf(4)}},
			{cancel("a", 3), Result{Outcome: Cancelled, Scope: "a", Lease: withRequest(waiterOf(3), "r3"),
				Events: []Event{ev(EventCancelled, "a", withRequest(waiterOf(3), "r3"))}}},
			{cancel("a", 3), Result{Outcome: NoOp, Scope: "a"}},
			{cancel("a", 9), Result{Outcome: NoOp, Scope: "a"}},
			{cancel("b", 2), Result{Outcome: NoOp, Scope: "b"}}, // a waiter is bound to its scope
			// The cancelled waiter is skipped: 2, then 4.
			{release("a", 1), Result{Outcome: Released, Scope: "a", Lease: leaseOf(1, 1),
				Events: []Event{ev(EventReleased, "a", leaseOf(1, 1)), ev(EventGranted, "a", leaseOf(2, 2))}}},
			// 2 was granted before its caller gave up: its cancel releases
			// the grant and hands the scope on.
			{cancel("a", 2), Result{Outcome: Released, Scope: "a", Lease: leaseOf(2, 2),
				Events: []Event{ev(EventReleased, "a", leaseOf(2, 2)), ev(EventGranted, "a", leaseOf(4, 3))}}},
			{cancel("a", 2), Result{Outcome: NoOp, Scope: "a"}},
			{cancel("a", 4), Result{Outcome: Released, Scope: "a", Lease: leaseOf(4, 3),
				Events: []Event{ev(EventReleased, "a", leaseOf(4, 3))}}},
		},
		after: func(tb testing.TB, s *State) {
			tb.Helper()
			if diff := cmp.Diff(ScopeInfo{Scope: "a", Last: 3}, s.Get("a")); diff != "" {
				tb.Errorf("Get (-want +got):\n%s", diff)
			}
		},
	},
	{
		name: "promote drops every waiter, in scope order, and keeps every lease",
		steps: []step{
			{promote, Result{Outcome: NoOp}},
			{acquire("b", 1), Result{Outcome: Granted, Scope: "b", Lease: leaseOf(1, 1),
				Events: []Event{ev(EventGranted, "b", leaseOf(1, 1))}}},
			{acquire("b", 2, wait), Result{Outcome: Queued, Scope: "b", Lease: waiterOf(2)}},
			{acquire("b", 3, wait, reqID("r3")), Result{Outcome: Queued, Scope: "b", Lease: withRequest(waiterOf(3), "r3")}},
			{acquire("a/x", 4), Result{Outcome: Granted, Scope: "a/x", Lease: leaseOf(4, 1),
				Events: []Event{ev(EventGranted, "a/x", leaseOf(4, 1))}}},
			{acquire("a/x", 5, wait), Result{Outcome: Queued, Scope: "a/x", Lease: waiterOf(5)}},
			{acquire("c", 6), Result{Outcome: Granted, Scope: "c", Lease: leaseOf(6, 1),
				Events: []Event{ev(EventGranted, "c", leaseOf(6, 1))}}},
			{promote, Result{Outcome: NoOp, Events: []Event{
				ev(EventCancelled, "a/x", waiterOf(5)),
				ev(EventCancelled, "b", waiterOf(2)),
				ev(EventCancelled, "b", withRequest(waiterOf(3), "r3")),
			}}},
			{promote, Result{Outcome: NoOp}},
			// Nobody is left to hand the scope to.
			{release("b", 1), Result{Outcome: Released, Scope: "b", Lease: leaseOf(1, 1),
				Events: []Event{ev(EventReleased, "b", leaseOf(1, 1))}}},
			{check("a/x", 4), Result{Outcome: Granted, Scope: "a/x", Lease: leaseOf(4, 1)}},
			{check("c", 6), Result{Outcome: Granted, Scope: "c", Lease: leaseOf(6, 1)}},
			// A dropped waiter's retry is a new acquire.
			{acquire("b", 7, wait, reqID("r3")), Result{Outcome: Granted, Scope: "b", Lease: withRequest(leaseOf(7, 2), "r3"),
				Events: []Event{ev(EventGranted, "b", withRequest(leaseOf(7, 2), "r3"))}}},
		},
	},
	{
		name: "a retried acquire gets its own grant, its own place in line, or lost; never a second token",
		steps: []step{
			{acquire("a", 1, reqID("r1")), Result{Outcome: Granted, Scope: "a", Lease: withRequest(leaseOf(1, 1), "r1"),
				Events: []Event{ev(EventGranted, "a", withRequest(leaseOf(1, 1), "r1"))}}},
			// The retry's proposer stamped a fresh lease ID; the answer is
			// the first attempt's grant, with its ID, and no event.
			{acquire("a", 11, reqID("r1"), as(1)), Result{Outcome: Granted, Scope: "a", Lease: withRequest(leaseOf(1, 1), "r1")}},
			{acquire("a", 11, wait, reqID("r1"), as(1)), Result{Outcome: Granted, Scope: "a", Lease: withRequest(leaseOf(1, 1), "r1")}},
			{acquire("a", 2, wait, reqID("r2")), Result{Outcome: Queued, Scope: "a", Lease: withRequest(waiterOf(2), "r2")}},
			{acquire("a", 3, wait, reqID("r3")), Result{Outcome: Queued, Scope: "a", Lease: withRequest(waiterOf(3), "r3")}},
			// Retries of a queued acquire keep its place: no second waiter,
			// even when the retry does not ask to wait.
			{acquire("a", 12, wait, reqID("r2"), as(2)), Result{Outcome: Queued, Scope: "a", Lease: withRequest(waiterOf(2), "r2")}},
			{acquire("a", 12, reqID("r2"), as(2)), Result{Outcome: Queued, Scope: "a", Lease: withRequest(waiterOf(2), "r2")}},
			{release("a", 1), Result{Outcome: Released, Scope: "a", Lease: withRequest(leaseOf(1, 1), "r1"),
				Events: []Event{
					ev(EventReleased, "a", withRequest(leaseOf(1, 1), "r1")),
					ev(EventGranted, "a", withRequest(leaseOf(2, 2), "r2")),
				}}},
			{acquire("a", 12, wait, reqID("r2"), as(2)), Result{Outcome: Granted, Scope: "a", Lease: withRequest(leaseOf(2, 2), "r2")}},
			// r1's grant ended: its retry is told so, with the token it had.
			{acquire("a", 11, wait, reqID("r1"), as(1)), Result{Outcome: Lost, Scope: "a", Lease: lostOf(1, 1), Current: 2}},
			{expire("a", 2), Result{Outcome: Expired, Scope: "a", Lease: withRequest(leaseOf(2, 2), "r2"),
				Events: []Event{
					ev(EventExpired, "a", withRequest(leaseOf(2, 2), "r2")),
					ev(EventGranted, "a", withRequest(leaseOf(3, 3), "r3")),
				}}},
			{acquire("a", 12, reqID("r2"), as(2)), Result{Outcome: Lost, Scope: "a", Lease: lostOf(2, 2), Current: 3}},
			{release("a", 3), Result{Outcome: Released, Scope: "a", Lease: withRequest(leaseOf(3, 3), "r3"),
				Events: []Event{ev(EventReleased, "a", withRequest(leaseOf(3, 3), "r3"))}}},
			{acquire("a", 13, reqID("r3"), as(3)), Result{Outcome: Lost, Scope: "a", Lease: lostOf(3, 3), Current: 0}},
			{acquire("a", 11, reqID("r1"), as(1)), Result{Outcome: Lost, Scope: "a", Lease: lostOf(1, 1), Current: 0}},
			// Request IDs are per scope.
			{acquire("b", 4, reqID("r1")), Result{Outcome: Granted, Scope: "b", Lease: withRequest(leaseOf(4, 1), "r1"),
				Events: []Event{ev(EventGranted, "b", withRequest(leaseOf(4, 1), "r1"))}}},
			// An empty request ID is no request ID: two acquires, two leases.
			{acquire("a", 5), Result{Outcome: Granted, Scope: "a", Lease: leaseOf(5, 4),
				Events: []Event{ev(EventGranted, "a", leaseOf(5, 4))}}},
			{acquire("a", 6), Result{Outcome: Held, Scope: "a", Lease: leaseOf(5, 4)}},
		},
	},
	{
		name:  "the last token is granted, then the counter refuses rather than wraps",
		start: `{"scopes":[{"scope":"a","last":9223372036854775806},{"scope":"b","last":3}]}`,
		steps: []step{
			{acquire("a", 1, reqID("r1")), Result{Outcome: Granted, Scope: "a", Lease: withRequest(leaseOf(1, maxTok), "r1"),
				Events: []Event{ev(EventGranted, "a", withRequest(leaseOf(1, maxTok), "r1"))}}},
			{acquire("a", 11, reqID("r1"), as(1)), Result{Outcome: Granted, Scope: "a", Lease: withRequest(leaseOf(1, maxTok), "r1")}},
			{acquire("a", 2), Result{Outcome: Held, Scope: "a", Lease: withRequest(leaseOf(1, maxTok), "r1")}},
			{acquire("a", 2, wait), Result{Outcome: Queued, Scope: "a", Lease: waiterOf(2)}},
			{acquire("a", 3, wait), Result{Outcome: Queued, Scope: "a", Lease: waiterOf(3)}},
			// No token is left for the line: every waiter is cancelled, in
			// order, rather than left waiting for ever.
			{release("a", 1), Result{Outcome: Released, Scope: "a", Lease: withRequest(leaseOf(1, maxTok), "r1"),
				Events: []Event{
					ev(EventReleased, "a", withRequest(leaseOf(1, maxTok), "r1")),
					ev(EventCancelled, "a", waiterOf(2)),
					ev(EventCancelled, "a", waiterOf(3)),
				}}},
			{acquire("a", 4), Result{Outcome: Exhausted, Scope: "a"}},
			{acquire("a", 4, wait), Result{Outcome: Exhausted, Scope: "a"}},
			{acquire("a", 11, reqID("r1"), as(1)), Result{Outcome: Lost, Scope: "a", Lease: lostOf(1, maxTok)}},
			{check("a", 1), Result{Outcome: Lost, Scope: "a", Lease: lostOf(1, maxTok)}},
			{cancel("a", 2), Result{Outcome: NoOp, Scope: "a"}},
			// Other scopes keep their own counters.
			{acquire("b", 5), Result{Outcome: Granted, Scope: "b", Lease: leaseOf(5, 4),
				Events: []Event{ev(EventGranted, "b", leaseOf(5, 4))}}},
		},
		after: func(tb testing.TB, s *State) {
			tb.Helper()
			if diff := cmp.Diff(ScopeInfo{Scope: "a", Last: maxTok}, s.Get("a")); diff != "" {
				tb.Errorf("Get (-want +got):\n%s", diff)
			}
		},
	},
	{
		name: "an expiry at the last token cancels the line too",
		start: `{"scopes":[{"scope":"a","last":9223372036854775807,"lease":` + leaseJSON(1, maxTok) +
			`,"waiters":[` + waiterJSON(2) + `,` + waiterJSON(3) + `]}]}`,
		steps: []step{
			{check("a", 1), Result{Outcome: Granted, Scope: "a", Lease: leaseOf(1, maxTok)}},
			{acquire("a", 4, wait), Result{Outcome: Queued, Scope: "a", Lease: waiterOf(4)}},
			{cancel("a", 3), Result{Outcome: Cancelled, Scope: "a", Lease: waiterOf(3),
				Events: []Event{ev(EventCancelled, "a", waiterOf(3))}}},
			{expire("a", maxTok), Result{Outcome: Expired, Scope: "a", Lease: leaseOf(1, maxTok),
				Events: []Event{
					ev(EventExpired, "a", leaseOf(1, maxTok)),
					ev(EventCancelled, "a", waiterOf(2)),
					ev(EventCancelled, "a", waiterOf(4)),
				}}},
			{acquire("a", 5), Result{Outcome: Exhausted, Scope: "a"}},
		},
	},
	{
		name: "a malformed command is refused and changes nothing",
		steps: []step{
			{acquire("a", 1), Result{Outcome: Granted, Scope: "a", Lease: leaseOf(1, 1),
				Events: []Event{ev(EventGranted, "a", leaseOf(1, 1))}}},
			{acquire("a", 2, wait), Result{Outcome: Queued, Scope: "a", Lease: waiterOf(2)}},
			{acquire("", 3), Result{Outcome: Invalid, Err: invalidField("scope")}},
			{acquire("../a", 3), Result{Outcome: Invalid, Scope: "../a", Err: invalidField("scope")}},
			{acquire("a//b", 3), Result{Outcome: Invalid, Scope: "a//b", Err: invalidField("scope")}},
			{acquire("a\x00", 3), Result{Outcome: Invalid, Scope: "a\x00", Err: invalidField("scope")}},
			{acquire(strings.Repeat("s", 257), 3), Result{Outcome: Invalid, Scope: strings.Repeat("s", 257), Err: invalidField("scope")}},
			{acquire("b", 3, func(c *Command) { c.TTL = 0 }), Result{Outcome: Invalid, Scope: "b", Err: invalidField("ttl")}},
			{acquire("b", 3, func(c *Command) { c.TTL = -time.Second }), Result{Outcome: Invalid, Scope: "b", Err: invalidField("ttl")}},
			{acquire("b", 3, noLeaseID), Result{Outcome: Invalid, Scope: "b", Err: invalidField("lease_id")}},
			{acquire("b", 3, func(c *Command) { c.Holder = "w\n3" }), Result{Outcome: Invalid, Scope: "b", Err: invalidField("holder")}},
			{acquire("b", 3, reqID(strings.Repeat("r", MaxRequestIDLen+1))), Result{Outcome: Invalid, Scope: "b", Err: invalidField("request_id")}},
			{release("a", 0), Result{Outcome: Invalid, Scope: "a", Err: invalidField("lease_id")}},
			{release("", 1), Result{Outcome: Invalid, Err: invalidField("scope")}},
			{cancel("a", 0), Result{Outcome: Invalid, Scope: "a", Err: invalidField("lease_id")}},
			{expire("a", 0), Result{Outcome: Invalid, Scope: "a", Err: invalidField("token")}},
			{expire("/a", 1), Result{Outcome: Invalid, Scope: "/a", Err: invalidField("scope")}},
			{Command{Op: "steal", Scope: "a", LeaseID: lid(3)}, Result{Outcome: Invalid, Scope: "a", Err: invalidField("op")}},
			{Command{Scope: "a"}, Result{Outcome: Invalid, Scope: "a", Err: invalidField("op")}},
			{Command{Op: "ACQUIRE", Scope: "a", LeaseID: lid(3), TTL: time.Second}, Result{Outcome: Invalid, Scope: "a", Err: invalidField("op")}},
			// The longest request ID is fine.
			{acquire("a", 3, reqID(strings.Repeat("r", MaxRequestIDLen))), Result{Outcome: Held, Scope: "a", Lease: leaseOf(1, 1)}},
		},
	},
}

func ptr[T any](v T) *T { return &v }

func TestApply(t *testing.T) {
	ops := map[Op]bool{}
	outcomes := map[Outcome]bool{}
	for _, tc := range applyCases {
		for _, st := range tc.steps {
			ops[st.cmd.Op] = true
			outcomes[st.want.Outcome] = true
		}
		t.Run(tc.name, func(t *testing.T) {
			s := New()
			if tc.start != "" {
				s = mustRestore(t, tc.start)
			}
			for i, st := range tc.steps {
				applyStep(t, s, i, st)
			}
			if tc.after != nil {
				tc.after(t, s)
			}
		})
	}
	// The table must keep covering the whole machine.
	for _, op := range []Op{OpAcquire, OpRelease, OpExpire, OpCancel, OpPromote, opCheck} {
		if !ops[op] {
			t.Errorf("no case applies %q", op)
		}
	}
	for o := range Outcome(len(outcomeNames)) {
		if !outcomes[o] {
			t.Errorf("no case expects outcome %v", o)
		}
	}
}

// TestRetriedAcquireWithinTheWindow retries an acquire after its grant
// ended. While the grant is among the scope's last recentGrants grants the
// retry answers lost with the original token, never a second token; past
// that window the request ID is forgotten, as client/doc.go documents.
func TestRetriedAcquireWithinTheWindow(t *testing.T) {
	s := New()
	applyStep(t, s, 0, step{acquire("a", 1, reqID("r1")), Result{Outcome: Granted, Scope: "a",
		Lease: withRequest(leaseOf(1, 1), "r1"), Events: []Event{ev(EventGranted, "a", withRequest(leaseOf(1, 1), "r1"))}}})
	s.Apply(release("a", 1))
	for n := byte(2); n <= recentGrants; n++ {
		s.Apply(acquire("a", n))
		s.Apply(release("a", n))
	}
	r := s.Apply(acquire("a", 11, reqID("r1"), as(1)))
	if r.Outcome != Lost || r.Lease.Token != 1 {
		t.Errorf("a retry of r1 (token 1) after %d later grants = %v with token %d, want lost with token 1",
			recentGrants-1, r.Outcome, r.Lease.Token)
	}
	s.Apply(acquire("a", recentGrants+1))
	s.Apply(release("a", recentGrants+1))
	r = s.Apply(acquire("a", 12, reqID("r1"), as(1)))
	if r.Outcome != Granted || r.Lease.Token != recentGrants+2 {
		t.Errorf("a retry of r1 after %d later grants = %v with token %d, want a new grant with token %d (outside the window)",
			recentGrants, r.Outcome, r.Lease.Token, recentGrants+2)
	}
}

func TestHeldListsInOrderWithPaging(t *testing.T) {
	s := New()
	for i, name := range []string{"b/2", "a", "b/1", "c", "b/3", "ba"} {
		s.Apply(acquire(name, byte(i+1)))
	}
	s.Apply(release("c", 4))
	s.Apply(acquire("d", 7))
	s.Apply(expire("d", 1))
	for _, tc := range []struct {
		prefix, after string
		limit         int
		want          []string
	}{
		{"", "", 0, []string{"a", "b/1", "b/2", "b/3", "ba"}},
		{"", "", -1, []string{"a", "b/1", "b/2", "b/3", "ba"}},
		{"b/", "", 0, []string{"b/1", "b/2", "b/3"}},
		{"b/", "", 2, []string{"b/1", "b/2"}},
		{"b/", "b/2", 2, []string{"b/3"}},
		{"b", "b/3", 0, []string{"ba"}},
		{"c", "", 0, nil}, // released
		{"d", "", 0, nil}, // expired
		{"x", "", 0, nil},
		{"", "ba", 0, nil},
	} {
		var got []string
		for _, in := range s.Held(tc.prefix, tc.after, tc.limit) {
			if in.Lease == nil {
				t.Errorf("Held listed free scope %q", in.Scope)
			}
			got = append(got, in.Scope)
		}
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("Held(%q, %q, %d) (-want +got):\n%s", tc.prefix, tc.after, tc.limit, diff)
		}
	}
}

func TestLeasesCopiesTheCurrentLeases(t *testing.T) {
	s := New()
	s.Apply(acquire("a", 1))
	s.Apply(acquire("a", 2, wait))
	s.Apply(acquire("b", 3))
	s.Apply(acquire("c", 4))
	s.Apply(release("c", 4))
	want := map[string]Lease{"a": leaseOf(1, 1), "b": leaseOf(3, 1)}
	got := maps.Collect(s.Leases())
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("Leases (-want +got):\n%s", diff)
	}
	// The copies are the caller's: changing them changes nothing.
	before := s.Snapshot()
	l := got["a"]
	l.Token = 99
	got["a"] = l
	s.Get("a").Lease.Token = 99
	if !bytes.Equal(before, s.Snapshot()) {
		t.Fatal("changing what Leases or Get returned changed the state")
	}
}

func TestOutcomeAndEventKindNames(t *testing.T) {
	for _, tc := range []struct {
		got  fmt.Stringer
		want string
	}{
		{Invalid, "invalid"}, {Granted, "granted"}, {Queued, "queued"}, {Held, "held"},
		{Released, "released"}, {Expired, "expired"}, {Cancelled, "cancelled"}, {Lost, "lost"},
		{NotHolder, "not holder"}, {Exhausted, "exhausted"}, {NoOp, "no-op"}, {Outcome(200), "outcome(200)"},
		{EventGranted, "granted"}, {EventReleased, "released"}, {EventExpired, "expired"}, {EventCancelled, "cancelled"},
	} {
		if s := tc.got.String(); s != tc.want {
			t.Errorf("%#v.String() = %q, want %q", tc.got, s, tc.want)
		}
	}
}

// TestEventKindStringDoesNotPanic: an EventKind from a newer build, or a
// corrupt value, must print, not crash the logger.
func TestEventKindStringDoesNotPanic(t *testing.T) {
	for _, k := range []EventKind{0, EventCancelled + 1, 255} {
		func() {
			defer func() {
				if p := recover(); p != nil {
					t.Errorf("EventKind(%d).String() panicked: %v", uint8(k), p)
				}
			}()
			_ = k.String()
		}()
	}
}

// A million scopes each granted once are what a busy service holds, so a
// scope's record stays small and its lines of waiters and ended grants are
// made only when needed, live or restored; and holders, which repeat across
// leases, are kept once however many commands brought a copy.
func TestHeldScopeIsCompact(t *testing.T) {
	if n := unsafe.Sizeof(scope{}); n > 24 {
		t.Fatalf("a scope's record takes %d bytes, was 24", n)
	}
	s := New()
	for i := range 3 {
		c := acquire(fmt.Sprintf("s%d", i), 1, reqID(fmt.Sprintf("r%d", i)))
		c.Holder = strings.Clone("shared-holder") // as decoding each command makes it
		s.Apply(c)
	}
	s.Apply(acquire("s0", 2, wait))
	s.Apply(release("s1", 1))
	restored := mustRestore(t, string(bytes.SplitN(s.Snapshot(), []byte("\n"), 2)[1]))
	for _, st := range []*State{s, restored} {
		for name, want := range map[string]bool{"s0": true, "s1": true, "s2": false} {
			if got := st.scopes[name].more != nil; got != want {
				t.Errorf("scope %s has its lines made: %v, want %v", name, got, want)
			}
		}
		if a, b := st.scopes["s0"].lease.Holder, st.scopes["s2"].lease.Holder; unsafe.StringData(a) != unsafe.StringData(b) {
			t.Errorf("two leases of holder %q keep a copy each", a)
		}
	}
}
