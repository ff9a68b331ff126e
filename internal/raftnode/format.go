package raftnode

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/raft"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/internal/fsm"
)

// Rolling upgrades. Replicas of different builds apply the same log alike
// as long as the log holds only what the oldest build understands: what a
// command does is fixed by the cluster's log format (fsm.State.Format),
// which an OpSetFormat entry raises. The leader proposes it only once every
// member of the configuration answers, over the Raft transport, that it
// knows the new format (raiseFormat). A build that meets an entry it does
// not understand anyway stops applying (HaltError) instead of applying it
// in its own way.

// probeByte starts a format probe on a Raft connection, in place of the
// RPC type byte raft's transport sends first (0 to 4). A build that does
// not know the probe closes the connection, which counts as "format 1".
const probeByte = 0xf5

// probeInterval is how often a leader asks its peers again while one of
// them runs an older build. Each probe of an older build costs it one
// error line in its log ("unknown rpc type").
const probeInterval = 30 * time.Second

// HaltError is what a node panics with when it meets a log entry it does
// not understand, or one that does not match its checksum. Raft has
// applied every entry before it, and applies nothing after it: the
// process stops, and stops again at the same entry after every restart,
// until it runs a build that understands the entry, or its copy is
// replaced. The other replicas are unharmed.
type HaltError struct {
	Index uint64 // the Raft index of the entry
	Dir   string // the data directory
	Err   error  // wraps fsm.ErrUnknownEntry or ErrDamagedEntry
}

func (e *HaltError) Error() string {
	if errors.Is(e.Err, ErrDamagedEntry) {
		return fmt.Sprintf("raftnode: stopped before log entry %d of the Raft log in %s: %v. "+
			"The entry changed after it was proposed: on this node's disk, or on the disk of the node it was copied from. "+
			"If other nodes stop at the same entry, restart the node they copied it from (a node checks its whole log at start) or replace it. "+
			"Then, in a cluster, replace this node (move its data directory away and add it again); "+
			"alone, restore the data directory from a backup, whose next tokens the token floor keeps above every one issued (docs/operations.md)",
			e.Index, e.Dir, e.Err)
	}
	return fmt.Sprintf("raftnode: stopped before log entry %d of the Raft log in %s, which this build does not understand (%v). "+
		"Either a newer build raised the cluster's log format (this build knows 1 to %d): run that build here (docs/upgrade.md). "+
		"Or this node's copy of the entry is damaged: in a cluster, replace this node (move its data directory away and add it again); "+
		"alone, restore the data directory from a backup, whose next tokens the token floor keeps above every one issued (docs/operations.md)",
		e.Index, e.Dir, e.Err, fsm.LogFormat)
}

func (e *HaltError) Unwrap() error { return e.Err }

// halt stops the node at the entry l, which it cannot decode or which is
// damaged: it logs why, then panics, so that Raft's goroutine that
// applies entries, and with it the process, stops there. Returning would
// let Raft go on to the next entry and count this one as applied;
// recording it as invalid would apply it otherwise than the replicas that
// understand it.
func (m *machine) halt(l *raft.Log, err error) {
	h := &HaltError{Index: l.Index, Dir: m.cfg.DataDir, Err: err}
	what := "stopping: a log entry this build does not understand"
	if errors.Is(err, ErrDamagedEntry) {
		what = "stopping: a damaged log entry"
	}
	m.cfg.Logger.Error(what, "index", l.Index, "term", l.Term,
		"err", err, "known_log_formats", fmt.Sprintf("1-%d", fsm.LogFormat))
	panic(h)
}

// probeConn is a connection accepted by the Raft listener that answers a
// format probe instead of passing it to raft. It looks at the first byte
// as raft reads it, so a slow peer holds up only its own connection.
type probeConn struct {
	net.Conn
	once sync.Once
}

func (c *probeConn) Read(p []byte) (int, error) {
	probed := false
	var (
		n   int
		err error
	)
	c.once.Do(func() {
		n, err = c.Conn.Read(p)
		if n > 0 && p[0] == probeByte {
			probed = true
		}
	})
	if probed {
		// Answer, then end the connection: raft reads the end of a
		// connection without a word.
		c.Conn.SetWriteDeadline(time.Now().Add(5 * time.Second))
		c.Conn.Write([]byte{probeByte, fsm.LogFormat})
		c.Conn.Close()
		return 0, io.EOF
	}
	if n > 0 || err != nil {
		return n, err
	}
	return c.Conn.Read(p)
}

// probeFormat asks the node at addr for the highest log format its build
// knows: 1 for a build from before the probe, which drops the connection.
func (l *tcpLayer) probeFormat(addr raft.ServerAddress) (int, error) {
	conn, err := l.Dial(addr, 3*time.Second)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := conn.Write([]byte{probeByte}); err != nil {
		return 0, err
	}
	var b [2]byte
	if _, err := io.ReadFull(conn, b[:]); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return 1, nil // an older build closed on the unknown RPC type
		}
		return 0, err
	}
	if b[0] != probeByte || b[1] == 0 {
		return 0, fmt.Errorf("answer %x to a format probe", b)
	}
	return int(b[1]), nil
}

// Format returns the cluster's log format as this node has applied it. It
// is safe for concurrent use, and does not wait while a batch of entries
// applies: Apply reads it for every command it encodes.
func (n *Node) Format() int { return int(n.format.Load()) }

// raiseFormat runs while this node leads: until the cluster's log format is
// this build's, it asks every other member which formats its build knows,
// and raises the format once all of them know it.
func (n *Node) raiseFormat(ctx context.Context) {
	// A new leader may not have applied its whole log yet, the entry that
	// raised the format included: read the format once it has, or it
	// would raise the format again and say so.
	for {
		err := n.Barrier(ctx)
		if err == nil {
			break
		}
		if errors.Is(err, errClosed) || !pause(ctx) {
			return
		}
	}
	for {
		err := n.RaiseFormat(ctx)
		if err == nil {
			return
		}
		if errors.Is(err, errClosed) || ctx.Err() != nil {
			return // closing, or no longer leader: nothing went wrong
		}
		n.cfg.Logger.Warn("cannot raise the log format yet", "err", err, "log_format", n.Format(), "this_build", fsm.LogFormat)
		if !pause(ctx) {
			return
		}
	}
}

// RaiseFormat raises the cluster's log format to this build's, once every
// member says that its build knows it; it returns nil at once if the
// format is raised already. The caller must have applied the whole log
// (a Barrier), or it may raise the format a second time. It is safe for
// concurrent use.
func (n *Node) RaiseFormat(ctx context.Context) error {
	// The office and the loop of raiseFormat may both try at once: one
	// raises, the other finds it raised. A voter being added (AddVoter)
	// is in the configuration membersBehind reads once the lock is ours.
	unlock, err := n.lockMembers(ctx)
	if err != nil {
		return err
	}
	defer unlock()
	if n.Format() >= fsm.LogFormat {
		return nil
	}
	behind, err := n.membersBehind()
	if err != nil {
		return err
	}
	if behind != "" {
		return fmt.Errorf("member %s runs a build older than log format %d", behind, fsm.LogFormat)
	}
	r, err := n.Apply(ctx, fsm.Command{Op: fsm.OpSetFormat, Format: fsm.LogFormat, At: time.Now().UnixNano()})
	if err == nil && r.Outcome == fsm.Invalid {
		err = r.Err
	}
	if err != nil {
		return fmt.Errorf("raise the log format: %w", err)
	}
	n.cfg.Logger.Info("raised the cluster's log format", "log_format", fsm.LogFormat)
	return nil
}

// pause waits probeInterval, and reports false if ctx ends first.
func pause(ctx context.Context) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(probeInterval):
		return true
	}
}

// membersBehind returns the ID of a member whose build does not know this
// build's log format, or "" if every member knows it.
func (n *Node) membersBehind() (string, error) {
	f := n.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return "", raftError(err)
	}
	for _, s := range f.Configuration().Servers {
		if string(s.ID) == n.cfg.NodeID {
			continue
		}
		if n.layer == nil {
			return string(s.ID), nil // unreachable: without a listener, a node has no peers
		}
		got, err := n.layer.probeFormat(s.Address)
		if err != nil {
			return "", fmt.Errorf("ask %s which log formats it knows: %w", s.ID, err)
		}
		if got < fsm.LogFormat {
			return string(s.ID), nil
		}
	}
	return "", nil
}

// knowsFormat refuses a node to be added whose build does not know the
// cluster's log format: it would stop at the entry that raised it, or,
// built before the format existed, apply the log otherwise than the rest.
func (n *Node) knowsFormat(id, raftAddr string) error {
	have := n.Format()
	if have <= 1 {
		return nil
	}
	got, err := n.layer.probeFormat(raft.ServerAddress(raftAddr))
	if err != nil {
		// Unreachable for now (a partition, a node still starting): the
		// node retries its join, where a refusal would stop it for good.
		return fmt.Errorf("%w: node %q does not say which log formats it knows (%v); try again once it is reachable", fence.ErrUnavailable, id, err)
	}
	if got < have {
		return &fence.InvalidError{Field: "raft_addr", Reason: fmt.Sprintf(
			"node %q runs a build that knows log formats 1 to %d, and the cluster's is %d: upgrade it first", id, got, have)}
	}
	return nil
}
