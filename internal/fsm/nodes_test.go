package fsm

import (
	"errors"
	"maps"
	"strings"
	"testing"

	"github.com/fence-dev/fence"
)

func TestNodesAreRecordedAndRemovedForGood(t *testing.T) {
	s := New()
	for _, c := range []Command{
		{Op: OpSetNode, Node: "n1", Addr: "127.0.0.1:7481"},
		{Op: OpSetNode, Node: "n2", Addr: "127.0.0.1:7482"},
		{Op: OpSetNode, Node: "n1", Addr: "127.0.0.1:7491"}, // moved
	} {
		if r := s.Apply(c); r.Outcome != NoOp {
			t.Fatalf("%+v: %v %v", c, r.Outcome, r.Err)
		}
	}
	want := map[string]string{"n1": "127.0.0.1:7491", "n2": "127.0.0.1:7482"}
	if got := s.Nodes(); !maps.Equal(got, want) {
		t.Fatalf("Nodes() = %v, want %v", got, want)
	}
	s.Apply(Command{Op: OpForgetNode, Node: "n2"})
	if got := s.Nodes(); len(got) != 1 || !s.Removed("n2") || s.Removed("n1") {
		t.Fatalf("after forgetting n2: Nodes() = %v, Removed(n2) = %v", got, s.Removed("n2"))
	}
	r := s.Apply(Command{Op: OpSetNode, Node: "n2", Addr: "127.0.0.1:7482"})
	var inv *fence.InvalidError
	if r.Outcome != Invalid || !errors.As(r.Err, &inv) || !strings.Contains(inv.Reason, "was removed") {
		t.Fatalf("rejoin of a removed node = %v %v, want invalid: was removed", r.Outcome, r.Err)
	}
	if _, ok := s.Nodes()["n2"]; ok {
		t.Fatal("a refused rejoin recorded the node")
	}

	back, err := Restore(s.Snapshot())
	if err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(back.Nodes(), s.Nodes()) || !back.Removed("n2") {
		t.Fatalf("restored nodes %v removed(n2)=%v, want %v and true", back.Nodes(), back.Removed("n2"), s.Nodes())
	}
	if string(back.Snapshot()) != string(s.Snapshot()) {
		t.Fatal("restored state snapshots differently")
	}
}

func TestNodeCommandsAreValidated(t *testing.T) {
	for _, c := range []Command{
		{Op: OpSetNode, Node: "", Addr: "a:1"},
		{Op: OpSetNode, Node: "n 1", Addr: "a:1"},
		{Op: OpSetNode, Node: strings.Repeat("n", MaxNodeIDLen+1), Addr: "a:1"},
		{Op: OpSetNode, Node: "n1"},
		{Op: OpSetNode, Node: "n1", Addr: strings.Repeat("a", MaxAddrLen+1)},
		{Op: OpForgetNode},
	} {
		s := New()
		if r := s.Apply(c); r.Outcome != Invalid || !errors.Is(r.Err, fence.ErrInvalid) {
			t.Errorf("%+v = %v %v, want invalid", c, r.Outcome, r.Err)
		}
		if len(s.Nodes()) != 0 || len(s.removedList()) != 0 {
			t.Errorf("%+v changed the state", c)
		}
	}
}

func TestRestoreRefusesBadNodes(t *testing.T) {
	for _, body := range []string{
		`{"scopes":[],"nodes":{"n 1":"a:1"}}`,
		`{"scopes":[],"nodes":{"n1":""}}`,
		`{"scopes":[],"removed":[""]}`,
		`{"scopes":[],"nodes":{"n1":"a:1"},"removed":["n1"]}`,
	} {
		if st, err := Restore(frame(body)); err == nil {
			t.Errorf("Restore(%s) = %v, nil; want an error", body, st)
		}
	}
}
