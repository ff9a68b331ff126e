package fsm

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fence-dev/fence"
)

// TestRequestIDOfAnotherHolder replays a request ID with another holder
// while its acquire is the current lease, a waiter, and a past grant. Each
// time the answer is invalid, naming request_id, and nothing changes: the
// other holder never gets the lease, or its ID, or a place in line. The
// same holder's retry still gets its own grant.
func TestRequestIDOfAnotherHolder(t *testing.T) {
	other := func(c *Command) { c.Holder = "intruder" }
	for _, tc := range []struct {
		name  string
		setup []Command
		// replay presents r1 from another holder; retry from r1's own.
		replay, retry Command
		want          Outcome
	}{
		{
			name:   "current lease",
			setup:  []Command{acquire("a", 1, reqID("r1"))},
			replay: acquire("a", 9, reqID("r1"), other),
			retry:  acquire("a", 9, reqID("r1"), as(1)),
			want:   Granted,
		},
		{
			name:   "current lease, replay waits",
			setup:  []Command{acquire("a", 1, reqID("r1"))},
			replay: acquire("a", 9, wait, reqID("r1"), other),
			retry:  acquire("a", 9, wait, reqID("r1"), as(1)),
			want:   Granted,
		},
		{
			name:   "waiter",
			setup:  []Command{acquire("a", 2), acquire("a", 1, wait, reqID("r1"))},
			replay: acquire("a", 9, wait, reqID("r1"), other),
			retry:  acquire("a", 9, wait, reqID("r1"), as(1)),
			want:   Queued,
		},
		{
			name:   "past grant",
			setup:  []Command{acquire("a", 1, reqID("r1")), release("a", 1)},
			replay: acquire("a", 9, reqID("r1"), other),
			retry:  acquire("a", 9, reqID("r1"), as(1)),
			want:   Lost,
		},
		{
			name:   "holderless acquire, replay names a holder",
			setup:  []Command{acquire("a", 1, reqID("r1"), func(c *Command) { c.Holder = "" })},
			replay: acquire("a", 9, reqID("r1"), other),
			retry:  acquire("a", 9, reqID("r1"), func(c *Command) { c.Holder = "" }),
			want:   Granted,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := New()
			for _, c := range tc.setup {
				if r := s.Apply(c); r.Outcome == Invalid {
					t.Fatalf("setup %+v: %v", c, r.Err)
				}
			}
			before := s.Snapshot()
			r := s.Apply(tc.replay)
			if r.Outcome != Invalid || r.Lease != (Lease{}) || len(r.Events) != 0 {
				t.Fatalf("replay by another holder = %v with lease %+v, events %v; want invalid and nothing else", r.Outcome, r.Lease, r.Events)
			}
			var ie *fence.InvalidError
			if !errors.As(r.Err, &ie) || ie.Field != "request_id" || !strings.Contains(ie.Reason, "another holder") {
				t.Errorf("replay error %v, want an InvalidError for request_id saying another holder used it", r.Err)
			}
			if after := s.Snapshot(); !bytes.Equal(before, after) {
				t.Errorf("the refused replay changed the state:\n%s\n%s", before, after)
			}
			r = s.Apply(tc.retry)
			if r.Outcome != tc.want || r.Lease.ID != lid(1) {
				t.Errorf("retry by the same holder = %v with lease ID %v, want %v with lease 1's ID", r.Outcome, r.Lease.ID, tc.want)
			}
		})
	}
}

// TestSnapshotGoldenBeforeGrantHolders restores a snapshot written before
// past grants recorded their holder: it restores whole and encodes to the
// same bytes. Its past grants have no holder, so only a holderless retry
// matches them; a retry naming a holder is refused, never granted anew.
func TestSnapshotGoldenBeforeGrantHolders(t *testing.T) {
	golden, err := os.ReadFile(filepath.Join("testdata", "snapshot-v1-before-grant-holders.golden"))
	if err != nil {
		t.Fatal(err)
	}
	s, err := Restore(golden)
	if err != nil {
		t.Fatalf("a snapshot of the previous format no longer restores: %v", err)
	}
	if !bytes.Equal(s.Snapshot(), golden) {
		t.Errorf("it restores to a state that encodes as\n%s\nwant\n%s", s.Snapshot(), golden)
	}
	// r2 is the current lease, whose holder was always recorded.
	if r := s.Apply(acquire("a", 12, reqID("r2"), as(2))); r.Outcome != Granted || r.Lease.ID != lid(2) {
		t.Errorf("retry of r2 by its holder = %v %v, want granted lease 2", r.Outcome, r.Lease.ID)
	}
	if r := s.Apply(acquire("a", 11, reqID("r1"), as(1))); r.Outcome != Invalid {
		t.Errorf("retry of r1 (a past grant without holder) = %v, want invalid", r.Outcome)
	}
}
