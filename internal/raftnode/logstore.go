package raftnode

import (
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/fence-dev/fence/internal/fsm"
	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	wal "github.com/hashicorp/raft-wal"
)

// The log stores a node can keep its Raft log and stable store in.
const (
	// LogWAL is hashicorp/raft-wal: segment files under wal/, one fsync
	// per append. The default for a new data directory.
	LogWAL = "wal"
	// LogBolt is raft-boltdb: one bbolt file, raft.db, two fdatasyncs per
	// append. A data directory made by an earlier fenced keeps it.
	LogBolt = "bolt"
)

// logStore is a Raft log and stable store in one.
type logStore interface {
	raft.LogStore
	raft.StableStore
	Close() error
}

// logKind tells which log store dir already holds: LogBolt, LogWAL, or ""
// for a directory with neither.
func logKind(dir string) (string, error) {
	kind := ""
	for _, k := range []string{LogBolt, LogWAL} {
		_, err := os.Stat(logPath(dir, k))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return "", err
		}
		if kind != "" {
			return "", fmt.Errorf("raftnode: %s holds both raft.db and wal/: move the one this node did not write away", dir)
		}
		kind = k
	}
	return kind, nil
}

func logPath(dir, kind string) string {
	if kind == LogBolt {
		return filepath.Join(dir, "raft.db")
	}
	return filepath.Join(dir, "wal")
}

// openLog opens the log store of dir. An empty kind keeps the one dir
// holds, or makes a LogWAL for a new directory. A kind that differs from
// the one dir holds is refused: an empty log beside the old one would
// forget every token the node issued.
func openLog(dir, kind string, segmentSize int) (logStore, string, error) {
	if kind != "" && kind != LogBolt && kind != LogWAL {
		return nil, "", fmt.Errorf("raftnode: log store %q: want %q or %q", kind, LogBolt, LogWAL)
	}
	found, err := logKind(dir)
	if err != nil {
		return nil, "", err
	}
	switch {
	case kind == "" && found == "":
		kind = LogWAL
	case kind == "":
		kind = found
	case found != "" && found != kind:
		return nil, "", fmt.Errorf("raftnode: %s holds a Raft log of another kind (%s), not %q: start with the log store it was made with", dir, logPath(dir, found), kind)
	}
	path := logPath(dir, kind)
	if kind == LogBolt {
		s, err := raftboltdb.New(raftboltdb.Options{Path: path})
		if err != nil {
			return nil, "", fmt.Errorf("open raft log %s: %w", path, err)
		}
		return s, kind, nil
	}
	if err := os.MkdirAll(path, 0o700); err != nil {
		return nil, "", fmt.Errorf("create %s: %w", path, err)
	}
	w, err := openWAL(path, cmp.Or(segmentSize, wal.DefaultSegmentSize))
	if err != nil {
		return nil, "", fmt.Errorf("open raft log %s: %w; if a file in it was lost or damaged (wal-meta.db, a segment): "+
			"in a cluster, replace this node; alone, restore a backup (docs/operations.md)", path, err)
	}
	return w, kind, nil
}

// haltingStore stops the process at the first write of the log or of the
// stable store that fails. Raft would go on: a leader steps down and its
// successor retries, for ever, on a raft-wal whose segment rotation failed
// (a full disk) and left its tail sealed; a snapshot taken meanwhile
// records that broken tail, and no restart recovers. Stopped at once, the
// node restarts cleanly under its supervisor once the disk has room, and
// its callers fail over at once rather than read "segment is sealed".
type haltingStore struct {
	logStore
	dir string
	log *slog.Logger
}

// IsMonotonic passes raft-wal's answer through, as raft.LogCache does.
// Hidden by the wrapper, it made a follower that installed a snapshot keep
// its old entries below the gap, and raft-wal then refused the first entry
// after the snapshot ("non-monotonic log entries"), which halted the node.
func (s *haltingStore) IsMonotonic() bool {
	m, ok := s.logStore.(raft.MonotonicLogStore)
	return ok && m.IsMonotonic()
}

// GetLog stops at an entry whose Raft type is none raft knows (a damaged
// byte): raft would panic on it without naming the data directory.
func (s *haltingStore) GetLog(i uint64, l *raft.Log) error {
	if err := s.logStore.GetLog(i, l); err != nil {
		return err
	}
	if l.Type > raft.LogConfiguration {
		h := &HaltError{Index: i, Dir: s.dir, Err: fmt.Errorf("raft entry type %d: %w", l.Type, fsm.ErrUnknownEntry)}
		s.log.Error("stopping: a log entry of no type raft knows", "index", i, "err", h)
		panic(h)
	}
	return nil
}

func (s *haltingStore) StoreLog(l *raft.Log) error {
	s.check("append to the Raft log", s.logStore.StoreLog(l))
	return nil
}

func (s *haltingStore) StoreLogs(ls []*raft.Log) error {
	s.check("append to the Raft log", s.logStore.StoreLogs(ls))
	return nil
}

// DeleteRange halts too: a follower that must drop a conflicting suffix
// and cannot (a full disk) left raft-wal failing every retry, and unable
// to open after the next restart.
func (s *haltingStore) DeleteRange(lo, hi uint64) error {
	s.check("delete from the Raft log", s.logStore.DeleteRange(lo, hi))
	return nil
}

func (s *haltingStore) Set(k, v []byte) error {
	s.check("write the Raft stable store", s.logStore.Set(k, v))
	return nil
}

func (s *haltingStore) SetUint64(k []byte, v uint64) error {
	s.check("write the Raft stable store", s.logStore.SetUint64(k, v))
	return nil
}

func (s *haltingStore) check(what string, err error) {
	if err == nil {
		return
	}
	e := &StorageError{Dir: s.dir, Op: what, Err: err}
	if free, err := freeSpace(s.dir); err == nil {
		e.Free = free
	}
	s.log.Error("stopping: cannot write the data directory", "err", e)
	panic(e)
}

// StorageError is what a node panics with when it cannot write its log or
// stable store: a full disk, or a failing one.
type StorageError struct {
	Dir  string
	Op   string
	Err  error
	Free uint64 // bytes free on the disk when it failed
}

func (e *StorageError) Error() string {
	return fmt.Sprintf("raftnode: cannot %s in %s (%v; %d bytes free); stopped before anything else is written. "+
		"If the disk is full, free space (or grow it) and start fenced again: it recovers from what it wrote. "+
		"If the disk fails, replace this node (docs/operations.md)", e.Op, e.Dir, e.Err, e.Free)
}

func (e *StorageError) Unwrap() error { return e.Err }
