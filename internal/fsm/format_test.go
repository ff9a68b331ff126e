package fsm

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/fence-dev/fence"
)

var setFormat2 = Command{Op: OpSetFormat, Format: 2}

// TestScopeRecordsStayBounded acquires and releases a million distinct
// scopes, once each, as a service that locks one scope per order does: the
// records kept must not grow with them, and neither must the live heap.
func TestScopeRecordsStayBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("a million scopes")
	}
	const n, every = 1_000_000, 100_000
	s := New()
	s.Apply(setFormat2)
	var base uint64
	id := fence.LeaseID{0: 0xb0}
	for i := range n {
		name := fmt.Sprintf("orders/%07d", i)
		id[15], id[14], id[13] = byte(i), byte(i>>8), byte(i>>16)
		r := s.Apply(Command{Op: OpAcquire, Scope: name, LeaseID: id, Holder: "worker", TTL: time.Minute, RequestID: name})
		if r.Outcome != Granted {
			t.Fatalf("acquire %s: %v", name, r.Outcome)
		}
		if r := s.Apply(Command{Op: OpRelease, Scope: name, LeaseID: id}); r.Outcome != Released {
			t.Fatalf("release %s: %v", name, r.Outcome)
		}
		if got := s.Records(); got > idleKept {
			t.Fatalf("after %d scopes, %d records are kept; at most %d idle ones should be", i+1, got, idleKept)
		}
		if (i+1)%every == 0 {
			heap := liveHeap()
			if base == 0 {
				base = heap
			}
			t.Logf("%7d scopes: %5d records, live heap %6.2f MB", i+1, s.Records(), float64(heap)/(1<<20))
			// The state's share of the heap is about a megabyte; the
			// slack is for the runtime and the test itself.
			if heap > base+4<<20 {
				t.Fatalf("after %d scopes the live heap is %d bytes, %d more than after %d", i+1, heap, heap-base, every)
			}
		}
	}
	// The first scope was forgotten long ago; created again, it still
	// starts above its old token.
	if _, kept := s.scopes["orders/0000000"]; kept {
		t.Fatal("the first scope's record was kept")
	}
	if last := s.Get("orders/0000000").Last; last < 1 {
		t.Fatalf("the first scope, forgotten, reports last token %d, below its token 1", last)
	}
	r := s.Apply(Command{Op: OpAcquire, Scope: "orders/0000000", LeaseID: fence.LeaseID{0: 0xc0}, TTL: time.Minute})
	if r.Outcome != Granted || r.Lease.Token <= 1 {
		t.Fatalf("acquire of a forgotten scope: %v, token %d; its token 1 was issued before", r.Outcome, r.Lease.Token)
	}
}

func liveHeap() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// TestFormat1KeepsEveryRecord: until the cluster's format is raised, a
// state applies as the builds before format 2 did, and encodes as they
// did, so that replicas of both builds stay equal during an upgrade.
func TestFormat1KeepsEveryRecord(t *testing.T) {
	s := New()
	s.keepIdle = 0
	for i := range 10 {
		name := fmt.Sprintf("s/%d", i)
		s.Apply(acquire(name, 1))
		s.Apply(release(name, 1))
	}
	if s.Format() != 1 || s.Records() != 10 {
		t.Fatalf("format %d, %d records; want format 1 keeping all 10", s.Format(), s.Records())
	}
	for _, field := range []string{`"format"`, `"floor"`, `"idle"`} {
		if bytes.Contains(s.Snapshot(), []byte(field)) {
			t.Errorf("a snapshot of format 1 has the field %s, which builds before format 2 refuse", field)
		}
	}
	if r := s.Apply(setFormat2); r.Outcome != NoOp || s.Format() != 2 || s.Records() != 0 {
		t.Fatalf("raised to format 2: %v, format %d, %d records; want every free record dropped", r.Outcome, s.Format(), s.Records())
	}
	if r := s.Apply(Command{Op: OpSetFormat, Format: 1}); r.Outcome != NoOp || s.Format() != 2 {
		t.Fatalf("set_format 1 after 2: %v, format %d; the format is never lowered", r.Outcome, s.Format())
	}
}

// TestOldSnapshotRaisedKeepsTokensAbove restores a snapshot written by the
// encoder before format 2 (the golden file), raises the format, lets every
// scope be forgotten, and acquires each again: every new token is above
// every token the scope had.
func TestOldSnapshotRaisedKeepsTokensAbove(t *testing.T) {
	golden, err := os.ReadFile(filepath.Join("testdata", "snapshot-v1.golden"))
	if err != nil {
		t.Fatal(err)
	}
	s, err := Restore(golden)
	if err != nil {
		t.Fatal(err)
	}
	if s.Format() != 1 {
		t.Fatalf("an old snapshot restores as format %d", s.Format())
	}
	s.keepIdle = 0
	before := map[string]uint64{}
	for _, name := range s.sortedScopes("") {
		before[name] = s.Get(name).Last
	}
	s.Apply(setFormat2)
	s.Apply(Command{Op: OpPromote}) // drops the waiters
	for name, l := range s.Leases() {
		s.Apply(Command{Op: OpExpire, Scope: name, Token: l.Token})
	}
	if s.Records() != 1 || s.Get("z/exhausted").Last != fence.MaxToken {
		t.Fatalf("%d records kept with none held and none idle allowed; want only the exhausted scope's", s.Records())
	}
	for name, last := range before {
		r := s.Apply(Command{Op: OpAcquire, Scope: name, LeaseID: fence.LeaseID{0: 0xd0}, TTL: time.Second})
		if name == "z/exhausted" {
			if r.Outcome != Exhausted {
				t.Errorf("the exhausted scope acquires as %v", r.Outcome)
			}
			continue
		}
		if r.Outcome != Granted || r.Lease.Token <= last {
			t.Errorf("%s: created again: %v with token %d, after token %d", name, r.Outcome, r.Lease.Token, last)
		}
	}
}

// TestSnapshotGoldenV2 pins the snapshot of format 2: its floor and its
// line of idle scopes.
func TestSnapshotGoldenV2(t *testing.T) {
	path := filepath.Join("testdata", "snapshot-v2.golden")
	s := richState(t)
	s.keepIdle = 2
	for _, c := range []Command{setFormat2, acquire("d", 8), release("d", 8), acquire("e", 9), release("e", 9)} {
		if r := s.Apply(c); r.Outcome == Invalid {
			t.Fatal(r.Err)
		}
	}
	snap := s.Snapshot()
	if *update {
		if err := os.WriteFile(path, snap, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	golden, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(snap, golden) {
		t.Errorf("the same commands now give the snapshot\n%s\nwant\n%s", snap, golden)
	}
	restored, err := Restore(golden)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(restored.Snapshot(), golden) {
		t.Errorf("the golden snapshot restores to a state that encodes as\n%s", restored.Snapshot())
	}
	// The line's order survives: the older idle scope goes first.
	restored.keepIdle = 2
	restored.Apply(acquire("f", 10))
	restored.Apply(release("f", 10))
	_, d := restored.scopes["d"]
	_, e := restored.scopes["e"]
	if d || !e {
		t.Errorf("after one more idle scope, d kept: %v, e kept: %v; want d dropped first", d, e)
	}
}

func TestRestoreRefusesBadFormat(t *testing.T) {
	for _, tc := range []struct{ body, want string }{
		{fmt.Sprintf(`{"scopes":[],"format":%d}`, LogFormat+1), fmt.Sprintf("log format %d", LogFormat+1)},
		{`{"scopes":[],"format":1}`, "format 1 is written as no format"},
		{`{"scopes":[],"floor":5}`, "log format 1"},
		{`{"scopes":[{"scope":"a","last":1}],"format":2}`, "1 free"},
		{`{"scopes":[],"format":2,"idle":["a"]}`, "no record"},
		{`{"scopes":[{"scope":"a","last":1}],"format":2,"idle":["a","a"]}`, "twice"},
		{`{"scopes":[{"scope":"a","last":1,"lease":{"token":1,"id":"f0000000000000000000000000000001","ttl":1}}],"format":2,"idle":["a"]}`, "held"},
		{`{"scopes":[{"scope":"a","last":9223372036854775807}],"format":2,"idle":["a"]}`, "exhausted"},
		{`{"scopes":[],"format":2,"floor":9223372036854775808}`, "floor"},
	} {
		_, err := Restore(frame(tc.body))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Restore(%s) = %v, want an error about %q", tc.body, err, tc.want)
		}
	}
	if _, err := Restore(frame(fmt.Sprintf(`{"scopes":[],"format":%d}`, LogFormat+1))); !errors.Is(err, ErrUnknownEntry) {
		t.Errorf("a snapshot of a newer format: %v, want ErrUnknownEntry", err)
	}
}

// TestDecodeCommandUnknownEntry: what a newer build or corruption wrote is
// told apart from a malformed command of a known kind, which every build
// refuses alike.
func TestDecodeCommandUnknownEntry(t *testing.T) {
	for _, in := range []string{
		fmt.Sprintf(`{"op":"set_format","format":%d}`, LogFormat+1),
		`{"op":"acquire_shared","scope":"a"}`,
		`{"op":"release","scope":"a","lease_id":"f0000000000000000000000000000001","fence_v3":true}`,
		`{"op":"promote"} {"op":"promote"}`,
		`{"op":"promote"`,
		`null`,
		"\x00\x01",
	} {
		if _, err := DecodeCommand([]byte(in)); !errors.Is(err, ErrUnknownEntry) {
			t.Errorf("DecodeCommand(%q) = %v, want ErrUnknownEntry", in, err)
		}
	}
	for _, in := range []string{
		`{"op":"set_format","format":0}`,
		`{"op":"acquire","scope":"a","lease_id":"f0000000000000000000000000000001","ttl":-1}`,
		`{"op":"expire","scope":"a"}`,
	} {
		if _, err := DecodeCommand([]byte(in)); err == nil || errors.Is(err, ErrUnknownEntry) || !errors.Is(err, fence.ErrInvalid) {
			t.Errorf("DecodeCommand(%q) = %v, want an invalid command, not an unknown entry", in, err)
		}
	}
	for f := 1; f <= LogFormat; f++ {
		if _, err := DecodeCommand(Command{Op: OpSetFormat, Format: f}.Encode()); err != nil {
			t.Errorf("set_format %d: %v", f, err)
		}
	}
}

// TestPromoteRaisesTokenFloor: from FloorFormat on, a promote lifts the
// next token of every scope (held, idle, dropped or never seen) above its
// token floor, and a held lease keeps its token; below it the floor is
// ignored, as the builds before it ignored it, so replicas agree. A
// snapshot carries the raised counters.
func TestPromoteRaisesTokenFloor(t *testing.T) {
	const floor = 1_000_000
	grant := func(t *testing.T, s *State, scope string, b byte) Result {
		t.Helper()
		r := s.Apply(Command{Op: OpAcquire, Scope: scope, LeaseID: fence.LeaseID{0: b}, TTL: time.Second})
		if r.Outcome != Granted {
			t.Fatalf("acquire %s: %v", scope, r.Outcome)
		}
		return r
	}
	setup := func(t *testing.T, format int) *State {
		s := New()
		s.keepIdle = 1
		s.Apply(Command{Op: OpSetFormat, Format: format})
		held := grant(t, s, "held", 1)
		for i, name := range []string{"dropped", "idle"} {
			r := grant(t, s, name, byte(2+i))
			s.Apply(Command{Op: OpRelease, Scope: name, LeaseID: r.Lease.ID})
		}
		if s.Records() != 2 {
			t.Fatalf("%d records, want held and idle (dropped forgotten)", s.Records())
		}
		s.Apply(Command{Op: OpPromote, Token: floor, At: 1})
		if got := s.Get("held"); got.Lease == nil || got.Lease.Token != held.Lease.Token {
			t.Fatalf("the held lease after promote: %+v, want token %d kept", got.Lease, held.Lease.Token)
		}
		return s
	}
	t.Run("format 7", func(t *testing.T) {
		s := setup(t, FloorFormat)
		s.Apply(Command{Op: OpRelease, Scope: "held", LeaseID: fence.LeaseID{0: 1}})
		restored, err := Restore(s.Snapshot())
		if err != nil {
			t.Fatal(err)
		}
		for _, st := range []*State{s, restored} {
			for i, name := range []string{"held", "idle", "dropped", "new"} {
				if r := grant(t, st, name, byte(10+i)); r.Lease.Token != floor+1 {
					t.Errorf("%s after a promote with floor %d: token %d, want %d", name, floor, r.Lease.Token, floor+1)
				}
			}
		}
	})
	t.Run("format 6 ignores it", func(t *testing.T) {
		s := setup(t, FloorFormat-1)
		if r := grant(t, s, "idle", 10); r.Lease.Token != 2 {
			t.Errorf("under format %d a promote's floor moved a token to %d, want 2", FloorFormat-1, r.Lease.Token)
		}
	})
	t.Run("a floor with no token left is refused", func(t *testing.T) {
		s := New()
		s.Apply(Command{Op: OpSetFormat, Format: FloorFormat})
		if r := s.Apply(Command{Op: OpPromote, Token: fence.MaxToken}); r.Outcome != Invalid {
			t.Fatalf("promote with floor MaxToken: %v, want Invalid", r.Outcome)
		}
		if r := grant(t, s, "a", 1); r.Lease.Token != 1 {
			t.Errorf("after a refused promote the first token is %d, want 1", r.Lease.Token)
		}
	})
}

// TestEndClosesToken (invariant 9): from CloseFormat on, a release or an
// expiry consumes the scope's next token value, granted to nobody, and
// its event carries it; the next grant, a waiter's at once included, is
// above it. Below it nothing is consumed, as the builds before it did,
// so that replicas of both builds agree until the format is raised.
func TestEndClosesToken(t *testing.T) {
	closed := func(kind EventKind, scope string, l Lease, closing uint64) Event {
		e := ev(kind, scope, l)
		e.Closing = closing
		return e
	}
	setup := func(format int) *State {
		s := New()
		s.Apply(Command{Op: OpSetFormat, Format: format})
		return s
	}
	type step struct {
		c    Command
		want []Event
	}
	for _, tc := range []struct {
		name   string
		format int
		steps  []step
	}{
		{"release", CloseFormat, []step{
			{acquire("a", 1), []Event{ev(EventGranted, "a", leaseOf(1, 1))}},
			{release("a", 1), []Event{closed(EventReleased, "a", leaseOf(1, 1), 2)}},
			{acquire("a", 2), []Event{ev(EventGranted, "a", leaseOf(2, 3))}},
		}},
		{"expiry", CloseFormat, []step{
			{acquire("a", 1), []Event{ev(EventGranted, "a", leaseOf(1, 1))}},
			{expire("a", 1), []Event{closed(EventExpired, "a", leaseOf(1, 1), 2)}},
			{acquire("a", 2), []Event{ev(EventGranted, "a", leaseOf(2, 3))}},
		}},
		{"expire many", CloseFormat, []step{
			{acquire("a", 1), []Event{ev(EventGranted, "a", leaseOf(1, 1))}},
			{acquire("b", 2), []Event{ev(EventGranted, "b", leaseOf(2, 1))}},
			{Command{Op: OpExpireMany, Expiries: []Expiry{{"a", 1}, {"b", 1}}},
				[]Event{closed(EventExpired, "a", leaseOf(1, 1), 2), closed(EventExpired, "b", leaseOf(2, 1), 2)}},
		}},
		{"a waiter granted at once", CloseFormat, []step{
			{acquire("a", 1), []Event{ev(EventGranted, "a", leaseOf(1, 1))}},
			{acquire("a", 2, wait), nil},
			{release("a", 1), []Event{closed(EventReleased, "a", leaseOf(1, 1), 2), ev(EventGranted, "a", leaseOf(2, 3))}},
			{cancel("a", 2), []Event{closed(EventReleased, "a", leaseOf(2, 3), 4)}},
		}},
		{"in a batch", CloseFormat, []step{
			{acquire("a", 1), []Event{ev(EventGranted, "a", leaseOf(1, 1))}},
			{Command{Op: OpBatch, Commands: []Command{release("a", 1), acquire("a", 2)}},
				[]Event{closed(EventReleased, "a", leaseOf(1, 1), 2), ev(EventGranted, "a", leaseOf(2, 3))}},
		}},
		{"after a token floor", CloseFormat, []step{
			{acquire("a", 1), []Event{ev(EventGranted, "a", leaseOf(1, 1))}},
			{Command{Op: OpPromote, Token: 100}, nil},
			{release("a", 1), []Event{closed(EventReleased, "a", leaseOf(1, 1), 101)}},
			{acquire("a", 2), []Event{ev(EventGranted, "a", leaseOf(2, 102))}},
		}},
		{"format 7 closes nothing", CloseFormat - 1, []step{
			{acquire("a", 1), []Event{ev(EventGranted, "a", leaseOf(1, 1))}},
			{acquire("a", 2, wait), nil},
			{release("a", 1), []Event{ev(EventReleased, "a", leaseOf(1, 1)), ev(EventGranted, "a", leaseOf(2, 2))}},
			{expire("a", 2), []Event{ev(EventExpired, "a", leaseOf(2, 2))}},
			{acquire("a", 3), []Event{ev(EventGranted, "a", leaseOf(3, 3))}},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := setup(tc.format)
			for i, st := range tc.steps {
				r := s.Apply(st.c)
				if r.Outcome == Invalid {
					t.Fatalf("step %d: %v", i, r.Err)
				}
				if diff := cmp.Diff(st.want, r.Events, cmpopts.EquateEmpty()); diff != "" {
					t.Fatalf("step %d: %+v: events (-want +got):\n%s", i, st.c, diff)
				}
			}
		})
	}

	t.Run("the counter holds the closing", func(t *testing.T) {
		// Get reports it as Last, a snapshot keeps it, and a scope
		// whose idle record is dropped starts above it.
		s := setup(CloseFormat)
		s.keepIdle = 0
		s.Apply(acquire("kept", 1))
		s.Apply(acquire("kept", 2, wait))
		s.Apply(release("kept", 1)) // closes 1 with 2, grants 3
		s.Apply(acquire("dropped", 3))
		s.Apply(release("dropped", 3)) // closes 1 with 2, dropped into the floor
		if _, ok := s.scopes["dropped"]; ok {
			t.Fatal("the idle record was kept")
		}
		if got := s.Get("dropped").Last; got != 2 {
			t.Errorf("a dropped scope reports last %d, want its closing 2", got)
		}
		restored, err := Restore(s.Snapshot())
		if err != nil {
			t.Fatal(err)
		}
		restored.keepIdle = 0
		for _, st := range []*State{s, restored} {
			if r := st.Apply(acquire("dropped", 4)); r.Lease.Token != 3 {
				t.Errorf("a dropped scope acquired again: token %d, want 3, above its closing 2", r.Lease.Token)
			}
			if r := st.Apply(release("kept", 2)); len(r.Events) != 1 || r.Events[0].Closing != 4 {
				t.Errorf("release of token 3: %+v, want closing 4", r.Events)
			}
		}
	})

	t.Run("a retry after the end", func(t *testing.T) {
		// A retried acquire whose lease ended answers lost, the scope
		// free (Current 0: a closing is no lease); a new acquire is
		// granted above the closing.
		s := setup(CloseFormat)
		s.Apply(acquire("a", 1, reqID("r")))
		s.Apply(release("a", 1))
		r := s.Apply(acquire("a", 9, as(1), reqID("r")))
		if r.Outcome != Lost || r.Lease.Token != 1 || r.Current != 0 {
			t.Errorf("retry after release: %v token %d current %d, want lost token 1 current 0", r.Outcome, r.Lease.Token, r.Current)
		}
		if r := s.Apply(acquire("a", 2, reqID("q"))); r.Outcome != Granted || r.Lease.Token != 3 {
			t.Errorf("acquire after the retry: %v token %d, want granted 3", r.Outcome, r.Lease.Token)
		}
		if r := s.Apply(acquire("a", 9, as(1), reqID("r"))); r.Outcome != Lost || r.Current != 3 {
			t.Errorf("retry while another holds it: %v current %d, want lost current 3", r.Outcome, r.Current)
		}
	})

	t.Run("near the maximum", func(t *testing.T) {
		// A lease of MaxToken-1 closes with MaxToken, and its waiters,
		// left with no token, are cancelled; a lease of MaxToken closes
		// nothing: no value is left, which the event shows as 0.
		s := mustRestore(t, fmt.Sprintf(`{"scopes":[{"scope":"a","last":%d},{"scope":"b","last":%d}]}`, fence.MaxToken-2, fence.MaxToken-1))
		s.Apply(Command{Op: OpSetFormat, Format: CloseFormat})
		s.Apply(acquire("a", 1))
		s.Apply(acquire("a", 2, wait))
		r := s.Apply(release("a", 1))
		want := []Event{closed(EventReleased, "a", leaseOf(1, fence.MaxToken-1), fence.MaxToken), ev(EventCancelled, "a", waiterOf(2))}
		if diff := cmp.Diff(want, r.Events); diff != "" {
			t.Errorf("release of MaxToken-1 with a waiter (-want +got):\n%s", diff)
		}
		if r := s.Apply(acquire("a", 3)); r.Outcome != Exhausted {
			t.Errorf("acquire after the closing took MaxToken: %v, want exhausted", r.Outcome)
		}
		s.Apply(acquire("b", 4))
		r = s.Apply(expire("b", fence.MaxToken))
		if want := []Event{ev(EventExpired, "b", leaseOf(4, fence.MaxToken))}; !cmp.Equal(want, r.Events) {
			t.Errorf("expiry of MaxToken: %+v, want no closing", r.Events)
		}
	})
}
