package raftnode

import (
	"cmp"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestElectionTimeoutSetsRaftsTimers opens nodes with several election
// timeouts and reads back the timers Raft runs with: its heartbeat timeout,
// which bounds how long a follower goes without the leader, is half the
// election timeout (see timeouts), and its candidate's wait the same. The
// default keeps the 500ms fenced always gave Raft, and the shortest one
// gives Raft a leader lease it accepts.
func TestElectionTimeoutSetsRaftsTimers(t *testing.T) {
	for _, tc := range []struct {
		election, heartbeat time.Duration
	}{
		{0, 500 * time.Millisecond},
		{time.Second, 500 * time.Millisecond},
		{3 * time.Second, 1500 * time.Millisecond},
		{MinElectionTimeout, 10 * time.Millisecond},
	} {
		n, err := Open(Config{NodeID: "n1", DataDir: t.TempDir(), ElectionTimeout: tc.election, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatalf("election timeout %v: %v", tc.election, err)
		}
		got := n.raft.ReloadableConfig()
		if err := n.Close(); err != nil {
			t.Fatal(err)
		}
		if got.HeartbeatTimeout != tc.heartbeat || got.ElectionTimeout != tc.heartbeat {
			t.Errorf("election timeout %v: Raft's heartbeat timeout %v, election timeout %v; want both %v",
				tc.election, got.HeartbeatTimeout, got.ElectionTimeout, tc.heartbeat)
		}
		hb, _, lease := timeouts(cmp.Or(tc.election, DefaultElectionTimeout))
		if lease > hb || lease < 5*time.Millisecond {
			t.Errorf("election timeout %v: leader lease %v, want within [5ms, %v]", tc.election, lease, hb)
		}
	}
}

// TestElectionTimeoutTooShortIsRefused: an election timeout too short for
// Raft's timers is refused with the shortest one allowed, before anything
// is written.
func TestElectionTimeoutTooShortIsRefused(t *testing.T) {
	for _, d := range []time.Duration{time.Nanosecond, 5 * time.Millisecond, MinElectionTimeout - time.Millisecond} {
		dir := filepath.Join(t.TempDir(), "data")
		_, err := Open(Config{NodeID: "n1", DataDir: dir, ElectionTimeout: d})
		if err == nil || !strings.Contains(err.Error(), "want 20ms or more") {
			t.Errorf("election timeout %v: err = %v, want one that says it is too short and what is allowed", d, err)
		}
		if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("election timeout %v: the data directory was created (%v); want nothing written", d, err)
		}
	}
}
