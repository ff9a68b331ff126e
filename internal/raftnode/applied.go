package raftnode

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/raft"
)

// The applied-index record tells a log that lost acknowledged entries from
// one that lost only an unfinished last write. raft-wal reads a cut-short
// segment, or a damaged frame header, as a torn tail and drops what
// follows without a word; so do other losses (a lost wal-meta.db). Raft
// never removes an entry at or below the commit index except into a
// snapshot, so the last index of the log and the snapshots together never
// falls below an index this node applied. A node records that index, once
// a second and off the path of every request, and at start refuses a log
// that ends below it. An unfinished write was never applied, so it lies
// above the record and is dropped as before.

// appliedFile is the record's name in the data directory.
const appliedFile = "applied-index"

// appliedEvery is how often the record is written, when it changed: one
// write and two fsyncs a second at most.
const appliedEvery = time.Second

// LostEntriesError reports a log that ends below an index this node had
// applied: entries it acknowledged are gone.
type LostEntriesError struct {
	Dir           string
	Last, Applied uint64
}

func (e *LostEntriesError) Error() string {
	return fmt.Sprintf("raftnode: the Raft log in %s ends at index %d, below index %d that this node had applied (%s): "+
		"entries it acknowledged were lost (a damaged or cut-short segment, a lost wal-meta.db, or a copy taken while fenced ran). "+
		"In a cluster, replace this node: move its data directory away and add it again under a new ID. "+
		"Alone, restore a backup; or, to serve from what is left, remove %s and start again: "+
		"the token floor keeps every new token above every one issued, but the leases of the lost entries are forgotten (docs/operations.md)",
		e.Dir, e.Last, e.Applied, filepath.Join(e.Dir, appliedFile), filepath.Join(e.Dir, appliedFile))
}

// checkApplied refuses a log and snapshots that end below the recorded
// applied index.
func checkApplied(dir string, logs raft.LogStore, snaps raft.SnapshotStore) error {
	b, err := os.ReadFile(filepath.Join(dir, appliedFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("raftnode: read %s: %w", filepath.Join(dir, appliedFile), err)
	}
	applied, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return fmt.Errorf("raftnode: %s is damaged (%q): remove it to start without the check that the log lost no applied entry", filepath.Join(dir, appliedFile), b)
	}
	last, err := logs.LastIndex()
	if err != nil {
		return fmt.Errorf("raftnode: read the Raft log in %s: %w", dir, err)
	}
	if metas, err := snaps.List(); err == nil && len(metas) > 0 {
		last = max(last, metas[0].Index)
	}
	if last < applied {
		return &LostEntriesError{Dir: dir, Last: last, Applied: applied}
	}
	return nil
}

// recordApplied writes the applied index when it changed, every
// appliedEvery, until the node closes, and once more then.
func (n *Node) recordApplied() {
	defer n.wg.Done()
	var written uint64
	write := func() {
		applied := n.raft.AppliedIndex()
		if applied == written {
			return
		}
		if err := writeApplied(n.cfg.DataDir, applied); err != nil {
			n.cfg.Logger.Warn("cannot record the applied index", "err", err)
			return
		}
		written = applied
	}
	t := time.NewTicker(appliedEvery)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			write()
		case <-n.done:
			write() // Close shut raft down first: this is the last index
			return
		}
	}
}

// writeApplied replaces the record whole: a crash leaves the old one or
// the new one.
func writeApplied(dir string, index uint64) error {
	path := filepath.Join(dir, appliedFile)
	tmp, err := os.CreateTemp(dir, appliedFile+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	_, err = tmp.WriteString(strconv.FormatUint(index, 10) + "\n")
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
