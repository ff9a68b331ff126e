package raftnode

import (
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/hashicorp/raft"
)

// TestCheckApplied: a log that ends at or above the recorded applied index
// (an unfinished last write lies above it) starts; one that ends below it,
// unless a snapshot covers the index, is refused with LostEntriesError.
func TestCheckApplied(t *testing.T) {
	for _, tc := range []struct {
		name            string
		record          string // "" for no record
		last, snapIndex uint64
		want            string // "", "lost" or "damaged"
	}{
		{"no record", "", 3, 0, ""},
		{"log above the record", "10\n", 12, 0, ""},
		{"log at the record", "10\n", 10, 0, ""},
		{"log below the record", "10\n", 8, 0, "lost"},
		{"snapshot covers the record", "10\n", 0, 11, ""},
		{"log and snapshot below the record", "10\n", 6, 5, "lost"},
		{"a record that is not a number", "ten\n", 12, 0, "damaged"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if tc.record != "" {
				if err := os.WriteFile(filepath.Join(dir, appliedFile), []byte(tc.record), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			logs := raft.NewInmemStore()
			if tc.last > 0 {
				if err := logs.StoreLogs([]*raft.Log{{Index: tc.last, Term: 1, Type: raft.LogNoop}}); err != nil {
					t.Fatal(err)
				}
			}
			snaps := raft.NewInmemSnapshotStore()
			if tc.snapIndex > 0 {
				_, trans := raft.NewInmemTransport("")
				sink, err := snaps.Create(raft.SnapshotVersionMax, tc.snapIndex, 1, raft.Configuration{}, 1, trans)
				if err != nil {
					t.Fatal(err)
				}
				sink.Close()
			}
			err := checkApplied(dir, logs, snaps)
			var lost *LostEntriesError
			switch tc.want {
			case "":
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
			case "lost":
				if !errors.As(err, &lost) || lost.Applied != 10 {
					t.Fatalf("%v; want LostEntriesError at applied index 10", err)
				}
			case "damaged":
				if err == nil || lost != nil {
					t.Fatalf("%v; want an error naming the damaged record", err)
				}
			}
		})
	}
}

// TestAppliedRecordFollowsTheNode: a node records the index it applied,
// at the latest when it closes, and opens again over it.
func TestAppliedRecordFollowsTheNode(t *testing.T) {
	dir := t.TempDir()
	n := open(t, dir)
	n.Close()
	b, err := os.ReadFile(filepath.Join(dir, appliedFile))
	if err != nil || len(b) == 0 || b[0] == '0' {
		t.Fatalf("applied-index after a node closed: %q, %v", b, err)
	}
	open(t, dir).Close()
}

// failingStore fails every write, as a full disk does.
type failingStore struct{ *raft.InmemStore }

func (failingStore) StoreLogs([]*raft.Log) error   { return errors.New("no space left on device") }
func (failingStore) DeleteRange(_, _ uint64) error { return errors.New("no space left on device") }
func (failingStore) Close() error                  { return nil }

// TestHaltingStoreStopsAtAFailedWrite: an append and a delete that fail
// (raft retries both for ever on a wedged raft-wal) panic with a
// StorageError that names the data directory.
func TestHaltingStoreStopsAtAFailedWrite(t *testing.T) {
	s := &haltingStore{logStore: failingStore{raft.NewInmemStore()}, dir: t.TempDir(), log: slog.New(slog.DiscardHandler)}
	for name, write := range map[string]func(){
		"StoreLogs":   func() { s.StoreLogs([]*raft.Log{{Index: 1}}) },
		"DeleteRange": func() { s.DeleteRange(1, 2) },
	} {
		func() {
			defer func() {
				var se *StorageError
				if err, _ := recover().(error); !errors.As(err, &se) || se.Dir != s.dir {
					t.Errorf("%s that failed: recovered %v, want a StorageError naming %s", name, err, s.dir)
				}
			}()
			write()
		}()
	}
}

// TestHaltingStoreKeepsMonotonic: raft asks its log store whether it
// refuses gaps, and after installing a snapshot resets such a log instead
// of leaving entries below the gap. Wrapped without the answer, raft-wal
// refused the first entry after a follower's snapshot install, and the
// follower halted.
func TestHaltingStoreKeepsMonotonic(t *testing.T) {
	for kind, want := range map[string]bool{LogWAL: true, LogBolt: false} {
		opened, _, err := openLog(t.TempDir(), kind, 0)
		if err != nil {
			t.Fatal(err)
		}
		var s raft.LogStore = &haltingStore{logStore: opened, log: slog.New(slog.DiscardHandler)}
		m, ok := s.(raft.MonotonicLogStore)
		if got := ok && m.IsMonotonic(); got != want {
			t.Errorf("%s log behind haltingStore: monotonic %v, want %v", kind, got, want)
		}
		opened.Close()
	}
}

// TestHaltingStoreStopsAtAnUnknownType: a flipped type byte made raft
// panic ("unrecognized log type") without naming the data directory.
func TestHaltingStoreStopsAtAnUnknownType(t *testing.T) {
	in := raft.NewInmemStore()
	in.StoreLogs([]*raft.Log{{Index: 1, Type: raft.LogCommand}, {Index: 2, Type: raft.LogType(200)}})
	s := &haltingStore{logStore: failingStore{in}, dir: t.TempDir(), log: slog.New(slog.DiscardHandler)}
	var l raft.Log
	if err := s.GetLog(1, &l); err != nil {
		t.Fatal(err)
	}
	defer func() {
		var h *HaltError
		if err, _ := recover().(error); !errors.As(err, &h) || h.Dir != s.dir || h.Index != 2 {
			t.Errorf("reading an entry of type 200: recovered %v, want a HaltError naming entry 2 and %s", err, s.dir)
		}
	}()
	s.GetLog(2, &l)
}
