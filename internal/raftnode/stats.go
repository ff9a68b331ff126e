package raftnode

import (
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/raft"
)

// Stats is a snapshot of this node's Raft progress, for metrics and
// readiness checks.
type Stats struct {
	Leader       bool   // this node believes it is the leader
	LeaderID     string // the leader this node knows of; "" for none
	Term         uint64
	LastLogIndex uint64 // the last entry in this node's log, committed or not
	CommitIndex  uint64 // the last entry this node knows to be committed
	AppliedIndex uint64 // the last entry applied to this node's state
	// LastContact is when a follower last heard from its leader; zero on
	// the leader and on a follower that never heard from one.
	LastContact time.Time
	// LastSnapshotIndex and LastSnapshotAt describe the newest snapshot on
	// disk; zero when there is none.
	LastSnapshotIndex uint64
	LastSnapshotAt    time.Time
}

// Stats reports this node's Raft progress. It does not wait for Raft's
// main loop, so it is cheap enough for every scrape and probe.
func (n *Node) Stats() Stats {
	st := Stats{
		Leader:       n.raft.State() == raft.Leader,
		LeaderID:     n.LeaderID(),
		Term:         n.raft.CurrentTerm(),
		LastLogIndex: n.raft.LastIndex(),
		CommitIndex:  n.raft.CommitIndex(),
		AppliedIndex: n.raft.AppliedIndex(),
	}
	if !st.Leader {
		st.LastContact = n.raft.LastContact()
	}
	if metas, err := n.snaps.List(); err == nil && len(metas) > 0 {
		st.LastSnapshotIndex = metas[0].Index
		st.LastSnapshotAt = snapshotTime(metas[0].ID)
	}
	return st
}

// snapshotTime reads the creation time that raft's file snapshot store
// writes into a snapshot's ID, "TERM-INDEX-UNIXMILLIS"; zero if the ID has
// another form.
func snapshotTime(id string) time.Time {
	i := strings.LastIndexByte(id, '-')
	if i < 0 {
		return time.Time{}
	}
	ms, err := strconv.ParseInt(id[i+1:], 10, 64)
	if err != nil || ms <= 0 {
		return time.Time{}
	}
	return time.UnixMilli(ms)
}

// Term returns this node's current Raft term.
func (n *Node) Term() uint64 { return n.raft.CurrentTerm() }
