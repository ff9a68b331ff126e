// Package raftnode runs fence's state machine under hashicorp/raft: the FSM
// adapter, the log and stable store (raft-boltdb, or raft-wal), the file
// snapshot store, and raft futures turned into context-aware calls.
//
// A single node is a one-voter cluster bootstrapped on first start; there is
// one code path for one node and many. Without a Raft address the node talks
// to no one and uses an in-memory transport; with one, peers reach it over
// TCP.
//
// A node applies only log entries its build understands. When it meets one
// it does not (fsm.ErrUnknownEntry: the cluster's log format was raised by
// a newer build, or the entry is corrupt), it logs an error and panics with
// a *HaltError, so the process stops before that entry, and again after
// every restart, until it runs a build that knows it; applying the entry
// differently from the other replicas, or not at all, would make this one
// hand out other tokens than they do. The leader raises the log format
// only once every member says, over the Raft transport, that its build
// knows the new one; see format.go and docs/upgrade.md.
package raftnode

import (
	"bufio"
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	wal "github.com/hashicorp/raft-wal"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/internal/fsm"
)

// Config configures a Node.
type Config struct {
	// NodeID names this node in the Raft configuration.
	NodeID string
	// DataDir holds the log and stable store (raft.db, or wal/) and the
	// snapshots.
	DataDir string
	// LogStore is LogWAL or LogBolt. Empty keeps the kind the data
	// directory holds, and makes a LogWAL in a new one; a data directory
	// never changes kind.
	LogStore string
	// SegmentSize is the size in bytes of a raft-wal segment file; zero
	// means raft-wal's default, 64 MiB. raft-wal drops compacted entries a
	// whole segment at a time, so until a segment fills, a follower that
	// fell behind catches up from the log rather than from a snapshot.
	SegmentSize int
	// RaftListen is the TCP address the Raft transport binds. Empty means a
	// node that is and stays a cluster of one.
	RaftListen string
	// RaftAdvertise is the address peers dial; defaults to RaftListen.
	RaftAdvertise string
	// TLS, when set, runs Raft over mutual TLS: Certificates is this node's
	// certificate, RootCAs the CA every node's certificate must chain to.
	TLS *tls.Config
	// Bootstrap makes a node with an empty data directory a one-voter
	// cluster. Without it, a TCP node with no state waits to be added by
	// the leader. A node without RaftListen always bootstraps.
	Bootstrap bool
	// Restore, when set, is a backup of the lease state (a snapshot as
	// fsm.Frozen.WriteTo writes it: `fencectl backup`, or a snapshot's
	// state.bin) to start a new one-voter cluster from, in place of an
	// empty state. The data directory must hold no Raft state.
	Restore string
	// ElectionTimeout is how long, on average, followers go without
	// hearing from the leader before they elect another (see timeouts);
	// zero means DefaultElectionTimeout. At least MinElectionTimeout.
	ElectionTimeout time.Duration
	// SnapshotThreshold is how many log entries since the last snapshot
	// trigger a new one (zero: 8192), checked every SnapshotInterval (zero:
	// 120s, with jitter).
	SnapshotThreshold uint64
	SnapshotInterval  time.Duration
	// Logger receives Raft's own messages: its warnings and errors at
	// their levels, its informational ones at debug. In a cluster of one
	// (no RaftListen) the election at every start is logged at debug, not
	// as raft's warning.
	Logger *slog.Logger
	// OnEvents is called, in log order, with the lease transitions of each
	// applied command, after the state is updated and before the command's
	// proposer is answered. It must not block.
	OnEvents func([]fsm.Event)
	// OnRestore is called with the new state after the state was replaced
	// by a snapshot (at start, or installed from the leader), on the
	// goroutine that applies commands: no command's events come between the
	// state it reads and the events OnEvents gets next. It must only read
	// st, not keep it, and not block.
	OnRestore func(st *fsm.State)
	// OnLeader is called with true when this node becomes leader and with
	// false when it stops being leader. Calls are serialised.
	OnLeader func(bool)
	// OnLeaderChange is called with the new leader's ID ("" for none)
	// whenever this node learns of a change of leader. It must not block.
	OnLeaderChange func(id string)
}

// Node is one member of the lease state's Raft cluster. Its methods are safe
// for concurrent use.
type Node struct {
	cfg   Config
	raft  *raft.Raft
	store logStore
	lock  *os.File // the data directory's LOCK, held while the node runs
	// logKind is LogWAL or LogBolt, the store's kind.
	logKind string
	snaps   raft.SnapshotStore
	trans   io.Closer
	layer   *tcpLayer // nil without a Raft listener
	notify  chan bool
	done    chan struct{}
	wg      sync.WaitGroup

	mu    sync.RWMutex // guards state
	state *fsm.State
	// format is the state's log format as of its last change (Format).
	format atomic.Int64
	// members is a lock of one slot, held by RaiseFormat and AddVoter
	// (lockMembers): a raise of the log format reads the configuration
	// only after any voter being added is in it, and a voter is checked
	// against the format and added with no raise in between.
	members chan struct{}

	// calls is held for reading from the start of every Raft operation
	// until its future has answered, and for writing by Close: Raft never
	// answers a future still queued when it shuts down, so shutting down
	// under a waiting call would leave that call waiting for ever.
	calls  sync.RWMutex
	closed bool // guarded by calls

	confirms rounds // ConfirmLeader's Barriers
}

// ErrNoLeader reports a write or consistent read on a node that is not the
// leader. It wraps fence.ErrUnavailable.
var ErrNoLeader = fmt.Errorf("%w: this node is not the leader", fence.ErrUnavailable)

// Open starts a node on cfg.DataDir, bootstrapping a one-voter cluster if the
// directory holds no Raft state yet.
func Open(cfg Config) (*Node, error) {
	if cfg.NodeID == "" {
		return nil, errors.New("raftnode: empty node ID")
	}
	if err := CheckElectionTimeout(cfg.ElectionTimeout); err != nil {
		return nil, fmt.Errorf("raftnode: %w", err)
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("create data dir: %w", err)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	lock, err := lockDir(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	n := &Node{cfg: cfg, state: fsm.New(), notify: make(chan bool, 16), done: make(chan struct{}), lock: lock, members: make(chan struct{}, 1)}
	n.format.Store(int64(n.state.Format()))
	n.confirms.run = n.confirmRound
	logger := newRaftLogger(cfg.Logger, cfg.RaftListen == "")

	opened, kind, err := openLog(cfg.DataDir, cfg.LogStore, cfg.SegmentSize)
	if err != nil {
		n.unlock()
		return nil, err
	}
	store := &haltingStore{logStore: opened, dir: cfg.DataDir, log: cfg.Logger}
	n.store, n.logKind = store, kind
	snaps, err := raft.NewFileSnapshotStoreWithLogger(cfg.DataDir, 2, logger)
	if err != nil {
		store.Close()
		n.unlock()
		return nil, fmt.Errorf("open snapshot store: %w", err)
	}
	n.snaps = snaps

	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(cfg.NodeID)
	rc.Logger = logger
	rc.NotifyCh = n.notify
	rc.HeartbeatTimeout, rc.ElectionTimeout, rc.LeaderLeaseTimeout = timeouts(cmp.Or(cfg.ElectionTimeout, DefaultElectionTimeout))
	if cfg.SnapshotThreshold > 0 {
		rc.SnapshotThreshold = cfg.SnapshotThreshold
		rc.TrailingLogs = max(cfg.SnapshotThreshold/2, 64)
	}
	if cfg.SnapshotInterval > 0 {
		rc.SnapshotInterval = cfg.SnapshotInterval
	}
	// Group commit: the leader writes up to MaxAppendEntries queued
	// commands with one fsync.
	rc.MaxAppendEntries = 1024
	rc.BatchApplyCh = true

	var trans raft.Transport
	if cfg.RaftListen == "" {
		_, t := raft.NewInmemTransport(raft.ServerAddress("inmem:" + cfg.NodeID))
		trans, n.trans = t, t
		cfg.Bootstrap = true
	} else {
		layer, err := listen(cfg.RaftListen, cmp.Or(cfg.RaftAdvertise, cfg.RaftListen), cfg.TLS)
		if err != nil {
			store.Close()
			n.unlock()
			return nil, err
		}
		t := raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
			Stream: layer, MaxPool: 3, Timeout: 10 * time.Second, Logger: logger,
		})
		trans, n.trans, n.layer = t, t, layer
	}
	fail := func(err error) (*Node, error) {
		n.trans.Close()
		store.Close()
		n.unlock()
		return nil, err
	}
	existing, err := raft.HasExistingState(store, store, snaps)
	if err != nil {
		return fail(fmt.Errorf("inspect raft state: %w", err))
	}
	if err := checkNewestSnapshot(snaps, cfg.DataDir); err != nil {
		return fail(err)
	}
	if err := checkApplied(cfg.DataDir, store, snaps); err != nil {
		return fail(err)
	}
	boot := raft.Configuration{Servers: []raft.Server{{ID: rc.LocalID, Address: trans.LocalAddr()}}}
	switch {
	case cfg.Restore != "" && existing:
		return fail(fmt.Errorf("raftnode: restore %s: %s already holds Raft state; restore into a new, empty data directory", cfg.Restore, cfg.DataDir))
	case cfg.Restore != "":
		if err := restoreBackup(cfg.Restore, store, snaps, boot, trans); err != nil {
			return fail(err)
		}
	case !existing && cfg.Bootstrap:
		if err := raft.BootstrapCluster(rc, store, store, snaps, trans, boot); err != nil {
			return fail(fmt.Errorf("bootstrap: %w", err))
		}
	}
	r, err := newRaft(rc, (*machine)(n), store, snaps, trans)
	if err != nil {
		return fail(fmt.Errorf("start raft in %s: %w; if a file in it was damaged: "+
			"in a cluster, replace this node; alone, restore a backup (docs/operations.md)", cfg.DataDir, err))
	}
	n.raft = r
	if cfg.OnLeaderChange != nil {
		obs := make(chan raft.Observation, 16)
		r.RegisterObserver(raft.NewObserver(obs, false, func(o *raft.Observation) bool {
			_, ok := o.Data.(raft.LeaderObservation)
			return ok
		}))
		n.wg.Add(1)
		go func() {
			defer n.wg.Done()
			for {
				select {
				case o := <-obs:
					cfg.OnLeaderChange(string(o.Data.(raft.LeaderObservation).LeaderID))
				case <-n.done:
					return
				}
			}
		}()
	}
	n.wg.Add(2)
	go n.watchLeadership()
	go n.recordApplied()
	return n, nil
}

func (n *Node) watchLeadership() {
	defer n.wg.Done()
	stop := func() {}
	defer func() { stop() }()
	for {
		select {
		case leader := <-n.notify:
			// Not waited for: a deposed leader must hear of it at once.
			stop()
			if leader {
				ctx, cancel := context.WithCancel(context.Background())
				n.wg.Add(1)
				go func() {
					defer n.wg.Done()
					n.raiseFormat(ctx)
				}()
				stop = cancel
			} else {
				stop = func() {}
			}
			if n.cfg.OnLeader != nil {
				n.cfg.OnLeader(leader)
			}
		case <-n.done:
			return
		}
	}
}

// Apply replicates c, waits until it is durably committed and applied, and
// returns its result. An error means the outcome is unknown unless it is
// ErrNoLeader from before the command was accepted.
func (n *Node) Apply(ctx context.Context, c fsm.Command) (fsm.Result, error) {
	if !n.begin() {
		return fsm.Result{}, errClosed
	}
	defer n.calls.RUnlock()
	data := c.EncodeFor(n.Format())
	f := n.raft.ApplyLog(raft.Log{Data: data, Extensions: entrySum(data)}, timeout(ctx, 10*time.Second))
	if err := f.Error(); err != nil {
		return fsm.Result{}, raftError(err)
	}
	return f.Response().(fsm.Result), nil
}

// Barrier waits until every command committed before it is applied here.
// A new leader calls it before serving, so its state is complete.
func (n *Node) Barrier(ctx context.Context) error {
	if !n.begin() {
		return errClosed
	}
	defer n.calls.RUnlock()
	return raftError(n.raft.Barrier(timeout(ctx, 30*time.Second)).Error())
}

// begin starts a Raft operation, unless the node is closed: on true, the
// caller must release n.calls once the operation's future has answered.
func (n *Node) begin() bool {
	n.calls.RLock()
	if n.closed {
		n.calls.RUnlock()
		return false
	}
	return true
}

var errClosed = fmt.Errorf("%w: shutting down", fence.ErrUnavailable)

// IsLeader reports whether this node currently believes it is the leader.
func (n *Node) IsLeader() bool { return n.raft.State() == raft.Leader }

// Read calls f with the state, under a read lock. f must not keep the
// pointer or call Apply.
func (n *Node) Read(f func(*fsm.State)) {
	n.mu.RLock()
	defer n.mu.RUnlock()
	f(n.state)
}

// Snapshot takes a Raft snapshot now and compacts the log.
func (n *Node) Snapshot() error {
	if !n.begin() {
		return errClosed
	}
	defer n.calls.RUnlock()
	return n.raft.Snapshot().Error()
}

// LogStore says which log store the node keeps its Raft log in: LogWAL or
// LogBolt. It is safe for concurrent use.
func (n *Node) LogStore() string { return n.logKind }

// Close stops Raft and closes the stores, once the operations under way
// have answered. Raft answers each soon: a leader that cannot reach a
// quorum steps down within its lease timeout and fails what it holds.
func (n *Node) Close() error {
	n.calls.Lock()
	n.closed = true
	n.calls.Unlock()
	err := n.raft.Shutdown().Error()
	close(n.done)
	n.wg.Wait()
	n.trans.Close()
	// A network transport's Close leaves the connections it pooled for
	// calls to peers open, and the peers' handlers waiting on them.
	if t, ok := n.trans.(interface{ CloseStreams() }); ok {
		t.CloseStreams()
	}
	err = errors.Join(err, n.store.Close())
	n.unlock()
	return err
}

// newRaft is raft.NewRaft, with a panic turned into an error: reading a
// damaged log or snapshot at start, raft panics (a configuration or a
// time that does not decode), where the caller can say which directory
// and what to do.
func newRaft(rc *raft.Config, fsm raft.FSM, store logStore, snaps raft.SnapshotStore, trans raft.Transport) (r *raft.Raft, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("reading the log or a snapshot: %v", p)
		}
	}()
	return raft.NewRaft(rc, fsm, store, store, snaps, trans)
}

// checkNewestSnapshot refuses a data directory whose newest snapshot does
// not read back whole (raft checks its CRC). Raft would fall back to an
// older snapshot and then panic ("log not found"), since the log was
// compacted past it; better to say which file is damaged and what to do.
func checkNewestSnapshot(snaps raft.SnapshotStore, dir string) error {
	metas, err := snaps.List()
	if err != nil {
		return fmt.Errorf("list the snapshots in %s: %w", dir, err)
	}
	if len(metas) == 0 {
		return nil
	}
	_, rc, err := snaps.Open(metas[0].ID)
	if err != nil {
		return fmt.Errorf("raftnode: the newest snapshot, %s, is damaged (%v): this node cannot rebuild its state. "+
			"In a cluster, replace this node: move its data directory away and add it again, and it copies the leader's state. "+
			"Alone, restore the data directory from a backup; the token floor keeps its next tokens above every one issued (docs/operations.md)",
			filepath.Join(dir, "snapshots", metas[0].ID), err)
	}
	return rc.Close()
}

// unlock lets another process open the data directory.
func (n *Node) unlock() {
	if n.lock != nil {
		n.lock.Close()
	}
}

// InUseError reports a data directory another process holds: two nodes
// on one directory would write one log from two places.
type InUseError struct {
	Dir string
	PID int // 0 if unknown
}

func (e *InUseError) Error() string {
	who := "another process"
	if e.PID != 0 {
		who = fmt.Sprintf("process %d", e.PID)
	}
	return fmt.Sprintf("data dir %s is in use by %s: stop it, or give this node a --data-dir of its own", e.Dir, who)
}

func raftError(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, raft.ErrNotLeader), errors.Is(err, raft.ErrLeadershipLost),
		errors.Is(err, raft.ErrLeadershipTransferInProgress), errors.Is(err, raft.ErrAbortedByRestore):
		return fmt.Errorf("%w (%v)", ErrNoLeader, err)
	case errors.Is(err, raft.ErrRaftShutdown):
		return errClosed
	case errors.Is(err, raft.ErrEnqueueTimeout):
		return fmt.Errorf("%w: %v", fence.ErrUnavailable, err)
	}
	return err
}

// machine adapts Node to raft.FSM and raft.BatchingFSM.
type machine Node

func (m *machine) Apply(l *raft.Log) any {
	return m.ApplyBatch([]*raft.Log{l})[0]
}

func (m *machine) ApplyBatch(logs []*raft.Log) []any {
	out := make([]any, len(logs))
	var events []fsm.Event
	m.mu.Lock()
	for i, l := range logs {
		if l.Type != raft.LogCommand {
			out[i] = fsm.Result{Outcome: fsm.NoOp}
			continue
		}
		c, err := decodeEntry(l)
		if errors.Is(err, fsm.ErrUnknownEntry) || errors.Is(err, ErrDamagedEntry) {
			m.mu.Unlock()
			m.halt(l, err)
		}
		if err != nil {
			// A known command, malformed: every build that knows it
			// refuses it alike, which keeps every replica equal.
			out[i] = fsm.Result{Outcome: fsm.Invalid, Err: err}
			continue
		}
		r := m.state.Apply(c)
		events = append(events, r.Events...)
		out[i] = r
	}
	m.format.Store(int64(m.state.Format()))
	m.mu.Unlock()
	if len(events) > 0 && m.cfg.OnEvents != nil {
		m.cfg.OnEvents(events)
	}
	return out
}

func (m *machine) Snapshot() (raft.FSMSnapshot, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return snapshot{m.state.Freeze()}, nil
}

func (m *machine) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	st, err := fsm.RestoreFrom(bufio.NewReaderSize(rc, 1<<20))
	if err != nil {
		return err
	}
	m.mu.Lock()
	m.state = st
	m.format.Store(int64(st.Format()))
	m.mu.Unlock()
	if m.cfg.OnRestore != nil {
		// Read without the lock: only this goroutine writes the state.
		m.cfg.OnRestore(st)
	}
	return nil
}

// snapshot is encoded and written by Raft's snapshot goroutine, while
// commands go on being applied.
type snapshot struct{ f *fsm.Frozen }

func (s snapshot) Persist(sink raft.SnapshotSink) error {
	w := bufio.NewWriterSize(sink, 1<<20)
	_, err := s.f.WriteTo(w)
	if err == nil {
		err = w.Flush()
	}
	if err != nil {
		sink.Cancel()
		return err
	}
	return sink.Close()
}

func (snapshot) Release() {}

// FreeSpace returns the bytes still free on the data directory's file
// system. It is safe for concurrent use.
func (n *Node) FreeSpace() (uint64, error) { return freeSpace(n.cfg.DataDir) }

// SegmentSize returns the size of a raft-wal segment file, which the log
// takes whole when it rolls over to a new one (zero for raft-boltdb).
func (n *Node) SegmentSize() int {
	if n.logKind != LogWAL {
		return 0
	}
	return cmp.Or(n.cfg.SegmentSize, wal.DefaultSegmentSize)
}
