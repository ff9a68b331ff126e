package fsm

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"

	"github.com/fence-dev/fence"
)

// FuzzRestoreCorrupted edits a real snapshot with a script of byte
// changes, insertions, deletions and a truncation. Whatever the edits, the
// edited snapshot is refused whole, or (a change that keeps the meaning,
// like the case of a checksum digit) restores exactly the original state:
// never a state with a lower counter, a lost lease or a dropped scope.
//
// The script is read four bytes at a time: an operation, a position
// (big-endian uint16, modulo the length) and a byte.
func FuzzRestoreCorrupted(f *testing.F) {
	f.Add([]byte{0, 0, 40, 'x'})                   // change a body byte
	f.Add([]byte{3, 0, 100, 0})                    // truncate
	f.Add([]byte{0, 0, 30, 'A', 0, 0, 31, 'B'})    // checksum digits to upper case
	f.Add([]byte{1, 0, 50, ' ', 2, 0, 80, 0})      // insert a space, delete a byte
	f.Add([]byte{0, 0, 60, '9', 0, 0, 61, '9', 3}) // two changes and a cut
	bases := [][]byte{richState(f).Snapshot(), func() []byte {
		s := New()
		applyAll(s, randomLog(4, 120))
		return s.Snapshot()
	}()}
	f.Fuzz(func(t *testing.T, script []byte) {
		for _, base := range bases {
			bad := edit(base, script)
			if bytes.Equal(bad, base) {
				continue
			}
			st, err := Restore(bad)
			if err != nil {
				if st != nil {
					t.Fatal("Restore returned a state with its error")
				}
				continue
			}
			if got := st.Snapshot(); !bytes.Equal(got, base) {
				t.Fatalf("an edited snapshot restored to another state:\nedited   %q\nrestored %s\noriginal %s", bad, got, base)
			}
		}
	})
}

// edit applies a FuzzRestoreCorrupted script to a copy of b.
func edit(b, script []byte) []byte {
	out := bytes.Clone(b)
	for len(script) >= 4 && len(out) > 0 {
		op, pos, v := script[0]%4, int(binary.BigEndian.Uint16(script[1:3]))%len(out), script[3]
		script = script[4:]
		switch op {
		case 0:
			out[pos] = v
		case 1:
			out = append(out[:pos], append([]byte{v}, out[pos:]...)...)
		case 2:
			out = append(out[:pos], out[pos+1:]...)
		case 3:
			out = out[:pos]
		}
	}
	if len(script) > 0 && len(out) > 0 { // a short tail truncates
		out = out[:int(script[0])%len(out)]
	}
	return out
}

// FuzzApplyLog decodes a log of commands, one per line, as a replica
// would, and applies the accepted ones on top of a state with held, queued,
// released, expired and exhausted scopes. After every command: no counter
// is lower than before, a grant takes exactly the next token, and a command
// answered invalid changed nothing. At the end the state survives a
// snapshot round trip, and replaying the same log on a fresh copy gives
// the same bytes.
func FuzzApplyLog(f *testing.F) {
	for _, log := range [][]Command{
		{acquire("a", 9, reqID("r1")), release("a", 2), expire("a", 2), acquire("a", 9, wait)},
		{acquire("a", 9, reqID("r2")), acquire("a", 9, reqID("r2"), as(2)), cancel("a", 3)},
		{acquire("z/exhausted", 9), acquire("c", 9, wait), promote, acquire("b/2", 9, wait), release("b/2", 5)},
		{{Op: OpSetNode, Node: "n2", Addr: "h:1"}, {Op: OpForgetNode, Node: "n2"}, {Op: OpSetNode, Node: "n2", Addr: "h:2"}},
		{{Op: OpSetFormat, Format: 2}, release("a", 2), acquire("a", 9), acquire("new", 8), release("new", 8), acquire("new", 7)},
	} {
		var b []byte
		for _, c := range log {
			b = append(append(b, c.Encode()...), '\n')
		}
		f.Add(b)
	}
	f.Add([]byte("{\"op\":\"acquire\",\"scope\":\"a\",\"lease_id\":\"f0000000000000000000000000000009\",\"holder\":\"x\",\"ttl\":1,\"request_id\":\"r1\"}\n{\"op\":\"promote\"}\n"))
	f.Fuzz(func(t *testing.T, log []byte) {
		s := richState(t)
		s.keepIdle = 1 // so that a short log drops records
		// ever is every scope's highest token over the whole log, which
		// outlives a record the state drops.
		ever := map[string]uint64{}
		for _, name := range s.sortedScopes("") {
			ever[name] = s.Get(name).Last
		}
		var accepted []Command
		for line := range bytes.Lines(log) {
			c, err := DecodeCommand(line)
			if err != nil {
				continue
			}
			accepted = append(accepted, c)
			before := s.Snapshot()
			last := map[string]uint64{}
			for _, name := range s.sortedScopes("") {
				last[name] = s.Get(name).Last
			}
			floor := s.floor
			r := s.Apply(c)
			for name, l := range last {
				if _, kept := s.scopes[name]; !kept {
					if s.floor < l {
						t.Fatalf("%s dropped %q at counter %d, above the floor %d", line, name, l, s.floor)
					}
				} else if now := s.Get(name).Last; now < l {
					t.Fatalf("%s lowered the counter of %q from %d to %d", line, name, l, now)
				}
			}
			for _, e := range r.Events {
				if e.Kind != EventGranted {
					continue
				}
				if e.Lease.Token != s.Get(e.Scope).Last {
					t.Fatalf("%s granted %q token %d, but its counter is %d", line, e.Scope, e.Lease.Token, s.Get(e.Scope).Last)
				}
				prev, known := last[e.Scope]
				if !known {
					prev = floor // created: it starts at the floor
				}
				if e.Lease.Token != prev+1 {
					t.Fatalf("%s granted %q token %d after counter %d", line, e.Scope, e.Lease.Token, prev)
				}
				if e.Lease.Token <= ever[e.Scope] {
					t.Fatalf("%s granted %q token %d, not above its earlier token %d", line, e.Scope, e.Lease.Token, ever[e.Scope])
				}
				ever[e.Scope] = e.Lease.Token
			}
			if r.Outcome == Invalid {
				var ie *fence.InvalidError
				if !errors.As(r.Err, &ie) {
					t.Fatalf("%s: invalid without an InvalidError: %v", line, r.Err)
				}
				if after := s.Snapshot(); !bytes.Equal(after, before) {
					t.Fatalf("%s was invalid (%v) but changed the state", line, r.Err)
				}
			}
		}
		checkRestore(t, s.Snapshot())
		again := richState(t)
		again.keepIdle = s.keepIdle
		applyAll(again, accepted)
		if !bytes.Equal(again.Snapshot(), s.Snapshot()) {
			t.Fatalf("replaying the log gave another state:\n%s\n%s", again.Snapshot(), s.Snapshot())
		}
	})
}
