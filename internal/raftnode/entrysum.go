package raftnode

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"

	"github.com/hashicorp/raft"

	"github.com/fence-dev/fence/internal/fsm"
)

// Every command this build proposes carries the CRC-32C of its data in
// the entry's raft.Log.Extensions, which Raft replicates and both log
// stores keep with the entry, and every replica checks it before it
// applies the entry. verifySegment checks raft-wal's batches when the log
// is opened; this catches what that cannot: a byte that changes on disk
// while the node runs, then is read back to catch up a lagging follower,
// which stores it under a fresh batch CRC of its own and would apply it
// as a valid command (a grant under another scope, another token).
//
// Builds before the checksum ignore Extensions; their entries have none,
// and are applied unchecked, as they were.

// sumTag starts an entry's checksum, so that a later form can be told
// from this one.
const sumTag = 0x01

// ErrDamagedEntry is the error a HaltError wraps for a log entry whose
// data does not match the checksum it was proposed with.
var ErrDamagedEntry = errors.New("log entry does not match its checksum")

// entrySum returns the Extensions of an entry holding data.
func entrySum(data []byte) []byte {
	b := make([]byte, 5)
	b[0] = sumTag
	binary.LittleEndian.PutUint32(b[1:], crc32.Checksum(data, castagnoli))
	return b
}

// checkSum reports whether l's data matches its checksum; an entry with
// none is from a build before it. A checksum in another form is from a
// newer build, or damaged: either way this build cannot apply it.
func checkSum(l *raft.Log) error {
	x := l.Extensions
	switch {
	case len(x) == 0:
		return nil
	case len(x) != 5 || x[0] != sumTag:
		return fmt.Errorf("%w: its checksum field (%x) is in a form this build does not know", fsm.ErrUnknownEntry, x)
	}
	if want, got := binary.LittleEndian.Uint32(x[1:]), crc32.Checksum(l.Data, castagnoli); got != want {
		return fmt.Errorf("%w (proposed with %08x, reads %08x)", ErrDamagedEntry, want, got)
	}
	return nil
}

// decodeEntry checks l's checksum, then decodes its command.
func decodeEntry(l *raft.Log) (fsm.Command, error) {
	if err := checkSum(l); err != nil {
		return fsm.Command{}, err
	}
	return fsm.DecodeCommand(l.Data)
}
