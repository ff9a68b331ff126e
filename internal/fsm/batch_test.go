package fsm

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/fence-dev/fence"
)

func batchOf(cs ...Command) Command { return Command{Op: OpBatch, Commands: cs} }

func formatted(f int) *State {
	s := New()
	s.Apply(Command{Op: OpSetFormat, Format: f})
	return s
}

// TestBatch: a batch answers each command as that command alone would,
// in order, a refused one included, and the batch's events are theirs.
func TestBatch(t *testing.T) {
	s := formatted(BatchFormat)
	r := s.Apply(batchOf(
		acquire("a", 1),
		acquire("a", 2), // held by the first
		acquire("b", 3, func(c *Command) { c.TTL = -1 }), // malformed: refused alone
		release("a", 1),
		acquire("a", 4), // free again, the next token
		release("c", 5), // never held
	))
	want := []Outcome{Granted, Held, Invalid, Released, Granted, NotHolder}
	if len(r.Results) != len(want) {
		t.Fatalf("%d results, want %d: %+v", len(r.Results), len(want), r)
	}
	for i, o := range want {
		if got := r.Results[i].Outcome; got != o {
			t.Errorf("command %d: %v, want %v", i, got, o)
		}
	}
	if tok := r.Results[4].Lease.Token; tok != 2 {
		t.Errorf("second grant of a: token %d, want 2", tok)
	}
	if !errors.Is(r.Results[2].Err, fence.ErrInvalid) {
		t.Errorf("malformed command: %v, want an invalid argument", r.Results[2].Err)
	}
	var events []Event
	for _, one := range r.Results {
		events = append(events, one.Events...)
	}
	if diff := diffResults(events, r.Events); diff != "" || len(r.Events) != 3 {
		t.Errorf("batch events (-items' +batch's), want grant, release, grant:\n%s", diff)
	}
	if s.Get("b").Last != 0 {
		t.Errorf("the refused acquire of b left a record: %+v", s.Get("b"))
	}
}

// TestBatchRefusedWhole: the batch as a whole is refused, changing
// nothing, when it is malformed or the log format has no batches.
func TestBatchRefusedWhole(t *testing.T) {
	tooMany := make([]Command, MaxBatch+1)
	for i := range tooMany {
		tooMany[i] = acquire(fmt.Sprintf("s%d", i), 1)
	}
	for _, tc := range []struct {
		name   string
		format int
		c      Command
		reason string
	}{
		{"empty", BatchFormat, batchOf(), "0 in one batch"},
		{"too many", BatchFormat, batchOf(tooMany...), "1001 in one batch"},
		{"waiting acquire, format 3", BatchFormat, batchOf(acquire("a", 1), acquire("b", 2, wait)), "waiting acquire in a batch under log format 3"},
		{"waiting acquire, format 4", WaitBatchFormat - 1, batchOf(acquire("a", 1), acquire("b", 2, wait)), "waiting acquire in a batch under log format 4"},
		{"expire", BatchFormat, batchOf(expire("a", 1)), `"expire" in a batch`},
		{"nested", BatchFormat, batchOf(batchOf(acquire("a", 1))), `"batch" in a batch`},
		{"format 1", 1, batchOf(acquire("a", 1)), "log format 1"},
		{"format 2", 2, batchOf(acquire("a", 1)), "log format 2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := formatted(tc.format)
			before := s.Snapshot()
			r := s.Apply(tc.c)
			if r.Outcome != Invalid || r.Results != nil || r.Err == nil || !strings.Contains(r.Err.Error(), tc.reason) {
				t.Errorf("%v, %v, %d results; want invalid, %q", r.Outcome, r.Err, len(r.Results), tc.reason)
			}
			if !bytes.Equal(before, s.Snapshot()) {
				t.Error("a refused batch changed the state")
			}
		})
	}
}

// TestBatchJoinsTheLine: from WaitBatchFormat on, waiting acquires in a
// batch join the line in their order, and a release later in the same
// batch grants the first of them.
func TestBatchJoinsTheLine(t *testing.T) {
	s := formatted(WaitBatchFormat)
	s.Apply(acquire("a", 1))
	r := s.Apply(batchOf(acquire("a", 2, wait), acquire("a", 3, wait), release("a", 1)))
	want := []Outcome{Queued, Queued, Released}
	for i, o := range want {
		if got := r.Results[i].Outcome; got != o {
			t.Fatalf("command %d: %v, want %v (%+v)", i, got, o, r.Results)
		}
	}
	got := s.Get("a")
	if got.Lease == nil || got.Lease.ID != leaseOf(2, 0).ID || got.Lease.Token != 2 || got.Waiters != 1 {
		t.Fatalf("after the batch: %+v, want the first waiter holding token 2 and one waiting", got)
	}
}

// TestBatchDecodes: a batch survives its log form.
func TestBatchDecodes(t *testing.T) {
	c := batchOf(acquire("a", 1, reqID("r1"), at(5)), release("a", 1, at(6)))
	d, err := DecodeCommand(c.Encode())
	if err != nil {
		t.Fatal(err)
	}
	if diff := diffResults(c, d); diff != "" {
		t.Errorf("decoded batch (-want +got):\n%s", diff)
	}
}

// randomBatches turns a random log's acquires (waiting ones too, if
// waits) and releases into batches of one to twenty commands.
func randomBatches(seed uint64, n int, waits bool) [][]Command {
	rng := rand.New(rand.NewPCG(seed, 0xba7c4))
	var out [][]Command
	var cur []Command
	for _, c := range randomLog(seed, n) {
		if (c.Op != OpAcquire && c.Op != OpRelease) || (c.Wait && !waits) {
			continue
		}
		cur = append(cur, c)
		if rng.IntN(20) == 0 || len(cur) == 20 {
			out = append(out, cur)
			cur = nil
		}
	}
	if len(cur) > 0 {
		out = append(out, cur)
	}
	return out
}

// TestBatchIsItsCommands is the property the batch rests on: applying a
// batch is applying its commands one by one, result for result and byte
// for byte, and, like every entry, applying it again on another replica
// (from its log form) gives the same; from WaitBatchFormat on, with
// waiting acquires among them.
func TestBatchIsItsCommands(t *testing.T) {
	t.Run("format 3", func(t *testing.T) { testBatchIsItsCommands(t, BatchFormat) })
	t.Run("format 5, with waits", func(t *testing.T) { testBatchIsItsCommands(t, WaitBatchFormat) })
}

func testBatchIsItsCommands(t *testing.T, format int) {
	for seed := range uint64(20) {
		batches := randomBatches(seed, 600, format >= WaitBatchFormat)
		one, many, decoded := newReplica(), newReplica(), newReplica()
		for _, s := range []*State{one, many, decoded} {
			s.Apply(Command{Op: OpSetFormat, Format: format})
		}
		var granted, queued int
		for i, b := range batches {
			r := many.Apply(batchOf(b...))
			d, err := DecodeCommand(batchOf(b...).Encode())
			if err != nil {
				t.Fatalf("seed %d, batch %d: %v", seed, i, err)
			}
			rd := decoded.Apply(d)
			if len(r.Results) != len(b) {
				t.Fatalf("seed %d, batch %d: %d results for %d commands (%v)", seed, i, len(r.Results), len(b), r.Err)
			}
			for j, c := range b {
				want := one.Apply(c)
				if diff := diffResults(want, r.Results[j]); diff != "" {
					t.Fatalf("seed %d, batch %d, command %d: the batch answers otherwise (-alone +batched):\n%s", seed, i, j, diff)
				}
				if diff := diffResults(r.Results[j], rd.Results[j]); diff != "" {
					t.Fatalf("seed %d, batch %d, command %d: the decoded batch answers otherwise:\n%s", seed, i, j, diff)
				}
				switch want.Outcome {
				case Granted:
					granted++
				case Queued:
					queued++
				}
			}
		}
		if format >= WaitBatchFormat && queued == 0 {
			t.Fatalf("seed %d: no acquire queued in %d batches: the test proves little for waits", seed, len(batches))
		}
		if !bytes.Equal(one.Snapshot(), many.Snapshot()) || !bytes.Equal(many.Snapshot(), decoded.Snapshot()) {
			t.Fatalf("seed %d: batched and one by one reach different snapshots", seed)
		}
		if granted == 0 {
			t.Fatalf("seed %d: no grant in %d batches: the test proves little", seed, len(batches))
		}
	}
}
