package raftnode

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	wal "github.com/hashicorp/raft-wal"
	"github.com/hashicorp/raft-wal/fs"
	"github.com/hashicorp/raft-wal/metadb"
	"github.com/hashicorp/raft-wal/segment"
	"github.com/hashicorp/raft-wal/types"
)

// raft-wal (v0.4.2) seals a segment by writing its index in the same write
// as the batch that fills it, and records the seal in wal-meta.db only
// afterwards, in the background. Two states of the open tail segment then
// leave it refusing every append ("segment is sealed") after a restart,
// for good, although every entry it acknowledged is there:
//   - the sealing write was cut short (a full disk: it runs past the
//     segment's preallocated size) or torn by a crash: the index is in
//     the file, the commit that would make it count is not, and raft-wal's
//     recovery keeps the index anyway;
//   - the sealing write completed, and the process died before the seal
//     reached wal-meta.db: the segment is sealed but recorded as open,
//     and raft-wal does not finish the rotation at open.
// openWAL repairs both before raft-wal is used: the first by clearing the
// uncommitted index, so that recovery drops the unacknowledged batch as
// it drops any other; the second by finishing the rotation in wal-meta.db,
// as raft-wal would have.

// tailFiler is raft-wal's segment filer, which checks every batch of a
// segment against its CRC before raft-wal reads it (walcheck.go), notes a
// tail segment found sealed and clears the index of a seal that never
// committed.
type tailFiler struct {
	*segment.Filer
	dir    string
	sealed *types.SegmentInfo // the tail, sealed by a committed index
}

func (f *tailFiler) RecoverTail(info types.SegmentInfo) (types.SegmentWriter, error) {
	path := filepath.Join(f.dir, segment.FileName(info))
	if err := verifySegment(path, true); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	w, err := f.Filer.RecoverTail(info)
	if err != nil {
		return nil, err
	}
	sealed, indexStart, err := w.Sealed()
	if err != nil || !sealed {
		return w, err
	}
	committed := uint64(0)
	if last := w.LastIndex(); last >= info.BaseIndex {
		committed = last - info.BaseIndex + 1
	}
	indexed, err := indexEntries(path, indexStart)
	if err != nil {
		w.Close()
		return nil, err
	}
	if committed > 0 && indexed == committed {
		info.IndexStart = indexStart
		info.MaxIndex = w.LastIndex()
		f.sealed = &info
		return w, nil
	}
	// The index counts entries of a batch that never committed.
	if err := w.Close(); err != nil {
		return nil, err
	}
	if err := clearFrom(path, int64(indexStart)-frameHeaderLen); err != nil {
		return nil, err
	}
	return f.Filer.RecoverTail(info)
}

// Open opens a sealed segment once every batch in it matches its CRC.
func (f *tailFiler) Open(info types.SegmentInfo) (types.SegmentReader, error) {
	if err := verifySegment(filepath.Join(f.dir, segment.FileName(info)), false); err != nil {
		return nil, err
	}
	return f.Filer.Open(info)
}

// frameHeaderLen is the length of raft-wal's frame header: a type byte,
// three reserved bytes and the payload's length.
const frameHeaderLen = 8

// indexEntries reads how many entries the index frame whose payload starts
// at indexStart lists (its length field, 4 bytes an entry), or 0 unless a
// commit frame follows it.
func indexEntries(path string, indexStart uint64) (uint64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	var h [frameHeaderLen]byte
	if _, err := f.ReadAt(h[:], int64(indexStart)-frameHeaderLen); err != nil {
		return 0, fmt.Errorf("read the index of %s: %w", path, err)
	}
	n := binary.LittleEndian.Uint32(h[4:])
	next := int64(indexStart) + int64(n+7)&^7 // payloads are padded to 8 bytes
	if _, err := f.ReadAt(h[:1], next); err != nil || h[0] != segment.FrameCommit {
		return 0, nil
	}
	return uint64(n) / 4, nil
}

// clearFrom zeroes path from off to its end: raft-wal reads a zero frame
// type as the end of what was written.
func clearFrom(path string, off int64) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	if off < st.Size() {
		if _, err := f.WriteAt(make([]byte, st.Size()-off), off); err != nil {
			return fmt.Errorf("clear the uncommitted seal of %s: %w", path, err)
		}
	}
	return f.Sync()
}

// openWAL opens the raft-wal log in dir, repairing a tail segment that
// raft-wal would leave refusing every append.
func openWAL(dir string, segmentSize int) (*wal.WAL, error) {
	f := &tailFiler{Filer: segment.NewFiler(dir, fs.New()), dir: dir}
	w, err := wal.Open(dir, wal.WithSegmentSize(segmentSize), wal.WithSegmentFiler(f))
	if err != nil || f.sealed == nil {
		return w, err
	}
	if err := w.Close(); err != nil {
		return nil, err
	}
	if err := finishRotation(dir, *f.sealed); err != nil {
		return nil, fmt.Errorf("record the seal of the tail segment in %s: %w", dir, err)
	}
	return wal.Open(dir, wal.WithSegmentSize(segmentSize))
}

// finishRotation records in wal-meta.db that tail is sealed, and opens the
// next segment after it, as raft-wal's rotation does. raft-wal creates the
// new segment's file at open.
func finishRotation(dir string, tail types.SegmentInfo) error {
	var db metadb.BoltMetaDB
	defer db.Close()
	st, err := db.Load(dir)
	if err != nil {
		return err
	}
	n := len(st.Segments)
	if n == 0 || st.Segments[n-1].ID != tail.ID || !st.Segments[n-1].SealTime.IsZero() {
		return fmt.Errorf("wal-meta.db does not list segment %d as the open tail", tail.ID)
	}
	now := time.Now()
	tail.SealTime = now
	st.Segments[n-1] = tail
	st.Segments = append(st.Segments, types.SegmentInfo{
		ID:         st.NextSegmentID,
		BaseIndex:  tail.MaxIndex + 1,
		MinIndex:   tail.MaxIndex + 1,
		SizeLimit:  tail.SizeLimit,
		Codec:      tail.Codec,
		CreateTime: now,
	})
	st.NextSegmentID++
	return db.CommitState(st)
}
