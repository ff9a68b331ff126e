package raftnode

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/raft"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/internal/fsm"
)

// Server is one member of the Raft configuration.
type Server struct {
	ID       string
	RaftAddr string
	Voter    bool
}

// Status is this node's view of the cluster.
type Status struct {
	NodeID       string
	State        string // leader, follower, candidate or shutdown
	LeaderID     string // empty while there is none known
	Term         uint64
	CommitIndex  uint64
	AppliedIndex uint64
	Servers      []Server
}

// Status reports this node's view of the cluster.
func (n *Node) Status() (Status, error) {
	f := n.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return Status{}, raftError(err)
	}
	_, leader := n.raft.LeaderWithID()
	st := Status{
		NodeID:       n.cfg.NodeID,
		State:        stateName(n.raft.State()),
		LeaderID:     string(leader),
		Term:         n.raft.CurrentTerm(),
		CommitIndex:  n.raft.CommitIndex(),
		AppliedIndex: n.raft.AppliedIndex(),
	}
	for _, s := range f.Configuration().Servers {
		st.Servers = append(st.Servers, Server{ID: string(s.ID), RaftAddr: string(s.Address), Voter: s.Suffrage == raft.Voter})
	}
	return st, nil
}

func stateName(s raft.RaftState) string {
	switch s {
	case raft.Leader:
		return "leader"
	case raft.Follower:
		return "follower"
	case raft.Candidate:
		return "candidate"
	case raft.Shutdown:
		return "shutdown"
	}
	return "unknown"
}

// LeaderID returns the ID of the leader this node knows of, or "".
func (n *Node) LeaderID() string {
	_, id := n.raft.LeaderWithID()
	return string(id)
}

// RaftAddr returns the address peers reach this node's transport at.
func (n *Node) RaftAddr() string {
	if t, ok := n.trans.(raft.Transport); ok {
		return string(t.LocalAddr())
	}
	return ""
}

// VerifyLeader confirms, with a round trip to a quorum, that this node is
// the leader, so that a deposed leader that has not noticed answers reads
// with nothing staler than the moment the answers were sent. Raft counts
// the answers to heartbeats sent before the call as well; renewals, which
// need more, call ConfirmLeader.
func (n *Node) VerifyLeader(ctx context.Context) error {
	return n.wait(ctx, n.raft.VerifyLeader)
}

// ConfirmLeader confirms that this node still led at some moment after the
// call: a renewal it then confirms counts from before that moment, and no
// other leader can have taken office, and started every held lease's TTL
// afresh, before it. In a cluster it commits an entry to a quorum's logs
// (a Barrier), which only answers to appends sent after the call can do.
// VerifyLeader is not enough: raft counts an answer to a heartbeat sent
// before the call, and a leader paused with one in flight, deposed
// meanwhile, would find it waiting when it wakes. The only voter has no
// one to be deposed by, and verifies without writing.
func (n *Node) ConfirmLeader(ctx context.Context) error {
	f := n.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return raftError(err)
	}
	voters := 0
	for _, s := range f.Configuration().Servers {
		if s.Suffrage == raft.Voter {
			voters++
		}
	}
	if voters <= 1 {
		return n.VerifyLeader(ctx)
	}
	r := n.confirms.join()
	select {
	case <-r.done:
		return r.err
	case <-ctx.Done():
		return fmt.Errorf("%w: %v", fence.ErrUnavailable, ctx.Err())
	}
}

// confirmRound is one round of ConfirmLeader: a Barrier committed.
func (n *Node) confirmRound() error {
	return n.wait(context.Background(), func() raft.Future { return n.raft.Barrier(10 * time.Second) })
}

// rounds shares one Barrier among the confirmations that wait at once,
// which would otherwise each write an entry of their own. A caller joins
// the round after the one running, which starts only when that one ends,
// so the Barrier that answers it is always issued after it came.
type rounds struct {
	run func() error // one round's work: a Barrier

	mu      sync.Mutex
	running bool
	next    *round
}

type round struct {
	done chan struct{} // closed when err is set
	err  error
}

// join returns the round a caller waits for, starting it if no round is
// running.
func (rs *rounds) join() *round {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.next == nil {
		rs.next = &round{done: make(chan struct{})}
	}
	r := rs.next
	if !rs.running {
		rs.running, rs.next = true, nil
		go rs.runFrom(r)
	}
	return r
}

// runFrom runs r, then each round that callers joined meanwhile, until
// none did.
func (rs *rounds) runFrom(r *round) {
	for r != nil {
		r.err = rs.run()
		close(r.done)
		rs.mu.Lock()
		r, rs.next = rs.next, nil
		rs.running = r != nil
		rs.mu.Unlock()
	}
}

// AddVoter records id's API address in the replicated state, which refuses
// a removed ID, then makes id a voter at raftAddr. Adding a voter that is
// already a voter at that address changes nothing in the configuration.
//
// A node without a Raft listener refuses: it can never reach a peer, so
// the voter it added would never answer, and a cluster of one plus a voter
// that never answers has no quorum and stops granting.
func (n *Node) AddVoter(ctx context.Context, id, raftAddr, apiAddr string) error {
	if n.cfg.RaftListen == "" {
		return &fence.InvalidError{Field: "raft_addr", Reason: fmt.Sprintf(
			"node %q runs without a Raft listener (--raft-listen) and cannot reach peers; only nodes started with --raft-listen form a cluster", n.cfg.NodeID)}
	}
	// From the check of the node's build to its entry in the
	// configuration, no raise of the log format (RaiseFormat) comes in
	// between: the node would stop at the entry that raised it. A lone
	// leader raises at once, so a first join would often meet one.
	unlock, err := n.lockMembers(ctx)
	if err != nil {
		return err
	}
	held := true
	defer func() {
		if held {
			unlock()
		}
	}()
	// A member already at that address (restarted with --join) is not
	// dialled nor probed: adding it again changes nothing, and a member cut
	// off for now would be refused for good.
	if !n.isMember(id, raftAddr) {
		if err := n.reachable(id, raftAddr); err != nil {
			return err
		}
		// A new leader may not have applied a raise committed before it
		// took office: check against the format once it has.
		if err := n.Barrier(ctx); err != nil {
			return err
		}
		if err := n.knowsFormat(id, raftAddr); err != nil {
			return err
		}
	}
	r, err := n.Apply(ctx, fsm.Command{Op: fsm.OpSetNode, Node: id, Addr: apiAddr})
	if err != nil {
		return err
	}
	if r.Outcome == fsm.Invalid {
		return r.Err
	}
	// The lock is let go when raft has answered, even after ctx ends: a
	// raise must not read the configuration while the voter may still
	// enter it.
	held = false
	return n.waitThen(ctx, func() raft.Future {
		return n.raft.AddVoter(raft.ServerID(id), raft.ServerAddress(raftAddr), 0, timeout(ctx, 10*time.Second))
	}, unlock)
}

// lockMembers takes the lock RaiseFormat and AddVoter hold, and returns
// the function that lets it go; it gives up when ctx ends first.
func (n *Node) lockMembers(ctx context.Context) (unlock func(), err error) {
	select {
	case n.members <- struct{}{}:
		return func() { <-n.members }, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("%w: waiting for a change of the configuration or log format: %v", fence.ErrUnavailable, ctx.Err())
	}
}

// reachable refuses to add a voter whose Raft address does not answer this
// node (with the cluster's certificate, under TLS): a voter that never
// answers counts against the quorum from the moment it is added, and a
// cluster of one plus such a voter stops granting.
func (n *Node) reachable(id, raftAddr string) error {
	conn, err := n.layer.Dial(raft.ServerAddress(raftAddr), 3*time.Second)
	if err != nil {
		return &fence.InvalidError{Field: "raft_addr", Reason: fmt.Sprintf(
			"node %q does not answer at %s (%v); start it first: a voter that never answers would cost the cluster its quorum", id, raftAddr, err)}
	}
	return conn.Close()
}

// isMember reports whether id is a member of the configuration at raftAddr.
func (n *Node) isMember(id, raftAddr string) bool {
	f := n.raft.GetConfiguration()
	if f.Error() != nil {
		return false
	}
	for _, sv := range f.Configuration().Servers {
		if string(sv.ID) == id && string(sv.Address) == raftAddr {
			return true
		}
	}
	return false
}

// HandOff passes the leadership to the most up-to-date other voter, if
// this node leads and has another voter; otherwise it does nothing and
// reports false. A leader that stops without handing off leaves its
// cluster without one until the followers' election timeout; the voter
// handed to starts its election at once (Raft's TimeoutNow). HandOff
// returns once this node has stepped down for that election, or with an
// error after an election timeout; meanwhile Raft refuses new commands
// with ErrNoLeader, which clients retry.
func (n *Node) HandOff(ctx context.Context) (bool, error) {
	if !n.IsLeader() {
		return false, nil
	}
	f := n.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return false, raftError(err)
	}
	others := false
	for _, s := range f.Configuration().Servers {
		others = others || s.Suffrage == raft.Voter && string(s.ID) != n.cfg.NodeID
	}
	if !others {
		return false, nil
	}
	return true, n.wait(ctx, n.raft.LeadershipTransfer)
}

// RemoveServer takes id out of the configuration and records it as removed
// for good.
func (n *Node) RemoveServer(ctx context.Context, id string) error {
	err := n.wait(ctx, func() raft.Future {
		return n.raft.RemoveServer(raft.ServerID(id), 0, timeout(ctx, 10*time.Second))
	})
	if err != nil {
		return err
	}
	_, err = n.Apply(ctx, fsm.Command{Op: fsm.OpForgetNode, Node: id})
	return err
}

// wait starts a Raft operation and waits for its future, giving up when
// ctx ends; raft futures cannot be cancelled, so the operation may still
// complete afterwards (and Close waits for it).
func (n *Node) wait(ctx context.Context, start func() raft.Future) error {
	return n.waitThen(ctx, start, func() {})
}

// waitThen is wait, and runs then once the future has answered, or at
// once if the operation never starts.
func (n *Node) waitThen(ctx context.Context, start func() raft.Future, then func()) error {
	if !n.begin() {
		then()
		return errClosed
	}
	f := start()
	done := make(chan error, 1)
	go func() {
		defer n.calls.RUnlock()
		err := f.Error()
		then()
		done <- err
	}()
	select {
	case err := <-done:
		return raftError(err)
	case <-ctx.Done():
		return fmt.Errorf("%w: %v", fence.ErrUnavailable, ctx.Err())
	}
}

// timeout is what is left of ctx's deadline, or def without one: raft's
// calls take a duration, not a context.
func timeout(ctx context.Context, def time.Duration) time.Duration {
	if d, ok := ctx.Deadline(); ok {
		return time.Until(d)
	}
	return def
}
