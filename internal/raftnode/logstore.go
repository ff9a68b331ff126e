package raftnode

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	wal "github.com/hashicorp/raft-wal"
	"github.com/hashicorp/raft-wal/metadb"
)

// The log stores a node can keep its Raft log and stable store in.
const (
	// LogBolt is raft-boltdb: one bbolt file, raft.db, two fdatasyncs per
	// append. The default.
	LogBolt = "bolt"
	// LogWAL is hashicorp/raft-wal: segment files under wal/, one fsync
	// per append. Its authors still call it experimental.
	LogWAL = "wal"
)

// logStore is a Raft log and stable store in one.
type logStore interface {
	raft.LogStore
	raft.StableStore
	Close() error
}

// openLog opens the log store of the given kind in dir. It refuses a
// directory that holds the other kind's log: opening an empty log beside
// it would forget every token the node issued.
func openLog(dir, kind string) (logStore, error) {
	boltPath, walDir := filepath.Join(dir, "raft.db"), filepath.Join(dir, "wal")
	other := map[string]string{LogBolt: walDir, LogWAL: boltPath}[kind]
	if other == "" {
		return nil, fmt.Errorf("raftnode: log store %q: want %q or %q", kind, LogBolt, LogWAL)
	}
	if _, err := os.Stat(other); err == nil {
		return nil, fmt.Errorf("raftnode: %s holds a Raft log of another kind (%s), not %q: start with the log store it was made with", dir, other, kind)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	if kind == LogBolt {
		s, err := raftboltdb.New(raftboltdb.Options{Path: boltPath})
		if err != nil {
			return nil, fmt.Errorf("open raft log %s: %w", boltPath, err)
		}
		return s, nil
	}
	if err := os.MkdirAll(walDir, 0o700); err != nil {
		return nil, fmt.Errorf("create %s: %w", walDir, err)
	}
	// WAL.Close leaves its meta store open (raft-wal v0.4.0), and with it
	// the file lock that a reopen would wait on for ever: keep it to close.
	meta := &metadb.BoltMetaDB{}
	w, err := wal.Open(walDir, wal.WithMetaStore(meta))
	if err != nil {
		meta.Close()
		return nil, fmt.Errorf("open raft log %s: %w", walDir, err)
	}
	return walStore{w, meta}, nil
}

type walStore struct {
	*wal.WAL
	meta *metadb.BoltMetaDB
}

func (s walStore) Close() error { return errors.Join(s.WAL.Close(), s.meta.Close()) }
