package raftnode

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/internal/fsm"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// open starts a node on dir and waits until it is leader and caught up.
func open(t *testing.T, dir string) *Node { return openLogged(t, dir, "") }

// openLogged is open on the given log store.
func openLogged(t *testing.T, dir, logStore string) *Node {
	t.Helper()
	n, err := Open(Config{NodeID: "n1", DataDir: dir, LogStore: logStore, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for !n.IsLeader() {
		if time.Now().After(deadline) {
			t.Fatal("no leader after 20s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := n.Barrier(ctx); err != nil {
		t.Fatal(err)
	}
	// The only member knows this build's log format: the leader raises
	// the cluster's to it.
	for n.Format() != fsm.LogFormat {
		if time.Now().After(deadline) {
			t.Fatalf("log format %d after 20s, want %d", n.Format(), fsm.LogFormat)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return n
}

func acquire(t *testing.T, n *Node, scope string) fsm.Result {
	t.Helper()
	r, err := n.Apply(context.Background(), fsm.Command{Op: fsm.OpAcquire, Scope: scope, LeaseID: fence.NewLeaseID(), TTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestReopenKeepsCounters reopens a node from its log alone, and from a
// snapshot plus the log after it: the counters continue, tokens never go
// back (invariants 1 and 4 across a restart and a snapshot restore). It
// runs on each log store.
func TestReopenKeepsCounters(t *testing.T) {
	for _, log := range []string{LogBolt, LogWAL} {
		t.Run(log, func(t *testing.T) { reopenKeepsCounters(t, log) })
	}
}

func reopenKeepsCounters(t *testing.T, logStore string) {
	dir := t.TempDir()
	open := func(t *testing.T, dir string) *Node { return openLogged(t, dir, logStore) }
	n := open(t, dir)
	var last uint64
	for i := range 5 {
		// Each release closes its token with the next value
		// (fsm.CloseFormat): the grants are 1, 3, 5...
		r := acquire(t, n, "a")
		if r.Outcome != fsm.Granted || r.Lease.Token != uint64(2*i+1) {
			t.Fatalf("grant %d = %v token %d", i, r.Outcome, r.Lease.Token)
		}
		if _, err := n.Apply(context.Background(), fsm.Command{Op: fsm.OpRelease, Scope: "a", LeaseID: r.Lease.ID}); err != nil {
			t.Fatal(err)
		}
		last = r.Lease.Token
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}

	n = open(t, dir) // from the log
	if r := acquire(t, n, "a"); r.Lease.Token != last+2 {
		t.Fatalf("after reopen: token %d, want %d, after the closing of %d", r.Lease.Token, last+2, last)
	}
	held := acquire(t, n, "b")
	if err := n.Snapshot(); err != nil {
		t.Fatal(err)
	}
	acquire(t, n, "c") // after the snapshot: in the log only
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}

	n = open(t, dir) // from the snapshot plus the log
	defer n.Close()
	var a, b, c fsm.ScopeInfo
	n.Read(func(st *fsm.State) { a, b, c = st.Get("a"), st.Get("b"), st.Get("c") })
	if a.Last != last+2 || a.Lease == nil {
		t.Errorf("a after snapshot restore = %+v, want last %d and held", a, last+2)
	}
	if b.Lease == nil || b.Lease.ID != held.Lease.ID {
		t.Errorf("b after snapshot restore = %+v, want the lease granted before the snapshot", b)
	}
	if c.Last != 1 {
		t.Errorf("c after snapshot restore = %+v, want last 1", c)
	}
}

func TestApplyInvalidChangesNothing(t *testing.T) {
	n := open(t, t.TempDir())
	defer n.Close()
	r, err := n.Apply(context.Background(), fsm.Command{Op: fsm.OpAcquire, Scope: "../x", LeaseID: fence.NewLeaseID(), TTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if r.Outcome != fsm.Invalid || r.Err == nil {
		t.Fatalf("outcome %v err %v, want invalid", r.Outcome, r.Err)
	}
	var snap []byte
	n.Read(func(st *fsm.State) { snap = st.Snapshot() })
	empty := fsm.New()
	empty.Apply(fsm.Command{Op: fsm.OpSetFormat, Format: fsm.LogFormat})
	if string(snap) != string(empty.Snapshot()) {
		t.Fatalf("state changed by an invalid command: %s", snap)
	}
}

// TestCloseUnderLoad closes a node while many callers apply, verify and
// barrier: every call returns (Raft drops a future still queued when it
// shuts down, which would leave its caller waiting for ever), and calls
// after Close fail at once as unavailable.
func TestCloseUnderLoad(t *testing.T) {
	for round := range 5 {
		n := open(t, t.TempDir())
		ctx := context.Background()
		var wg sync.WaitGroup
		var applied atomic.Int64
		for i := range 64 {
			wg.Go(func() {
				for j := 0; ; j++ {
					var err error
					switch j % 8 {
					case 6:
						err = n.VerifyLeader(ctx)
					case 7:
						err = n.Barrier(ctx)
					default:
						_, err = n.Apply(ctx, fsm.Command{Op: fsm.OpAcquire, Scope: fmt.Sprintf("s%d-%d", i, j), LeaseID: fence.NewLeaseID(), TTL: time.Minute})
					}
					if err != nil {
						if !errors.Is(err, fence.ErrUnavailable) {
							t.Errorf("round %d: a call during Close: %v; want unavailable", round, err)
						}
						return
					}
					applied.Add(1)
				}
			})
		}
		for applied.Load() < 200 {
			time.Sleep(time.Millisecond)
		}
		if err := n.Close(); err != nil {
			t.Fatal(err)
		}
		returned := make(chan struct{})
		go func() { wg.Wait(); close(returned) }()
		select {
		case <-returned:
		case <-time.After(time.Minute):
			t.Fatalf("round %d: calls still waiting a minute after Close returned", round)
		}
		if _, err := n.Apply(ctx, fsm.Command{Op: fsm.OpAcquire, Scope: "late", LeaseID: fence.NewLeaseID(), TTL: time.Minute}); !errors.Is(err, fence.ErrUnavailable) {
			t.Fatalf("Apply after Close: %v; want unavailable", err)
		}
	}
}

// TestLogStoreKeepsItsKind: a data directory made with one log store is
// refused by the other, which would start on an empty log and issue its
// tokens again, and still opens, with its counters, on its own.
func TestLogStoreKeepsItsKind(t *testing.T) {
	for _, kinds := range [][2]string{{LogBolt, LogWAL}, {LogWAL, LogBolt}} {
		made, other := kinds[0], kinds[1]
		t.Run(made, func(t *testing.T) {
			dir := t.TempDir()
			n := openLogged(t, dir, made)
			acquire(t, n, "a")
			if err := n.Close(); err != nil {
				t.Fatal(err)
			}
			_, err := Open(Config{NodeID: "n1", DataDir: dir, LogStore: other, Logger: slog.New(slog.DiscardHandler)})
			if err == nil || !strings.Contains(err.Error(), "another kind") {
				t.Fatalf("a %s directory opened as %s: %v; want it refused", made, other, err)
			}
			n = openLogged(t, dir, made)
			defer n.Close()
			var a fsm.ScopeInfo
			n.Read(func(st *fsm.State) { a = st.Get("a") })
			if a.Last != 1 || a.Lease == nil {
				t.Fatalf("a after the refused open: %+v, want token 1 held", a)
			}
		})
	}
	if _, err := Open(Config{NodeID: "n1", DataDir: t.TempDir(), LogStore: "lmdb"}); err == nil || !strings.Contains(err.Error(), `want "bolt" or "wal"`) {
		t.Fatalf("an unknown log store: %v", err)
	}
}

// TestLogStoreFollowsTheDataDir: with no kind asked for, a new data
// directory gets raft-wal, and one made by an earlier fenced (raft.db)
// keeps raft-boltdb with its counters.
func TestLogStoreFollowsTheDataDir(t *testing.T) {
	for _, made := range []string{LogBolt, LogWAL} {
		t.Run(made, func(t *testing.T) {
			dir := t.TempDir()
			n := openLogged(t, dir, made)
			acquire(t, n, "a")
			if err := n.Close(); err != nil {
				t.Fatal(err)
			}
			n = openLogged(t, dir, "")
			defer n.Close()
			if got := n.LogStore(); got != made {
				t.Fatalf("a %s directory reopened with no kind asked for uses %s", made, got)
			}
			if r := acquire(t, n, "b"); r.Lease.Token != 1 {
				t.Fatalf("b: token %d, want 1", r.Lease.Token)
			}
			var a fsm.ScopeInfo
			n.Read(func(st *fsm.State) { a = st.Get("a") })
			if a.Last != 1 || a.Lease == nil {
				t.Fatalf("a after the reopen: %+v, want token 1 held", a)
			}
		})
	}
	n := openLogged(t, t.TempDir(), "")
	defer n.Close()
	if got := n.LogStore(); got != LogWAL {
		t.Fatalf("a new data directory uses %s, want %s", got, LogWAL)
	}
}
