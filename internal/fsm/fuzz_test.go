package fsm

import (
	"bytes"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func FuzzDecodeCommand(f *testing.F) {
	for _, c := range []Command{
		acq("a/b", 1, wait, req("r")), rel("a", 2), exp("a", 7), cancelCmd("a", 3), {Op: OpPromote, At: 5},
	} {
		f.Add(c.Encode())
	}
	f.Add([]byte(`{"op":"acquire","scope":"a","lease_id":"00000000000000000000000000000001","ttl":-1}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := DecodeCommand(b)
		if err != nil {
			return
		}
		again, err := DecodeCommand(c.Encode())
		if err != nil {
			t.Fatalf("re-decoding an accepted command: %v", err)
		}
		if diff := cmp.Diff(c, again); diff != "" {
			t.Fatalf("round trip (-first +second):\n%s", diff)
		}
		s := New()
		s.Apply(acq("a", 9))
		if r := s.Apply(c); r.Outcome == Invalid {
			t.Fatalf("a decoded command was invalid to Apply: %v", r.Err)
		}
	})
}

func FuzzRestore(f *testing.F) {
	f.Add(New().Snapshot())
	f.Add(applyAll(New(), randomLog(3, 50)).Snapshot())
	s := New()
	s.Apply(acq("a", 1))
	s.Apply(Command{Op: OpAcquire, Scope: "a", LeaseID: id(2), TTL: time.Second, Wait: true})
	f.Add(s.Snapshot())
	f.Fuzz(func(t *testing.T, b []byte) {
		st, err := Restore(b)
		if err != nil {
			return
		}
		snap := st.Snapshot()
		again, err := Restore(snap)
		if err != nil {
			t.Fatalf("re-restoring an accepted snapshot: %v", err)
		}
		if !bytes.Equal(again.Snapshot(), snap) {
			t.Fatal("snapshot round trip changed the bytes")
		}
	})
}
