package raftnode

import (
	"bufio"
	"fmt"
	"io"
	"os"

	"github.com/hashicorp/raft"

	"github.com/fence-dev/fence/internal/fsm"
)

// restoreBackup makes an empty data directory start from the backup at
// path: the backup becomes the directory's only snapshot, at index 1 of
// term 1, with this node as the cluster's only voter, and the log is empty.
// Raft then starts as it does after a snapshot compacted its log. The
// backup is read once, into the new snapshot as fsm.RestoreFrom checks it
// whole, and the snapshot is kept only if the check passes: reading it
// twice, to check and then to copy, would keep whatever the file held by
// the second read, unchecked. The restored node's tokens need no number
// from the operator: it takes office above the token floor, its wall
// clock.
func restoreBackup(path string, stable raft.StableStore, snaps raft.SnapshotStore, conf raft.Configuration, trans raft.Transport) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("raftnode: restore %s: %w", path, err)
	}
	defer f.Close()
	sink, err := snaps.Create(raft.SnapshotVersionMax, 1, 1, conf, 1, trans)
	if err != nil {
		return fmt.Errorf("raftnode: restore %s: create snapshot: %w", path, err)
	}
	// RestoreFrom reads to the end, checksum included, so the snapshot gets
	// every byte it checked and no other.
	if _, err := fsm.RestoreFrom(io.TeeReader(bufio.NewReaderSize(f, 1<<20), sink)); err != nil {
		sink.Cancel()
		return fmt.Errorf("raftnode: restore %s: %w", path, err)
	}
	if err := sink.Close(); err != nil {
		return fmt.Errorf("raftnode: restore %s: %w", path, err)
	}
	// Raft's key for the current term: a term below the snapshot's would
	// let an election run in the snapshot's own term.
	if err := stable.SetUint64([]byte("CurrentTerm"), 1); err != nil {
		return fmt.Errorf("raftnode: restore %s: %w", path, err)
	}
	return nil
}
