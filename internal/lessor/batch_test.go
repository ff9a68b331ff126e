package lessor

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/internal/fsm"
)

// recorder is a Node over a bare state that records what it is asked to
// propose.
type recorder struct {
	mu       sync.Mutex
	st       *fsm.State
	proposed []fsm.Command
	deposed  error // ConfirmLeader's answer
}

func (r *recorder) Read(f func(*fsm.State)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	f(r.st)
}

func (r *recorder) Apply(_ context.Context, c fsm.Command) (fsm.Result, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.proposed = append(r.proposed, c)
	return r.st.Apply(c), nil
}

func (r *recorder) Barrier(context.Context) error { return nil }

// ConfirmLeader answers r.deposed, nil unless a test set it.
func (r *recorder) ConfirmLeader(context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.deposed
}

// RaiseFormat leaves the format the test chose.
func (r *recorder) RaiseFormat(context.Context) error {
	return errors.New("recorder: the test sets the format")
}

// TestBatchFollowsTheLogFormat: the lessor proposes a batch as one log
// entry only once the cluster's log format has batches; below, a member of
// an older build would halt at it, so it proposes one entry per command,
// which answer alike.
func TestBatchFollowsTheLogFormat(t *testing.T) {
	now := time.Now().UnixNano()
	id1, id2 := fence.NewLeaseID(), fence.NewLeaseID()
	cs := []fsm.Command{
		{Op: fsm.OpAcquire, Scope: "a", LeaseID: id1, Holder: "h", TTL: time.Minute, At: now},
		{Op: fsm.OpAcquire, Scope: "a", LeaseID: id2, Holder: "h", TTL: time.Minute, At: now},
		{Op: fsm.OpRelease, Scope: "a", LeaseID: id1, At: now},
	}
	want := []fsm.Outcome{fsm.Granted, fsm.Held, fsm.Released}
	for _, tc := range []struct {
		format  int
		entries []fsm.Op
	}{
		{1, []fsm.Op{fsm.OpAcquire, fsm.OpAcquire, fsm.OpRelease}},
		{2, []fsm.Op{fsm.OpAcquire, fsm.OpAcquire, fsm.OpRelease}},
		{fsm.BatchFormat, []fsm.Op{fsm.OpBatch}},
	} {
		st := fsm.New()
		st.Apply(fsm.Command{Op: fsm.OpSetFormat, Format: tc.format})
		node := &recorder{st: st}
		l := New(Config{})
		l.Open(node)
		rs, err := l.Batch(context.Background(), cs)
		if err != nil {
			t.Fatalf("format %d: %v", tc.format, err)
		}
		for i, o := range want {
			if rs[i].Outcome != o {
				t.Errorf("format %d, command %d: %v, want %v", tc.format, i, rs[i].Outcome, o)
			}
		}
		var ops []fsm.Op
		for _, c := range node.proposed {
			ops = append(ops, c.Op)
		}
		if len(ops) != len(tc.entries) {
			t.Fatalf("format %d: proposed %v, want %v", tc.format, ops, tc.entries)
		}
		for i := range ops {
			if ops[i] != tc.entries[i] {
				t.Errorf("format %d: proposed %v, want %v", tc.format, ops, tc.entries)
			}
		}
	}
}

// TestBatchOnANode: on a real one-node cluster, whose leader raises the
// log format to this build's, a batch is one entry answered item by item.
func TestBatchOnANode(t *testing.T) {
	l, node := startLessor(t)
	for end := time.Now().Add(20 * time.Second); node.Format() < fsm.BatchFormat; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("log format %d, want %d", node.Format(), fsm.BatchFormat)
		}
	}
	now := time.Now().UnixNano()
	var cs []fsm.Command
	for _, s := range []string{"x", "y", "x"} {
		cs = append(cs, fsm.Command{Op: fsm.OpAcquire, Scope: s, LeaseID: fence.NewLeaseID(), Holder: "h", TTL: time.Minute, At: now})
	}
	rs, err := l.Batch(context.Background(), cs)
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 3 || rs[0].Outcome != fsm.Granted || rs[1].Outcome != fsm.Granted || rs[2].Outcome != fsm.Held {
		t.Fatalf("results %+v; want granted, granted, held", rs)
	}
	if left := l.Left("x", rs[0].Lease.Token, time.Now()); left <= 0 {
		t.Errorf("the batch's grant has no deadline (%v left): its events did not reach the lessor", left)
	}
}

// TestRenewalNeedsLeadership: RenewBatch itself confirms that the node
// still leads before a renewal may be confirmed, so that no RPC path can
// skip it; a node that cannot confirm answers an error for the batch,
// while a refusal is decided without asking.
func TestRenewalNeedsLeadership(t *testing.T) {
	l, node := parkingLessor(t, fsm.LogFormat)
	ctx := context.Background()
	held, err := l.Acquire(ctx, fsm.Command{Op: fsm.OpAcquire, Scope: "s", LeaseID: fence.NewLeaseID(), Holder: "a", TTL: time.Minute, At: time.Now().UnixNano()})
	if err != nil || held.Outcome != fsm.Granted {
		t.Fatalf("acquire: %v, %v", held.Outcome, err)
	}
	deposed := errors.New("deposed")
	node.mu.Lock()
	node.deposed = deposed
	node.mu.Unlock()
	out := make([]Renewed, 1)
	if err := l.RenewBatch(ctx, []Renewal{{Scope: "s", ID: held.Lease.ID}}, out); !errors.Is(err, deposed) {
		t.Fatalf("renewal at a node that cannot confirm it leads: %v; want its error", err)
	}
	if err := l.RenewBatch(ctx, []Renewal{{Scope: "s", ID: fence.NewLeaseID()}}, out); err != nil || out[0].Outcome == fsm.Granted {
		t.Fatalf("renewal of an unknown lease: %v, %v; want refused without asking", out[0].Outcome, err)
	}
	node.mu.Lock()
	node.deposed = nil
	node.mu.Unlock()
	if err := l.RenewBatch(ctx, []Renewal{{Scope: "s", ID: held.Lease.ID}}, out); err != nil || out[0].Outcome != fsm.Granted || out[0].TTL != time.Minute {
		t.Fatalf("renewal at the leader: %+v, %v; want renewed for a minute", out[0], err)
	}
}
