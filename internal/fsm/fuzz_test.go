package fsm

import (
	"bytes"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// The seed corpora are in testdata/fuzz/FuzzDecodeCommand and
// testdata/fuzz/FuzzRestore; the seeds below come on top.

func FuzzDecodeCommand(f *testing.F) {
	for _, c := range []Command{
		acquire("a/b", 1, wait, reqID("r"), at(5)),
		release("a", 1),
		expire("a", 1),
		cancel("a", 2),
		{Op: OpPromote, At: 5},
		{Op: OpSetFormat, Format: 2},
	} {
		f.Add(c.Encode())
		f.Add(c.EncodeFor(BinaryFormat))
	}
	f.Add(batchOf(acquire("a", 1), release("b", 2)).EncodeFor(BinaryFormat))
	f.Add([]byte(`{"op":"acquire","scope":"a","lease_id":"00000000000000000000000000000001","ttl":-1}`))
	f.Add([]byte(`{"op":"promote"}}`))
	f.Add([]byte(`{"OP":"expire","Scope":"a","token":9223372036854775807}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := DecodeCommand(b)
		if err != nil {
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("DecodeCommand returned a command that does not validate: %v", err)
		}
		enc := c.Encode()
		again, err := DecodeCommand(enc)
		if err != nil {
			t.Fatalf("the log form %s of an accepted command does not decode: %v", enc, err)
		}
		if diff := cmp.Diff(c, again); diff != "" {
			t.Fatalf("round trip through %s (-first +second):\n%s", enc, diff)
		}
		if !bytes.Equal(again.Encode(), enc) {
			t.Fatalf("the log form is not stable: %s, then %s", enc, again.Encode())
		}
		bin := c.EncodeFor(BinaryFormat)
		if again, err := DecodeCommand(bin); err != nil || !cmp.Equal(c, again) {
			t.Fatalf("the binary form %x of an accepted command decodes to %+v, %v", bin, again, err)
		}
		// Applying it never panics and never finds it invalid: on a fresh
		// state, and on one where its scope is held, with a waiter. A
		// batch needs the log format that has batches, and one with a
		// waiting acquire the format that allows that.
		fresh := func() *State {
			s := New()
			if c.Op == OpBatch {
				s.Apply(Command{Op: OpSetFormat, Format: WaitBatchFormat})
			}
			return s
		}
		if r := fresh().Apply(c); r.Outcome == Invalid {
			t.Fatalf("Apply of a decoded command on a fresh state: invalid: %v", r.Err)
		}
		s := fresh()
		if c.Scope != "" {
			s.Apply(acquire(c.Scope, 1, reqID("r")))
			s.Apply(acquire(c.Scope, 2, wait))
		}
		if r := s.Apply(c); r.Outcome == Invalid && !(c.RequestID == "r" && c.Holder != holder(1)) {
			// Only the request ID of the setup's lease, from another
			// holder, is refused.
			t.Fatalf("Apply of a decoded command on a held scope: invalid: %v", r.Err)
		}
		s.Check(c.Scope, c.LeaseID)
	})
}

func FuzzRestore(f *testing.F) {
	f.Add(New().Snapshot())
	f.Add(richState(f).Snapshot())
	s := New()
	applyAll(s, randomLog(3, 60))
	f.Add(s.Snapshot())
	f.Add(frame(`{"scopes":[{"scope":"a","last":1,"lease":` + leaseJSON(1, 2) + `}]}`))
	f.Add(frame(`{"scopes":[]} x`))
	f.Add(frame(`{"scopes":[{"scope":"a","last":2},{"scope":"b","last":9223372036854775807}],"format":2,"floor":7,"idle":["a"]}`))
	f.Add([]byte(`{"scopes":[{"scope":"a","last":3,"lease":` + leaseJSON(1, 3) + `,"waiters":[` + waiterJSON(2) + `]}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		// The input as it is, and framed with a valid checksum so that the
		// fuzzer gets past the checksum to the record checks.
		checkRestore(t, b)
		checkRestore(t, frame(string(b)))
	})
}

// checkRestore restores b, if it is a snapshot at all, and checks what it
// got.
func checkRestore(t testing.TB, b []byte) {
	t.Helper()
	st, err := Restore(b)
	if err != nil {
		if st != nil {
			t.Fatal("Restore returned a state with its error")
		}
		return
	}
	snap := st.Snapshot()
	again, err := Restore(snap)
	if err != nil {
		t.Fatalf("the snapshot of a restored state does not restore: %v\n%s", err, snap)
	}
	if !bytes.Equal(again.Snapshot(), snap) {
		t.Fatalf("Snapshot→Restore→Snapshot changed the bytes:\n%s\n%s", snap, again.Snapshot())
	}
	// Whatever was restored keeps its counters: a grant of any scope
	// takes the token above its counter, or none at all.
	for _, name := range st.sortedScopes("") {
		last := st.Get(name).Last
		r := st.Apply(Command{Op: OpAcquire, Scope: name, LeaseID: lid(0xff), TTL: time.Second})
		switch r.Outcome {
		case Granted:
			if r.Lease.Token != last+1 {
				t.Fatalf("%s: counter %d, granted token %d", name, last, r.Lease.Token)
			}
		case Held, Exhausted:
		default:
			t.Fatalf("%s: acquire = %v", name, r.Outcome)
		}
		st.Apply(Command{Op: OpPromote})
		for scope, l := range st.Leases() {
			st.Apply(expire(scope, l.Token))
		}
	}
}
