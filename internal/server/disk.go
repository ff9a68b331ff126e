package server

import (
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/fence-dev/fence"
)

// diskSpace refuses new grants before the data directory's disk is full,
// as etcd's NOSPACE alarm refuses puts: a raft-wal log takes a whole
// segment when it rolls over, and a write that finds no room stops the
// node (raftnode.StorageError). Releases and expiries still go through,
// and so does the snapshot that frees old segments. Its methods are safe
// for concurrent use, and on a nil *diskSpace say "room enough".
type diskSpace struct {
	free func() (uint64, error)
	dir  string
	min  uint64
	log  *slog.Logger

	checked atomic.Int64 // Unix nanoseconds of the last measure
	bytes   atomic.Uint64
	low     atomic.Bool
}

// diskCheckEvery bounds how often the free space is measured (statfs).
const diskCheckEvery = time.Second

// measure measures the free space if the last measure is older than
// diskCheckEvery, and logs each change between low and enough.
func (d *diskSpace) measure() {
	now := time.Now().UnixNano()
	last := d.checked.Load()
	if now-last < int64(diskCheckEvery) || !d.checked.CompareAndSwap(last, now) {
		return
	}
	free, err := d.free()
	if err != nil {
		return // unmeasured: a full disk still stops the node at its first failed write
	}
	d.bytes.Store(free)
	low := free < d.min
	if d.low.Swap(low) != low {
		if low {
			d.log.Error("disk nearly full: refusing new grants until space is freed", "data_dir", d.dir, "free_bytes", free, "min_free_bytes", d.min)
		} else {
			d.log.Info("disk has room again: granting", "data_dir", d.dir, "free_bytes", free)
		}
	}
}

// err says why new grants are refused, or nil.
func (d *diskSpace) err() error {
	if d == nil {
		return nil
	}
	d.measure()
	if !d.low.Load() {
		return nil
	}
	return fmt.Errorf("%w: disk nearly full in %s: %d bytes free, below the %d fenced keeps for its log (--min-free-space); free space or grow the disk",
		fence.ErrUnavailable, d.dir, d.bytes.Load(), d.min)
}

// freeBytes returns the last measure, for /metrics.
func (d *diskSpace) freeBytes() float64 {
	if d == nil {
		return 0
	}
	d.measure()
	return float64(d.bytes.Load())
}
