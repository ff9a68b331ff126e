package fsm

import (
	"bytes"
	"flag"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

var update = flag.Bool("update", false, "rewrite testdata/snapshot-v1.golden")

// richState has a bit of everything a snapshot must carry: free and held
// scopes, waiters with and without request IDs, remembered grants, and a
// counter at the maximum.
func richState(tb testing.TB) *State {
	tb.Helper()
	s := mustRestore(tb, `{"scopes":[{"scope":"z/exhausted","last":9223372036854775807}]}`)
	for _, c := range []Command{
		acquire("a", 1, reqID("r1"), at(10)),
		acquire("a", 2, wait, reqID("r2"), at(20)),
		acquire("a", 3, wait, at(30)),
		release("a", 1, at(40)),
		acquire("b/1", 4, at(50)),
		expire("b/1", 1, at(60)),
		acquire("b/2", 5, func(c *Command) { c.Holder = "Jürgen's \"laptop\"" }),
		acquire("c", 6),
		acquire("c", 7, wait),
		cancel("c", 7),
	} {
		if r := s.Apply(c); r.Outcome == Invalid {
			tb.Fatalf("%+v: %v", c, r.Err)
		}
	}
	return s
}

// sameState compares what the queries report of two states.
func sameState(tb testing.TB, want, got *State) {
	tb.Helper()
	if diff := cmp.Diff(maps.Collect(want.Leases()), maps.Collect(got.Leases())); diff != "" {
		tb.Errorf("Leases (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(want.Held("", "", 0), got.Held("", "", 0)); diff != "" {
		tb.Errorf("Held (-want +got):\n%s", diff)
	}
	for _, name := range want.sortedScopes("") {
		if diff := cmp.Diff(want.Get(name), got.Get(name)); diff != "" {
			tb.Errorf("Get(%q) (-want +got):\n%s", name, diff)
		}
	}
}

func TestSnapshotRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name  string
		state func(testing.TB) *State
	}{
		{"empty", func(testing.TB) *State { return New() }},
		{"one lease", func(testing.TB) *State { s := New(); s.Apply(acquire("a", 1)); return s }},
		{"rich", richState},
		{"random log", func(testing.TB) *State { s := New(); applyAll(s, randomLog(7, 500)); return s }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := tc.state(t)
			snap := s.Snapshot()
			if !bytes.Equal(snap, s.Snapshot()) {
				t.Fatal("two snapshots of one state differ")
			}
			r, err := Restore(snap)
			if err != nil {
				t.Fatalf("Restore: %v\n%s", err, snap)
			}
			if got := r.Snapshot(); !bytes.Equal(got, snap) {
				t.Fatalf("Restore then Snapshot gives\n%s\nwant\n%s", got, snap)
			}
			sameState(t, s, r)
			// Both go on alike, and the restored state does not share
			// memory with the snapshot it came from.
			rest := randomLog(8, 200)
			if diff := diffResults(applyAll(s, rest), applyAll(r, rest)); diff != "" {
				t.Fatalf("the restored state goes on differently (-original +restored):\n%s", diff)
			}
			if !bytes.Equal(s.Snapshot(), r.Snapshot()) {
				t.Fatal("after the same commands, the original and the restored state differ")
			}
		})
	}
}

// TestSnapshotGolden pins the snapshot format: a snapshot written by an
// earlier build must restore, whole, in every later one. Run with -update
// only for a deliberate, backward-compatible change of the format.
func TestSnapshotGolden(t *testing.T) {
	path := filepath.Join("testdata", "snapshot-v1.golden")
	snap := richState(t).Snapshot()
	if *update {
		if err := os.WriteFile(path, snap, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	golden, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s, err := Restore(golden)
	if err != nil {
		t.Fatalf("the golden snapshot no longer restores: %v", err)
	}
	if !bytes.Equal(s.Snapshot(), golden) {
		t.Errorf("the golden snapshot restores to a state that encodes as\n%s\nwant\n%s", s.Snapshot(), golden)
	}
	if !bytes.Equal(snap, golden) {
		t.Errorf("the same commands now give the snapshot\n%s\nwant\n%s", snap, golden)
	}
}

// TestRestoreRefusesTruncation cuts a snapshot at every byte: each cut must
// be refused, whole.
func TestRestoreRefusesTruncation(t *testing.T) {
	s := New()
	applyAll(s, randomLog(1, 300))
	snap := s.Snapshot()
	if len(snap) < 1000 {
		t.Fatalf("the snapshot is only %d bytes; the test wants a moderately sized one", len(snap))
	}
	for n := range len(snap) {
		if st, err := Restore(snap[:n]); err == nil || st != nil {
			t.Fatalf("a snapshot cut to %d of %d bytes gave %v, %v; want nil and an error", n, len(snap), st, err)
		}
	}
}

// TestRestoreRefusesCorruption changes one byte at a time. The checksum
// refuses every change to the body. In the header a change is refused too,
// except one that keeps its meaning: ParseUint reads "A" and "a" alike, so
// upper-casing a hex digit of the checksum restores the very same state.
func TestRestoreRefusesCorruption(t *testing.T) {
	s := New()
	applyAll(s, randomLog(2, 200))
	snap := s.Snapshot()
	bodyStart := bytes.IndexByte(snap, '\n') + 1
	same := 0
	for i := range len(snap) {
		var repl []byte
		for bit := range 8 {
			repl = append(repl, snap[i]^1<<bit)
		}
		repl = append(repl, 0, ' ', '"', '0', '9', '}', 0xff)
		for _, b := range repl {
			if b == snap[i] {
				continue
			}
			bad := bytes.Clone(snap)
			bad[i] = b
			st, err := Restore(bad)
			switch {
			case err != nil && st != nil:
				t.Fatalf("byte %d = %q: Restore returned a state with its error", i, b)
			case i >= bodyStart && (err == nil || !strings.Contains(err.Error(), "checksum mismatch")):
				t.Fatalf("byte %d of the body = %q: Restore gave %v, want a checksum mismatch", i, b, err)
			case err == nil && !bytes.Equal(st.Snapshot(), snap):
				t.Fatalf("byte %d of the header = %q: accepted, and restored a different state", i, b)
			case err == nil:
				same++
			}
		}
	}
	t.Logf("%d bytes, %d single-byte changes in the header restore the same state", len(snap), same)
}

func TestRestoreRefusesInconsistentRecords(t *testing.T) {
	for _, tc := range []struct{ name, body string }{
		{"not JSON", `scopes`},
		{"a list", `[]`},
		{"unknown field", `{"scopes":[],"x":1}`},
		{"unknown scope field", `{"scopes":[{"scope":"a","last":1,"owner":"x"}]}`},
		{"bad scope", `{"scopes":[{"scope":"../a","last":1}]}`},
		{"empty scope", `{"scopes":[{"scope":"","last":1}]}`},
		{"duplicate scope", `{"scopes":[{"scope":"a","last":1},{"scope":"a","last":0}]}`},
		{"duplicate scope, apart", `{"scopes":[{"scope":"a","last":2},{"scope":"b","last":1},{"scope":"a","last":2}]}`},
		{"negative counter", `{"scopes":[{"scope":"a","last":-1}]}`},
		{"counter above the maximum token", `{"scopes":[{"scope":"a","last":9223372036854775808}]}`},
		{"lease token above the counter", `{"scopes":[{"scope":"a","last":1,"lease":` + leaseJSON(1, 2) + `}]}`},
		{"lease token above the counter, counter 0", `{"scopes":[{"scope":"a","last":0,"lease":` + leaseJSON(1, 1) + `}]}`},
		{"lease token 0", `{"scopes":[{"scope":"a","last":1,"lease":` + leaseJSON(1, 0) + `}]}`},
		{"lease without ID", `{"scopes":[{"scope":"a","last":1,"lease":{"token":1,"ttl":1}}]}`},
		{"lease with zero ID", `{"scopes":[{"scope":"a","last":1,"lease":{"token":1,"id":"00000000000000000000000000000000","ttl":1}}]}`},
		{"lease without TTL", `{"scopes":[{"scope":"a","last":1,"lease":{"token":1,"id":"` + lid(1).String() + `"}}]}`},
		{"waiters on a free scope", `{"scopes":[{"scope":"a","last":1,"waiters":[` + waiterJSON(2) + `]}]}`},
		{"waiters on a scope never granted", `{"scopes":[{"scope":"a","last":0,"waiters":[` + waiterJSON(2) + `]}]}`},
		{"waiter without ID", `{"scopes":[{"scope":"a","last":1,"lease":` + leaseJSON(1, 1) + `,"waiters":[{"ttl":1}]}]}`},
		{"waiter without TTL", `{"scopes":[{"scope":"a","last":1,"lease":` + leaseJSON(1, 1) + `,"waiters":[{"id":"` + lid(2).String() + `"}]}]}`},
		{"recent grant above the counter", `{"scopes":[{"scope":"a","last":1,"recent":[{"token":5,"id":"` + lid(1).String() + `"}]}]}`},
		{"recent grant token 0", `{"scopes":[{"scope":"a","last":1,"recent":[{"token":0,"id":"` + lid(1).String() + `"}]}]}`},
		{"too many recent grants", `{"scopes":[{"scope":"a","last":9,"recent":[` + strings.Repeat(`{"token":1,"id":"`+lid(1).String()+`"},`, recentGrants) + `{"token":1,"id":"` + lid(1).String() + `"}]}]}`},
	} {
		if st, err := Restore(frame(tc.body)); err == nil || st != nil {
			t.Errorf("%s: Restore gave %v, %v; want nil and an error", tc.name, st, err)
		}
	}
}

// TestRestoreRefusesRecentGrantWithoutID: every grant has a lease ID, so
// a remembered grant without one is corrupt, like a lease or waiter without
// one (which Restore refuses).
func TestRestoreRefusesRecentGrantWithoutID(t *testing.T) {
	for _, body := range []string{
		`{"scopes":[{"scope":"a","last":1,"recent":[{"token":1}]}]}`,
		`{"scopes":[{"scope":"a","last":2,"lease":` + leaseJSON(1, 2) + `,"recent":[{"token":1,"request_id":"r"},{"token":2,"id":"` + lid(1).String() + `"}]}]}`,
	} {
		if st, err := Restore(frame(body)); err == nil || st != nil {
			t.Errorf("Restore of %s gave %v, %v; want nil and an error", body, st, err)
		}
	}
}

func TestRestoreAcceptsConsistentRecords(t *testing.T) {
	for _, tc := range []struct{ name, body string }{
		{"empty", `{"scopes":[]}`},
		{"no scopes field", `{}`},
		{"free scope", `{"scopes":[{"scope":"a","last":7}]}`},
		{"counter at the maximum", `{"scopes":[{"scope":"a","last":9223372036854775807}]}`},
		{"held with waiters", `{"scopes":[{"scope":"a","last":3,"lease":` + leaseJSON(1, 3) + `,"waiters":[` + waiterJSON(2) + `]}]}`},
		{"scopes out of order", `{"scopes":[{"scope":"b","last":1},{"scope":"a","last":1}]}`},
	} {
		if _, err := Restore(frame(tc.body)); err != nil {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
}

func TestRestoreRefusesForeignData(t *testing.T) {
	good := New().Snapshot()
	head, body, _ := bytes.Cut(good, []byte("\n"))
	for _, tc := range []struct{ name, in string }{
		{"empty", ""},
		{"a newline", "\n"},
		{"no header", string(body)},
		{"no newline", string(head)},
		{"other data", "hello\n{}"},
		{"another version", strings.Replace(string(good), " v1 ", " v2 ", 1)},
		{"another checksum", strings.Replace(string(good), "crc32c=", "crc32=", 1)},
		{"checksum not hex", "fence-fsm-snapshot v1 crc32c=zzzzzzzz\n" + string(body)},
		{"checksum too wide", "fence-fsm-snapshot v1 crc32c=1" + strings.TrimPrefix(string(good), "fence-fsm-snapshot v1 crc32c=")},
		{"checksum missing", "fence-fsm-snapshot v1 crc32c=\n" + string(body)},
		{"body missing", string(head) + "\n"},
	} {
		if st, err := Restore([]byte(tc.in)); err == nil || st != nil {
			t.Errorf("%s: Restore(%q) gave %v, %v; want nil and an error", tc.name, tc.in, st, err)
		}
	}
}

// TestRestoreRefusesTrailingData: a snapshot is one body; anything after it
// means the bytes are not what Snapshot wrote.
func TestRestoreRefusesTrailingData(t *testing.T) {
	for _, body := range []string{
		`{"scopes":[]}{"scopes":[{"scope":"a","last":5}]}`,
		`{"scopes":[{"scope":"a","last":5}]} x`,
		`{"scopes":[]}]`,
	} {
		if st, err := Restore(frame(body)); err == nil {
			t.Errorf("Restore of the body %s = %s, want an error for the trailing data", body, st.Snapshot())
		}
	}
}

// TestRestoreSharesNothing: a restored state owns its memory; the caller
// may reuse the snapshot buffer.
func TestRestoreSharesNothing(t *testing.T) {
	snap := richState(t).Snapshot()
	s, err := Restore(snap)
	if err != nil {
		t.Fatal(err)
	}
	want := bytes.Clone(snap)
	for i := range snap {
		snap[i] = 'x'
	}
	if !bytes.Equal(s.Snapshot(), want) {
		t.Fatal("overwriting the snapshot buffer changed the restored state")
	}
	if r := s.Apply(acquire("q", 9, func(c *Command) { c.TTL = time.Minute })); r.Outcome != Granted {
		t.Fatalf("the restored state does not grant: %v", r.Outcome)
	}
}
