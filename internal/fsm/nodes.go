package fsm

import (
	"fmt"
	"maps"
	"slices"
	"unicode/utf8"

	"github.com/fence-dev/fence"
)

// The cluster's membership lives in Raft's configuration; what Raft does not
// know is where each node serves the lease API, and which node IDs were
// removed and must never vote again. Both are replicated here so every node
// can forward to the leader and refuse a removed node's rejoin.

const (
	// MaxNodeIDLen bounds a node ID.
	MaxNodeIDLen = 64
	// MaxAddrLen bounds an advertised address.
	MaxAddrLen = 256
)

// ValidateNodeID reports whether id can name a node: 1 to 64 of the
// characters A-Z a-z 0-9 . _ -.
func ValidateNodeID(id string) error {
	if id == "" || len(id) > MaxNodeIDLen {
		return &fence.InvalidError{Field: "node_id", Reason: fmt.Sprintf("%d bytes long; want 1 to %d", len(id), MaxNodeIDLen)}
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-') {
			return &fence.InvalidError{Field: "node_id", Reason: fmt.Sprintf("%q has a character other than A-Z a-z 0-9 . _ -", id)}
		}
	}
	return nil
}

func validateAddr(a string) error {
	if a == "" || len(a) > MaxAddrLen || !utf8.ValidString(a) {
		return &fence.InvalidError{Field: "api_addr", Reason: fmt.Sprintf("want host:port, 1 to %d bytes of UTF-8", MaxAddrLen)}
	}
	return nil
}

func (s *State) setNode(c Command) Result {
	if s.removed[c.Node] {
		return Result{Outcome: Invalid, Err: &fence.InvalidError{Field: "node_id",
			Reason: fmt.Sprintf("node %q was removed from the cluster; join with a new node ID and an empty data directory", c.Node)}}
	}
	s.nodes[c.Node] = c.Addr
	return Result{Outcome: NoOp}
}

func (s *State) forgetNode(c Command) Result {
	delete(s.nodes, c.Node)
	s.removed[c.Node] = true
	return Result{Outcome: NoOp}
}

// Nodes returns the API address of every node that recorded one, by node ID.
func (s *State) Nodes() map[string]string { return maps.Clone(s.nodes) }

// Removed reports whether the node ID was removed from the cluster.
func (s *State) Removed(id string) bool { return s.removed[id] }

func (s *State) removedList() []string { return slices.Sorted(maps.Keys(s.removed)) }
