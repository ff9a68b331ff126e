package history

import (
	"bytes"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// story builds a history by hand; each call is one time step later.
type story struct {
	evs []Event
	t   int64
	ops map[string]int64
}

func newStory() *story { return &story{ops: map[string]int64{}} }

func (s *story) add(e Event) Event {
	s.t += 10
	e.Mono = s.t
	s.evs = append(s.evs, e)
	return e
}

// call invokes an operation of proc and returns its number.
func (s *story) call(proc, f, scope string, token, seq uint64, value, from string) int64 {
	s.ops[proc]++
	op := s.ops[proc]
	s.add(Event{Type: Invoke, Proc: proc, Op: op, F: f, Scope: scope, Token: token, Seq: seq, Value: value, From: from})
	return op
}

func (s *story) done(proc string, op int64, t Type, token uint64, value, reason string) {
	s.add(Event{Type: t, Proc: proc, Op: op, Token: token, Value: value, Reason: reason})
}

// grant acquires scope for proc with token.
func (s *story) grant(proc, scope string, token uint64) {
	op := s.call(proc, Acquire, scope, 0, 0, "", "")
	s.done(proc, op, OK, token, "", "")
}

// rmw reads from and writes a new value with token; the resource logs
// both at the given indexes unless the guard refuses them (stale).
func (s *story) rmw(proc, scope string, token uint64, from string, index uint64, stale bool) string {
	op := s.call(proc, Read, scope, token, 1, "", "")
	if stale {
		s.done(proc, op, Fail, 0, "", ReasonStale)
		return from
	}
	s.add(Event{Type: Applied, Proc: "resource", F: Read, Scope: scope, Token: token, Seq: 1, Index: index, Ref: OpID(proc, op), Value: from})
	s.done(proc, op, OK, 0, from, "")
	return s.write(proc, scope, token, from, index+1)
}

func (s *story) write(proc, scope string, token uint64, from string, index uint64) string {
	op := s.call(proc, Write, scope, token, 2, "", from)
	v := version(from) + "/" + OpID(proc, op)
	s.evs[len(s.evs)-1].Value = v
	s.add(Event{Type: Applied, Proc: "resource", F: Write, Scope: scope, Token: token, Seq: 2, Index: index, Ref: OpID(proc, op), Value: v})
	s.done(proc, op, OK, 0, v, "")
	return v
}

func version(from string) string {
	if from == "" {
		return "1"
	}
	n, _ := strconv.Atoi(from[:strings.IndexByte(from, '/')])
	return strconv.Itoa(n + 1)
}

func (s *story) final(scope, value string, token uint64) {
	s.add(Event{Type: Final, Proc: "checker", Scope: scope, Value: value, Token: token})
}

func kinds(t *testing.T, evs []Event) map[string]int {
	t.Helper()
	r := Check(evs, Options{})
	var b bytes.Buffer
	r.Write(&b)
	t.Log("\n" + b.String())
	if !strings.HasSuffix(b.String(), "anomalies: "+strconv.Itoa(r.Count())+"\n") {
		t.Errorf("the report does not end with the anomaly count %d", r.Count())
	}
	return r.Kinds()
}

func TestCleanHistory(t *testing.T) {
	s := newStory()
	s.grant("w1", "a", 1)
	v := s.rmw("w1", "a", 1, "", 1, false)
	s.grant("w2", "a", 2)
	v = s.rmw("w2", "a", 2, v, 3, false)
	s.rmw("w1", "a", 1, v, 0, true) // the paused holder comes back: refused
	s.grant("w1", "a", 3)
	v = s.rmw("w1", "a", 3, v, 5, false)
	s.final("a", v, 3)
	if got := kinds(t, s.evs); len(got) != 0 {
		t.Errorf("anomalies in a clean history: %v", got)
	}
}

// TestPauseUnguarded is the paused holder whose write lands: check 1 sees
// the token fall in the resource's log and in real time, check 3 finds no
// linearization, and check 4 finds w2's acknowledged write lost.
func TestPauseUnguarded(t *testing.T) {
	s := newStory()
	s.grant("w1", "a", 1)
	op := s.call("w1", Read, "a", 1, 1, "", "")
	s.add(Event{Type: Applied, Proc: "resource", F: Read, Scope: "a", Token: 1, Seq: 1, Index: 1, Ref: "w1.2"})
	s.done("w1", op, OK, 0, "", "")
	// w1 pauses; its lease expires
	s.grant("w2", "a", 2)
	v := s.rmw("w2", "a", 2, "", 2, false)
	final := s.write("w1", "a", 1, "", 4) // w1 resumes and writes what it computed before
	s.final("a", final, 2)
	want := map[string]int{StaleAccepted: 1, NotLinearizable: 1, LostWrite: 1}
	if diff := cmp.Diff(want, kinds(t, s.evs)); diff != "" {
		t.Errorf("anomalies (-want +got):\n%s", diff)
	}
	_ = v
}

// TestDelayedUnguarded is the t0–t5 story: w1's write is held in the
// network past its lease and lands after w2's; its outcome is unknown to
// w1, and the final value shows it took effect.
func TestDelayedUnguarded(t *testing.T) {
	s := newStory()
	s.grant("w1", "a", 7)
	op := s.call("w1", Write, "a", 7, 1, "1/w1.2", "")
	s.grant("w2", "a", 8)
	s.rmw("w2", "a", 8, "", 1, false)
	s.add(Event{Type: Applied, Proc: "resource", F: Write, Scope: "a", Token: 7, Seq: 1, Index: 3, Ref: "w1.2", Value: "1/w1.2"})
	s.done("w1", op, Info, 0, "", ReasonTimeout)
	s.final("a", "1/w1.2", 8)
	want := map[string]int{StaleAccepted: 1, NotLinearizable: 1, LostWrite: 1}
	if diff := cmp.Diff(want, kinds(t, s.evs)); diff != "" {
		t.Errorf("anomalies (-want +got):\n%s", diff)
	}
}

// TestUnknownWrites: a write of unknown outcome may or may not have taken
// effect; neither is an anomaly.
func TestUnknownWrites(t *testing.T) {
	for _, applied := range []bool{false, true} {
		s := newStory()
		s.grant("w1", "a", 1)
		op := s.call("w1", Write, "a", 1, 1, "1/w1.2", "")
		s.done("w1", op, Info, 0, "", ReasonTimeout)
		final := ""
		if applied {
			final = "1/w1.2"
			s.add(Event{Type: Applied, Proc: "resource", F: Write, Scope: "a", Token: 1, Seq: 1, Index: 1, Ref: "w1.2", Value: final})
		}
		s.grant("w2", "a", 2)
		v := s.rmw("w2", "a", 2, final, 2, false)
		s.final("a", v, 2)
		if got := kinds(t, s.evs); len(got) != 0 {
			t.Errorf("applied=%v: anomalies %v", applied, got)
		}
	}
}

// TestStaleAckInRealTime: without the resource's log, real time alone
// shows a token accepted after a greater one was acknowledged.
func TestStaleAckInRealTime(t *testing.T) {
	s := newStory()
	op := s.call("w2", Read, "a", 5, 1, "", "")
	s.done("w2", op, OK, 0, "", "")
	op = s.call("w1", Read, "a", 4, 1, "", "")
	s.done("w1", op, OK, 0, "", "")
	want := map[string]int{StaleAccepted: 1}
	if diff := cmp.Diff(want, kinds(t, s.evs)); diff != "" {
		t.Errorf("anomalies (-want +got):\n%s", diff)
	}
}

func TestGrants(t *testing.T) {
	s := newStory()
	s.grant("w1", "a", 1)
	s.grant("w2", "a", 3)
	s.grant("w3", "a", 2) // after 3 was granted: out of order
	s.grant("w1", "a", 3) // a second 3
	s.grant("w1", "b", 1)
	s.final("a", "", 3)
	s.final("b", "", 0) // the service forgot b's grant
	want := map[string]int{GrantOrder: 1, DuplicateGrant: 1, GrantLost: 1}
	if diff := cmp.Diff(want, kinds(t, s.evs)); diff != "" {
		t.Errorf("anomalies (-want +got):\n%s", diff)
	}
}

// TestGrantsAcrossARestore: tokens that jump at each taking of office (the
// token floor) pass; a node put back to an older copy that grants again
// from the counters of the copy is caught, by the repeated token, by the
// lower token after a higher one, and by a last token below one granted.
func TestGrantsAcrossARestore(t *testing.T) {
	s := newStory()
	s.grant("w1", "a", 1_000_001)
	s.grant("w2", "a", 1_000_002)
	s.grant("w1", "a", 9_000_001) // a new leader's floor
	s.final("a", "", 9_000_001)
	if got := kinds(t, s.evs); len(got) != 0 {
		t.Errorf("tokens above a token floor: anomalies %v", got)
	}
	s = newStory()
	s.grant("w1", "a", 1_000_001)
	s.grant("w2", "a", 1_000_002)
	s.grant("w3", "a", 1_000_003)
	// put back to a copy taken after the first grant; no floor
	s.grant("w1", "a", 1_000_002)
	s.final("a", "", 1_000_002)
	want := map[string]int{DuplicateGrant: 1, GrantOrder: 1, GrantLost: 1}
	if diff := cmp.Diff(want, kinds(t, s.evs)); diff != "" {
		t.Errorf("a restore that forgot grants: anomalies (-want +got):\n%s", diff)
	}
}

// TestConcurrentGrants: grants whose calls overlap may complete in any
// order.
func TestConcurrentGrants(t *testing.T) {
	s := newStory()
	a := s.call("w1", Acquire, "a", 0, 0, "", "")
	b := s.call("w2", Acquire, "a", 0, 0, "", "")
	s.done("w2", b, OK, 2, "", "")
	s.done("w1", a, OK, 1, "", "")
	if got := kinds(t, s.evs); len(got) != 0 {
		t.Errorf("anomalies %v", got)
	}
}

func TestLostAndUnexplained(t *testing.T) {
	s := newStory()
	s.grant("w1", "a", 1)
	s.rmw("w1", "a", 1, "", 1, false)
	s.final("a", "", 1) // the register forgot the write: a crash that lost data
	s.grant("w1", "b", 1)
	s.final("b", "9/nobody.1", 1)
	got := kinds(t, s.evs)
	if got[LostWrite] != 1 || got[UnexplainedValue] != 1 {
		t.Errorf("anomalies %v, want a lost write and an unexplained value", got)
	}
}

func TestWriterAndDecode(t *testing.T) {
	path := filepath.Join(t.TempDir(), "h.jsonl")
	w, err := Create(path)
	if err != nil {
		t.Fatal(err)
	}
	e := w.Add(Event{Type: Invoke, Proc: "w1", Op: 1, F: Read, Scope: "a", Token: 3})
	if e.Mono == 0 || e.Wall.IsZero() {
		t.Errorf("Add did not stamp the time: %+v", e)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	evs, err := ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 1 || evs[0].Token != 3 || !evs[0].Wall.Equal(e.Wall) {
		t.Errorf("read back %+v, want %+v", evs, e)
	}
	// A torn last line is ignored; a torn line in the middle is not.
	if evs, err := Decode(strings.NewReader(`{"type":"fault","proc":"nemesis"}` + "\n" + `{"type":"fa`)); err != nil || len(evs) != 1 {
		t.Errorf("torn last line: %v, %v", evs, err)
	}
	if _, err := Decode(strings.NewReader(`{"type":"fa` + "\n" + `{"type":"fault"}` + "\n")); err == nil {
		t.Error("a torn line in the middle was accepted")
	}
}

func TestNowIsMonotonicAcrossCalls(t *testing.T) {
	_, a := Now()
	_, b := Now()
	if b < a {
		t.Errorf("CLOCK_MONOTONIC went back: %d then %d", a, b)
	}
}
