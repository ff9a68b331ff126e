package raftnode

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"os"

	"github.com/hashicorp/raft-wal/segment"
)

// raft-wal (v0.4.2) ends each batch it appends with a commit frame holding
// the batch's CRC, but checks a CRC only at open, and only the tail's last
// batch, to find a write torn by a crash: every other batch is read back
// unchecked. A byte flipped inside one (a bad sector, a stray write) was
// served: fencecheck saw a node replay a grant under a scope with one
// letter changed, and serve that lease as leader. verifySegment checks
// every batch when the log is opened, and a log that fails makes the node
// refuse to start, naming the file, as any other damage to its data
// directory does.

// walFileHeaderLen is the length of a raft-wal segment file's header,
// which the first batch's CRC covers.
const walFileHeaderLen = 32

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// verifySegment checks the CRC of every committed batch of the segment
// file at path. In the tail segment the last batch, when nothing was
// written after it, is left to raft-wal, which drops it if it was torn.
func verifySegment(path string, tail bool) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	start, off := 0, walFileHeaderLen
	var bad error    // the last batch read, if its CRC did not match
	pending := false // frames were read after the last commit
	for off+frameHeaderLen <= len(b) {
		h := b[off : off+frameHeaderLen]
		switch h[0] {
		case segment.FrameInvalid:
			off = len(b) // zeros: the end of what was written
			continue
		case segment.FrameEntry, segment.FrameIndex:
			if bad != nil {
				return bad // raft-wal keeps a batch something was written after
			}
			n := int(binary.LittleEndian.Uint32(h[4:]))
			off += frameHeaderLen + (n+7)&^7 // payloads are padded to 8 bytes
			pending = true
		case segment.FrameCommit:
			if bad != nil {
				return bad
			}
			if off > len(b) || crc32.Checksum(b[start:off], castagnoli) != binary.LittleEndian.Uint32(h[4:]) {
				bad = fmt.Errorf("%s: the batch in bytes %d to %d does not match its checksum: the file was damaged after it was written", path, start, off)
			}
			off += frameHeaderLen
			start, pending = off, false
		default:
			if tail {
				return nil // raft-wal's recovery reports a corrupt frame header
			}
			return fmt.Errorf("%s: unreadable frame header at byte %d: the file was damaged after it was written", path, off)
		}
	}
	switch {
	case tail:
		return nil
	case bad != nil:
		return bad
	case pending || off > len(b):
		return fmt.Errorf("%s: a sealed segment whose last frames no commit covers: the file was damaged after it was written", path)
	}
	return nil
}
