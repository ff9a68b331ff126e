package server

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/internal/fsm"
	"github.com/fence-dev/fence/internal/raftnode"
)

// Config configures a fenced server.
type Config struct {
	// NodeID names this node in the Raft configuration.
	NodeID string
	// DataDir holds the Raft log, stable store and snapshots.
	DataDir string
	// Listen is the API's TCP address; port 0 picks a free port.
	Listen string
	// Advertise is the API address peers forward to; defaults to the
	// address Listen bound.
	Advertise string
	// RaftListen is the Raft transport's TCP address. Empty: a single node
	// that never has peers.
	RaftListen string
	// RaftAdvertise is the Raft address peers dial; defaults to RaftListen.
	RaftAdvertise string
	// Bootstrap makes a node with an empty data directory a new one-voter
	// cluster (a node without RaftListen always is one).
	Bootstrap bool
	// Restore, when set, is a backup (`fencectl backup`, or a snapshot's
	// state.bin) that a node with an empty data directory starts a new
	// one-voter cluster from. Its tokens need no number: it takes office
	// above the token floor.
	Restore string
	// Join lists API addresses of cluster members to ask to add this node.
	Join []string
	// ElectionTimeout is how long, on average, followers go without
	// hearing from the leader before they elect another: half of it to
	// one and a half times it (raftnode's timeouts). Zero means
	// raftnode.DefaultElectionTimeout, 1s; at least
	// raftnode.MinElectionTimeout.
	ElectionTimeout time.Duration
	// RaftLog is the log store: raftnode.LogWAL or raftnode.LogBolt. Empty
	// keeps the one the data directory holds, and makes raft-wal in a new
	// one. A data directory keeps the kind it was made with.
	RaftLog string
	// RaftSegmentSize is the size in bytes of a raft-wal segment file; zero
	// means 64 MiB.
	RaftSegmentSize int
	// SnapshotThreshold is how many log entries trigger a snapshot, checked
	// every SnapshotInterval; zero means Raft's defaults (8192, 120s).
	SnapshotThreshold uint64
	SnapshotInterval  time.Duration
	// DefaultTTL is the TTL of an acquire that names none.
	DefaultTTL time.Duration
	// MinTTL and MaxTTL bound the TTL an acquire may ask for.
	MinTTL, MaxTTL time.Duration
	// SignTokens makes the service sign every token it grants (Ed25519,
	// keys replicated with the state, public keys served at /keys).
	SignTokens bool
	// KeyGrace is how long a rotated-out key keeps verifying.
	KeyGrace time.Duration
	// KeyPublishDelay is how long a rotated-in key is published at /keys
	// before it signs, so that guards, which fetch the keys at most once
	// per interval, know it before any token carries it. Keep it above
	// the guards' refresh interval (signing.Refreshing; a minute in the
	// docs) plus the clock skew between nodes. 0 signs at once.
	KeyPublishDelay time.Duration
	// MaxWaiters bounds each scope's line of waiting acquires (0: none).
	MaxWaiters int
	// MaxLeasesPerIdentity bounds the leases one authenticated identity
	// holds at once, or with auth off one holder name (0: none).
	MaxLeasesPerIdentity int
	// MaxWaitersPerIdentity bounds the acquires with wait one identity, or
	// with auth off one holder name, has under way at once (0: none).
	MaxWaitersPerIdentity int
	// MaxConns bounds the API connections open at once, and
	// MaxConnsPerAddr those from one remote IP address (or IPv6 /64); a
	// connection beyond either is closed as soon as it is accepted. 0
	// means the default: three quarters of the process's open-file limit
	// (RLIMIT_NOFILE), and 1024 per address (or MaxConns if lower).
	MaxConns, MaxConnsPerAddr int
	// ReadTimeout bounds the reading of a whole request, its body included
	// (over HTTP/2: of each stream's headers and body), from the end of
	// its headers; a request whose body is still coming in then fails,
	// and its connection is closed (0: 30s). A watch or a waiting acquire
	// sends its whole request at once and then lasts as long as it needs.
	ReadTimeout time.Duration
	// WriteTimeout cuts off a client that stops reading its answers: a
	// write of an answer that waits this long resets the stream (0: 30s).
	WriteTimeout time.Duration
	// TLS secures the API (and the calls nodes make to each other's API).
	TLS TLS
	// MinFreeSpace is how many bytes the data directory's disk keeps
	// free: below it the leader refuses new grants (Unavailable) and the
	// node is not ready, before a write of the log finds the disk full
	// and stops the node. 0 means twice the raft-wal segment size (or 64
	// MiB with raft-boltdb).
	MinFreeSpace uint64
	// TokenFloor, when set, is a token every token granted after this
	// node takes office is above, for the operator who knows a higher
	// token than the wall clock gives (see docs/operations.md). Without
	// it a new leader's floor is its wall clock in microseconds.
	TokenFloor uint64
	// NoClockFloor leaves the wall clock out of a new leader's token
	// floor, so tokens count 1, 2, 3... It is for a server whose data
	// directory lives and dies with its process (fencetest): anywhere
	// else a lost or restored data directory could issue a token again.
	NoClockFloor bool
	// AuthFile, when set, turns authentication and authorization on: the
	// identities, bearer tokens and rules of an Auth, in JSON.
	AuthFile string
	// Logger receives lease transitions and server events.
	Logger *slog.Logger
}

// DefaultConfig returns the configuration `fenced` starts with.
func DefaultConfig() Config {
	return Config{
		NodeID:     "n1",
		DataDir:    "./fenced-data",
		Listen:     "127.0.0.1:7480",
		DefaultTTL: 10 * time.Second,
		MinTTL:     100 * time.Millisecond,
		MaxTTL:     5 * time.Minute,
		SignTokens: true,
		// etcd's default, and Raft's 500ms heartbeat timeout (raftnode).
		ElectionTimeout: raftnode.DefaultElectionTimeout,
		MaxWaiters:      1000,
		// About 50 MB of state, and 1000 streams waiting: one leaking client
		// cannot exhaust the memory of a node, a worker pool can still wait
		// on many scopes at once.
		MaxLeasesPerIdentity:  100_000,
		MaxWaitersPerIdentity: 1000,
		MaxConns:              defaultMaxConns(openFilesLimit()),
		MaxConnsPerAddr:       min(defaultMaxConnsPerAddr, defaultMaxConns(openFilesLimit())),
		ReadTimeout:           defaultReadTimeout,
		KeyGrace:              24 * time.Hour,
		KeyPublishDelay:       5 * time.Minute,
		Logger:                slog.Default(),
	}
}

// Validate reports the first problem with c.
func (c Config) Validate() error {
	switch {
	case c.NodeID == "":
		return errors.New("node ID is empty")
	case c.DataDir == "":
		return errors.New("data dir is empty")
	case c.MinTTL <= 0:
		return fmt.Errorf("min TTL %v is not positive", c.MinTTL)
	case c.MaxTTL < c.MinTTL:
		return fmt.Errorf("max TTL %v is below the min TTL %v", c.MaxTTL, c.MinTTL)
	case c.DefaultTTL < c.MinTTL || c.DefaultTTL > c.MaxTTL:
		return fmt.Errorf("default TTL %v is outside [%v, %v]", c.DefaultTTL, c.MinTTL, c.MaxTTL)
	case c.Logger == nil:
		return errors.New("logger is nil")
	}
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		return fmt.Errorf("listen address %q: %w", c.Listen, err)
	}
	if c.RaftLog != "" && c.RaftLog != raftnode.LogBolt && c.RaftLog != raftnode.LogWAL {
		return fmt.Errorf("raft log %q: want %s or %s, or empty to keep the data directory's", c.RaftLog, raftnode.LogBolt, raftnode.LogWAL)
	}
	if err := raftnode.CheckElectionTimeout(c.ElectionTimeout); err != nil {
		return err
	}
	if c.RaftSegmentSize != 0 && (c.RaftSegmentSize < 64<<10 || c.RaftSegmentSize > 1<<30) {
		return fmt.Errorf("raft segment size %d bytes: want 65536 (64 KiB) to 1073741824 (1 GiB)", c.RaftSegmentSize)
	}
	if c.TokenFloor >= fence.MaxToken {
		return fmt.Errorf("token floor %d leaves no token to grant; want below %d", c.TokenFloor, uint64(fence.MaxToken))
	}
	if c.MaxWaiters < 0 {
		return fmt.Errorf("max waiters %d is negative", c.MaxWaiters)
	}
	if c.KeyPublishDelay < 0 || c.KeyPublishDelay > fsm.MaxKeyDelay {
		return fmt.Errorf("key publish delay %v: want 0 (a new key signs at once) to %v", c.KeyPublishDelay, fsm.MaxKeyDelay)
	}
	if err := c.validateConns(); err != nil {
		return err
	}
	if c.MaxLeasesPerIdentity < 0 {
		return fmt.Errorf("max leases per identity %d is negative; want 0 (no limit) or more", c.MaxLeasesPerIdentity)
	}
	if c.MaxWaitersPerIdentity < 0 {
		return fmt.Errorf("max waiters per identity %d is negative; want 0 (no limit) or more", c.MaxWaitersPerIdentity)
	}
	if err := c.TLS.validate(); err != nil {
		return err
	}
	if c.Restore != "" && len(c.Join) > 0 {
		return errors.New("give --restore (start a new cluster from a backup) or --join (enter an existing one), not both")
	}
	if c.RaftListen == "" {
		if c.Bootstrap || len(c.Join) > 0 || c.RaftAdvertise != "" {
			return errors.New("--bootstrap, --join and --raft-advertise need --raft-listen: a node without a Raft address is a cluster of one")
		}
		return nil
	}
	if c.Bootstrap && len(c.Join) > 0 {
		return errors.New("give --bootstrap (start a new cluster) or --join (enter an existing one), not both")
	}
	if _, _, err := net.SplitHostPort(c.RaftListen); err != nil {
		return fmt.Errorf("raft listen address %q: %w", c.RaftListen, err)
	}
	if c.Advertise == "" {
		// Peers forward to the address Listen binds: it must be one they can dial.
		host, _, _ := net.SplitHostPort(c.Listen)
		if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
			return fmt.Errorf("API address %q cannot be dialled by peers; give --advertise host:port", c.Listen)
		}
	} else if err := validateHostPort("advertise", c.Advertise); err != nil {
		return err
	}
	return nil
}

const (
	defaultReadTimeout     = 30 * time.Second
	defaultMaxConnsPerAddr = 1024
	// assumedOpenFiles stands for the open-file limit where it cannot be
	// read.
	assumedOpenFiles = 20_000
)

// defaultMaxConns is three quarters of the open-file limit: the rest is
// for the Raft log, snapshots, the connections to peers, and a margin.
func defaultMaxConns(openFiles uint64) int {
	if openFiles == 0 {
		openFiles = assumedOpenFiles
	}
	return int(min(openFiles, 1<<24) / 4 * 3)
}

// connLimits returns the connection limits, defaults filled in.
func (c Config) connLimits() (total, perAddr int) {
	total = cmp.Or(c.MaxConns, defaultMaxConns(openFilesLimit()))
	return total, cmp.Or(c.MaxConnsPerAddr, min(defaultMaxConnsPerAddr, total))
}

func (c Config) validateConns() error {
	switch {
	case c.MaxConns < 0:
		return fmt.Errorf("max conns %d is negative; want 1 or more, or 0 for the default (3/4 of the open-file limit)", c.MaxConns)
	case c.MaxConnsPerAddr < 0:
		return fmt.Errorf("max conns per address %d is negative; want 1 or more, or 0 for the default (1024)", c.MaxConnsPerAddr)
	case c.ReadTimeout < 0:
		return fmt.Errorf("read timeout %v is negative; want a positive duration, or 0 for the default (%v)", c.ReadTimeout, defaultReadTimeout)
	}
	total, perAddr := c.connLimits()
	if files := openFilesLimit(); files > 0 && uint64(total) > files {
		return fmt.Errorf("max conns %d is above the process's open-file limit of %d (RLIMIT_NOFILE): connections past it would fail with \"too many open files\"; raise the limit (ulimit -n) or lower max conns", total, files)
	}
	if perAddr > total {
		return fmt.Errorf("max conns per address %d is above max conns %d; want at most %d", perAddr, total, total)
	}
	return nil
}
