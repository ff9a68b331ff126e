package history

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// eagerStory: scope "a" has no follower, "f" has one. In each, w1's lease
// of token 1 ends and its delayed write arrives 30 ns later; in "f" the
// follower has recorded the closing token 2 by then, in "a" nobody has
// written since. w2 then takes each scope with token 3.
func eagerStory(markF bool) *story {
	s := newStory()
	s.add(Event{Type: Meta, Proc: "fencecheck", Detail: `{"followed":["f"]}`})
	for _, scope := range []string{"a", "f"} {
		s.grant("w1", scope, 1)
		v := s.write("w1", scope, 1, "", 1)
		s.add(Event{Type: End, Proc: "fenced", F: "expired", Scope: scope, Token: 1, Closing: 2})
		if scope == "f" && markF {
			s.add(Event{Type: Applied, Proc: "resource", F: Mark, Scope: scope, Token: 2, Index: 2, Ref: "follower"})
			op := s.call("w1", Write, scope, 1, 3, "2/late", v)
			s.done("w1", op, Fail, 0, "", ReasonStale)
		} else {
			v = s.write("w1", scope, 1, v, 2)
		}
		s.grant("w2", scope, 3)
		s.final(scope, s.write("w2", scope, 3, v, 4), 3)
	}
	return s
}

func TestEagerWindows(t *testing.T) {
	s := eagerStory(true)
	r := Check(s.evs, Options{})
	var b bytes.Buffer
	r.Write(&b)
	t.Log("\n" + b.String())
	got := map[bool]Eager{}
	for _, g := range r.Eager {
		got[g.Followed] = g
	}
	// Steps are 10 ns. In "a" the mark passes token 1 at w2's write, 7
	// steps after the end (invoke, applied, ok of the late write; invoke,
	// ok of the grant; invoke, applied); in "f" at the follower's mark, the
	// next step.
	want := map[bool]Eager{
		false: {Scopes: []string{"a"}, Ends: 1, Windows: []time.Duration{70}, Late: []time.Duration{20}},
		true:  {Followed: true, Scopes: []string{"f"}, Ends: 1, Windows: []time.Duration{10}, Marks: 1},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("eager groups (-want +got):\n%s", diff)
	}
	if !strings.Contains(b.String(), "with a follower") || !strings.Contains(b.String(), "without a follower") {
		t.Errorf("the report does not show both groups")
	}
}

// TestEagerOpen: an end whose token the resource never refused is open,
// and counts its length up to the last event of the history.
func TestEagerOpen(t *testing.T) {
	s := newStory()
	s.grant("w1", "a", 1)
	s.write("w1", "a", 1, "", 1)
	s.add(Event{Type: End, Proc: "fenced", F: "released", Scope: "a", Token: 1, Closing: 2})
	s.final("a", "1/w1.2", 2)
	r := Check(s.evs, Options{})
	if len(r.Eager) != 1 || r.Eager[0].Open != 1 || !cmp.Equal(r.Eager[0].Windows, []time.Duration{10}) {
		t.Errorf("eager = %+v, want one open end of 10 ns", r.Eager)
	}
}

// TestLateBound: with a bound, a followed scope's write accepted after its
// lease ended, later than the bound, is check 5's anomaly; the scope
// without a follower is measured, never an anomaly.
func TestLateBound(t *testing.T) {
	s := eagerStory(false) // the follower recorded nothing: f's late write lands
	for _, tc := range []struct {
		bound time.Duration
		want  map[string]int
	}{
		{0, map[string]int{}},
		{50, map[string]int{}},
		{10, map[string]int{LateAccepted: 1}},
	} {
		r := Check(s.evs, Options{LateBound: tc.bound})
		if diff := cmp.Diff(tc.want, r.Kinds()); diff != "" {
			t.Errorf("bound %v: anomalies (-want +got):\n%s", tc.bound, diff)
		}
		if has5 := len(r.Checks) == 5; has5 != (tc.bound > 0) {
			t.Errorf("bound %v: %d checks", tc.bound, len(r.Checks))
		}
	}
}

// TestStaleAfterMark: a write accepted with a token below a mark the
// follower recorded before it is check 1's anomaly, as if a newer holder
// had written.
func TestStaleAfterMark(t *testing.T) {
	s := newStory()
	s.grant("w1", "a", 1)
	s.write("w1", "a", 1, "", 1)
	s.add(Event{Type: End, Proc: "fenced", F: "expired", Scope: "a", Token: 1, Closing: 2})
	s.add(Event{Type: Applied, Proc: "resource", F: Mark, Scope: "a", Token: 2, Index: 2, Ref: "follower"})
	v := s.write("w1", "a", 1, "1/w1.2", 3)
	s.final("a", v, 2)
	if got := kinds(t, s.evs); got[StaleAccepted] != 1 {
		t.Errorf("anomalies %v, want one %s", got, StaleAccepted)
	}
}
