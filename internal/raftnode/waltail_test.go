package raftnode

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/hashicorp/raft-wal/metadb"
	"github.com/hashicorp/raft-wal/segment"
	"github.com/hashicorp/raft-wal/types"
)

// entry is log entry i of the tests below: 200 bytes that name it.
func entry(i uint64) *raft.Log {
	data := bytes.Repeat([]byte{byte(i)}, 200)
	return &raft.Log{Index: i, Term: 1, Type: raft.LogCommand, Data: data}
}

// appendUntil appends entries one by one after last until an append fails
// or the log reaches max, and returns the last acknowledged index.
func appendUntil(t *testing.T, s logStore, last, max uint64) uint64 {
	t.Helper()
	for i := last + 1; i <= max; i++ {
		if err := s.StoreLogs([]*raft.Log{entry(i)}); err != nil {
			return i - 1
		}
	}
	return max
}

// checkReopens opens the log in dir and wants every acknowledged entry back,
// nothing after them, and room for the next.
func checkReopens(t *testing.T, dir string, segmentSize int, acked uint64) {
	t.Helper()
	s, _, err := openLog(dir, LogWAL, segmentSize)
	if err != nil {
		t.Fatalf("reopen: %v", err)
	}
	defer s.Close()
	if last, err := s.LastIndex(); err != nil || last != acked {
		t.Fatalf("reopened log ends at %d (%v), want %d, the last acknowledged entry", last, err, acked)
	}
	for i := uint64(1); i <= acked; i++ {
		var l raft.Log
		if err := s.GetLog(i, &l); err != nil || !bytes.Equal(l.Data, entry(i).Data) {
			t.Fatalf("entry %d after reopening: %v", i, err)
		}
	}
	if err := s.StoreLogs([]*raft.Log{entry(acked + 1)}); err != nil {
		t.Fatalf("append after reopening: %v", err)
	}
}

// TestFullDiskAtSealReopens: a segment's sealing write runs past its
// preallocated size, so a full disk cuts it short. raft-wal kept the
// uncommitted index it left and refused every append after a restart,
// with space freed; openLog clears it.
func TestFullDiskAtSealReopens(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("a full disk is tested on a tmpfs of its own, which only root may mount")
	}
	for _, leave := range []uint64{0, 4096, 1 << 20} {
		dir := t.TempDir()
		if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=4m,mode=0700", "tmpfs", dir).CombinedOutput(); err != nil {
			t.Fatalf("mount a tmpfs: %v: %s", err, out)
		}
		t.Cleanup(func() { exec.Command("umount", dir).Run() })
		s, _, err := openLog(dir, LogWAL, 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		acked := appendUntil(t, s, 0, 1000)
		var st syscall.Statfs_t
		if err := syscall.Statfs(dir, &st); err != nil {
			t.Fatal(err)
		}
		filler := filepath.Join(dir, "filler")
		if free := st.Bavail * uint64(st.Bsize); free > leave {
			os.WriteFile(filler, make([]byte, free-leave), 0o600)
		}
		acked = appendUntil(t, s, acked, 20000)
		if acked == 20000 {
			t.Fatalf("%d bytes left free: every append succeeded", leave)
		}
		s.Close() // as the halt at the failed append does
		os.Remove(filler)
		checkReopens(t, dir, 1<<20, acked)
	}
}

// TestCrashBeforeSealRecorded: a process killed after a segment's sealing
// write but before raft-wal recorded the seal in wal-meta.db left a tail
// that refused every append after a restart; openLog finishes the
// rotation.
func TestCrashBeforeSealRecorded(t *testing.T) {
	dir := t.TempDir()
	const size = 64 << 10
	s, _, err := openLog(dir, LogWAL, size)
	if err != nil {
		t.Fatal(err)
	}
	acked := uint64(0)
	segments := func() types.PersistentState {
		var db metadb.BoltMetaDB
		defer db.Close()
		st, err := db.Load(logPath(dir, LogWAL))
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	// wal-meta.db is locked while the log is open: count segment files.
	for {
		files, _ := filepath.Glob(filepath.Join(logPath(dir, LogWAL), "*.wal"))
		if len(files) > 1 {
			break
		}
		acked = appendUntil(t, s, acked, acked+1)
	}
	s.Close()

	// Put wal-meta.db and the files back as they were between the sealing
	// write's fsync and the rotation.
	st := segments()
	next := st.Segments[1]
	if next.MinIndex > acked+1 {
		t.Fatalf("the new segment starts at %d, after the last entry %d", next.MinIndex, acked)
	}
	acked = next.MinIndex - 1 // the entries after the seal, in the new segment, were not written yet
	st.Segments = st.Segments[:1]
	st.Segments[0].SealTime, st.Segments[0].IndexStart, st.Segments[0].MaxIndex = time.Time{}, 0, 0
	st.NextSegmentID--
	var db metadb.BoltMetaDB
	if _, err := db.Load(logPath(dir, LogWAL)); err != nil {
		t.Fatal(err)
	}
	if err := db.CommitState(st); err != nil {
		t.Fatal(err)
	}
	db.Close()
	if err := os.Remove(filepath.Join(logPath(dir, LogWAL), segment.FileName(next))); err != nil {
		t.Fatal(err)
	}
	checkReopens(t, dir, size, acked)
}
