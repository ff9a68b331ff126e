package raftnode

import (
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

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
	w, err := wal.Open(path, wal.WithSegmentSize(cmp.Or(segmentSize, wal.DefaultSegmentSize)))
	if err != nil {
		return nil, "", fmt.Errorf("open raft log %s: %w", path, err)
	}
	return w, kind, nil
}
