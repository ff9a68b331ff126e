package raftnode

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/internal/fsm"
)

// TestDamagedEntryHalts: an entry whose data changed after it was proposed
// still decodes (one letter of a scope), so only its checksum tells; the
// node applies the entries before it and halts there, naming the entry.
// An entry without a checksum, from a build before it, is applied.
func TestDamagedEntryHalts(t *testing.T) {
	acquire := func(scope string) []byte {
		return fsm.Command{Op: fsm.OpAcquire, Scope: scope, LeaseID: fence.NewLeaseID(), TTL: time.Minute}.EncodeFor(fsm.LogFormat)
	}
	for _, tc := range []struct {
		name string
		ext  func(data []byte) []byte
		want error
	}{
		{"data changed", func(data []byte) []byte { return entrySum(bytes.Replace(data, []byte("bolt/0"), []byte("bolt/1"), 1)) }, ErrDamagedEntry},
		{"checksum changed", func(data []byte) []byte { x := entrySum(data); x[3] ^= 0x10; return x }, ErrDamagedEntry},
		{"checksum of another form", func(data []byte) []byte { return append(entrySum(data), 0) }, fsm.ErrUnknownEntry},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logged bytes.Buffer
			n := &Node{cfg: Config{DataDir: "/data", Logger: slog.New(slog.NewTextHandler(&logged, nil))}, state: fsm.New()}
			m := (*machine)(n)
			before, damaged := acquire("old/0"), acquire("bolt/0")
			var got any
			func() {
				defer func() { got = recover() }()
				m.ApplyBatch([]*raft.Log{
					{Index: 1, Type: raft.LogCommand, Data: before},                               // a build before the checksum
					{Index: 2, Type: raft.LogCommand, Data: damaged, Extensions: tc.ext(damaged)}, // proposed as bolt/1
					{Index: 3, Type: raft.LogCommand, Data: acquire("after/0")},
				})
			}()
			h, ok := got.(*HaltError)
			if !ok {
				t.Fatalf("ApplyBatch with a damaged entry: recovered %v, want a *HaltError", got)
			}
			if h.Index != 2 || !errors.Is(h, tc.want) {
				t.Errorf("halted with %v (index %d), want entry 2 and %v", h, h.Index, tc.want)
			}
			if tc.want == ErrDamagedEntry && !strings.Contains(h.Error(), "changed after it was proposed") {
				t.Errorf("the halt does not say what happened: %v", h)
			}
			for scope, held := range map[string]bool{"old/0": true, "bolt/0": false, "bolt/1": false, "after/0": false} {
				if got := n.state.Get(scope).Lease != nil; got != held {
					t.Errorf("%s held: %v, want %v", scope, got, held)
				}
			}
		})
	}
}

// TestProposedEntriesCarryTheirSum: every command a node proposes (the
// acquire, and the format raise a new leader may propose) is stored with
// its checksum, which the stored data matches, in either log store.
func TestProposedEntriesCarryTheirSum(t *testing.T) {
	for _, kind := range []string{LogWAL, LogBolt} {
		t.Run(kind, func(t *testing.T) { proposedEntriesCarryTheirSum(t, kind) })
	}
}

func proposedEntriesCarryTheirSum(t *testing.T, kind string) {
	n, err := Open(Config{NodeID: "n1", DataDir: t.TempDir(), LogStore: kind, Bootstrap: true, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	deadline := time.Now().Add(20 * time.Second)
	for !n.IsLeader() && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := n.Apply(context.Background(), fsm.Command{Op: fsm.OpAcquire, Scope: "a", LeaseID: fence.NewLeaseID(), TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	last, err := n.store.LastIndex()
	if err != nil {
		t.Fatal(err)
	}
	commands := 0
	for i := uint64(1); i <= last; i++ {
		var l raft.Log
		if err := n.store.GetLog(i, &l); err != nil {
			t.Fatal(err)
		}
		if l.Type != raft.LogCommand {
			continue // Raft's own entries
		}
		commands++
		if len(l.Extensions) == 0 || checkSum(&l) != nil {
			t.Errorf("entry %d as stored: extensions %x, check %v; want its data's checksum", i, l.Extensions, checkSum(&l))
		}
	}
	if commands == 0 {
		t.Errorf("no command among the %d entries stored", last)
	}
}
