// Package server is fenced: the lease service's RPC handlers, the stamping
// of commands with time and lease IDs, and the leader-only expiry loop, on
// top of a raftnode.Node.
package server

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"

	"github.com/fence-dev/fence/api/fence/v1/fencev1connect"
	"github.com/fence-dev/fence/internal/fsm"
	"github.com/fence-dev/fence/internal/raftnode"
)

// maxRequestBytes bounds an API request body. The largest valid requests, a
// full RenewBatch or ReportRejections with the longest scopes in JSON, are
// under 400 KiB; every other one is under 1 KiB.
const maxRequestBytes = 512 << 10

// Server is a running fenced. Its methods are safe for concurrent use.
type Server struct {
	cfg       Config
	log       *slog.Logger
	node      *raftnode.Node
	deadlines *deadlines
	waiters   waiters
	ready     atomic.Bool // leader with a complete state: serving
	metrics   *metrics    // metrics.go
	events    *eventRing  // ring.go: recent lease events, for watchers
	rejected  *rejectionLog

	http   *http.Server
	ln     net.Listener
	proxy  *httputil.ReverseProxy // to the leader
	peers  *http.Client           // for joining and asking peers
	failed chan error             // a background task's fatal error

	signer signer
	auth   *Auth // nil: no authentication
	owners owners

	closeOnce sync.Once // Close may be called more than once
	closeErr  error

	gmu       sync.Mutex
	leaderGen chan struct{} // closed when the leader changes
	opened    chan struct{} // closed once Start has set node

	mu         sync.Mutex // guards stopExpiry, and ready's changes with it
	stopExpiry context.CancelFunc
	stopJoin   context.CancelFunc
	bg         sync.WaitGroup

	// beforeReady, when set by a test, runs when a new leader has taken
	// office and is about to serve.
	beforeReady func()
}

// Start opens the data directory, starts Raft and serves the API on
// cfg.Listen. It returns once the listener is bound; the server becomes
// ready to grant once it is leader and has applied its whole log.
func Start(cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	s := &Server{cfg: cfg, log: cfg.Logger, deadlines: newDeadlines(), waiters: waiters{m: make(map[string][]chan fsm.Event)},
		failed: make(chan error, 1), leaderGen: make(chan struct{})}
	if cfg.AuthFile != "" {
		a, err := LoadAuth(cfg.AuthFile)
		if err != nil {
			return nil, err
		}
		s.auth = a
	}
	peerTransport, err := cfg.TLS.peerTransport()
	if err != nil {
		return nil, err
	}
	s.peers = &http.Client{Transport: peerTransport}
	s.proxy = s.newProxy(peerTransport)
	s.metrics = newMetrics(s)
	s.opened = make(chan struct{})
	s.events = newEventRing(ringSize)
	s.rejected = newRejectionLog()
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("listen: %w", err)
	}
	s.ln = ln
	var raftTLS *tls.Config
	if cfg.RaftListen != "" {
		if raftTLS, err = cfg.TLS.raftConfig(); err != nil {
			ln.Close()
			return nil, err
		}
	}
	node, err := raftnode.Open(raftnode.Config{
		TLS:               raftTLS,
		NodeID:            cfg.NodeID,
		DataDir:           cfg.DataDir,
		LogStore:          cfg.RaftLog,
		RaftListen:        cfg.RaftListen,
		RaftAdvertise:     cfg.RaftAdvertise,
		Bootstrap:         cfg.Bootstrap,
		HeartbeatTimeout:  cfg.ElectionTimeout,
		ElectionTimeout:   cfg.ElectionTimeout,
		SnapshotThreshold: cfg.SnapshotThreshold,
		SegmentSize:       cfg.RaftSegmentSize,
		SnapshotInterval:  cfg.SnapshotInterval,
		Logger:            cfg.Logger,
		OnEvents:          s.onEvents,
		OnRestore:         func() { s.log.Info("state restored from snapshot") },
		OnLeader:          s.onLeader,
		OnLeaderChange:    s.leaderChanged,
	})
	if err != nil {
		ln.Close()
		return nil, err
	}
	s.node = node
	close(s.opened)

	mux := http.NewServeMux()
	opts := []connect.HandlerOption{
		connect.WithReadMaxBytes(maxRequestBytes),
		// Compressing a 200-byte answer costs more than sending it.
		connect.WithCompressMinBytes(4 << 10),
		connect.WithInterceptors(s.metrics.interceptor()),
	}
	if s.auth != nil {
		opts = append(opts, connect.WithInterceptors(authorizer{s.auth}))
	}
	mux.Handle(fencev1connect.NewLeaseServiceHandler(s, opts...))
	mux.Handle(fencev1connect.NewClusterServiceHandler(cluster{s}, opts...))
	s.routes(mux)
	s.http = &http.Server{
		Handler:           cutSlowReaders(cmp.Or(cfg.WriteTimeout, 30*time.Second), s.authenticate(s.forward(mux))),
		ReadHeaderTimeout: 10 * time.Second,
		MaxHeaderBytes:    64 << 10,
		Protocols:         new(http.Protocols),
		IdleTimeout:       5 * time.Minute,
		// Besides cutSlowReaders' per-answer deadline: close a connection
		// nothing can be written to, and ping idle ones.
		HTTP2: &http.HTTP2Config{
			WriteByteTimeout: cmp.Or(cfg.WriteTimeout, 30*time.Second),
			SendPingTimeout:  30 * time.Second,
			PingTimeout:      10 * time.Second,
		},
	}
	s.http.Protocols.SetHTTP1(true)
	if cfg.TLS.enabled() {
		s.http.Protocols.SetHTTP2(true)
		tc, err := cfg.TLS.serverConfig()
		if err != nil {
			ln.Close()
			node.Close()
			return nil, err
		}
		ln = tls.NewListener(ln, tc)
	} else {
		s.http.Protocols.SetUnencryptedHTTP2(true)
	}
	s.bg.Add(1)
	go func() {
		defer s.bg.Done()
		if err := s.http.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("serve", "err", err)
		}
	}()
	if len(cfg.Join) > 0 {
		ctx, cancel := context.WithCancel(context.Background())
		s.stopJoin = cancel
		s.bg.Add(1)
		go func() {
			defer s.bg.Done()
			s.join(ctx)
		}()
	}
	s.log.Info("fenced started", "listen", ln.Addr().String(), "raft", node.RaftAddr(), "data_dir", cfg.DataDir, "raft_log", node.LogStore(), "node_id", cfg.NodeID)
	return s, nil
}

// Addr returns the address the API listens on.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Ready reports whether the server is leader and serving.
func (s *Server) Ready() bool { return s.ready.Load() }

// Close stops serving, waits up to the context's deadline for requests in
// flight, and closes Raft and the stores. Later calls return the first
// call's result.
func (s *Server) Close(ctx context.Context) error {
	s.closeOnce.Do(func() { s.closeErr = s.close(ctx) })
	return s.closeErr
}

func (s *Server) close(ctx context.Context) error {
	s.leaveOffice()
	s.events.close() // ends watches, which Shutdown would wait for
	err := s.http.Shutdown(ctx)
	if err != nil {
		s.http.Close()
	}
	if s.stopJoin != nil {
		s.stopJoin()
	}
	err = errors.Join(err, s.node.Close())
	s.bg.Wait()
	return err
}

// Run starts a server and serves until ctx is done, then shuts down
// cleanly.
func Run(ctx context.Context, cfg Config) error {
	s, err := Start(cfg)
	if err != nil {
		return err
	}
	var failed error
	select {
	case <-ctx.Done():
	case failed = <-s.failed:
	}
	s.log.Info("fenced stopping")
	shut, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return errors.Join(failed, s.Close(shut))
}

// onLeader runs on leadership changes. A new leader first applies its whole
// log (Barrier), then gives every held lease a full TTL, then drops the
// waiters of the previous term, and only then serves and expires.
func (s *Server) onLeader(leader bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.leaveOfficeLocked()
	if !leader {
		s.log.Info("lost leadership")
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.stopExpiry = cancel
	s.bg.Add(1)
	go func() {
		defer s.bg.Done()
		select { // Raft may elect this node before Start has stored s.node
		case <-s.opened:
		case <-ctx.Done():
			return
		}
		for backoff := 100 * time.Millisecond; ; backoff = min(2*backoff, 5*time.Second) {
			err := s.takeOffice(ctx)
			if err == nil {
				break
			}
			if ctx.Err() != nil {
				return
			}
			s.log.Error("taking office as leader; will retry", "err", err, "retry_in", backoff)
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
		}
		s.expireLoop(ctx)
	}()
}

// leaveOffice stops serving as leader and ends the office's expiry loop.
func (s *Server) leaveOffice() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.leaveOfficeLocked()
}

// leaveOfficeLocked clears ready and cancels the office together, under
// s.mu, where takeOffice checks its context and sets ready.
func (s *Server) leaveOfficeLocked() {
	s.ready.Store(false)
	if s.stopExpiry != nil {
		s.stopExpiry()
		s.stopExpiry = nil
	}
}

func (s *Server) takeOffice(ctx context.Context) error {
	bctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := s.node.Barrier(bctx); err != nil {
		return fmt.Errorf("barrier: %w", err)
	}
	held := 0
	s.node.Read(func(st *fsm.State) {
		held = st.HeldCount()
		s.deadlines.reset(held, st.Leases(), time.Now())
	})
	if _, err := s.node.Apply(bctx, fsm.Command{Op: fsm.OpPromote, At: time.Now().UnixNano()}); err != nil {
		return fmt.Errorf("promote: %w", err)
	}
	if err := s.recordSelf(bctx); err != nil {
		return fmt.Errorf("record this node's API address: %w", err)
	}
	if err := s.ensureKey(bctx); err != nil {
		return fmt.Errorf("create the token-signing key: %w", err)
	}
	s.node.Read(func(st *fsm.State) { s.owners.reset(st.Leases()) })
	if s.beforeReady != nil {
		s.beforeReady()
	}
	// Leaving office cancels ctx under s.mu: checked under it too, a
	// deposed office cannot make the node ready after it was cleared.
	s.mu.Lock()
	defer s.mu.Unlock()
	if ctx.Err() != nil {
		return ctx.Err()
	}
	s.ready.Store(true)
	s.log.Info("leader ready", "held_leases", held)
	return nil
}

// expireLoop proposes the expiry of every lease whose deadline passes,
// until ctx is done: up to fsm.MaxExpireMany leases in one command and a
// few commands at a time, so that leases ending together cost few log
// entries (100,000 of them, about a hundred).
func (s *Server) expireLoop(ctx context.Context) {
	const inFlight = 4
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		due, next := s.deadlines.due(time.Now(), inFlight*fsm.MaxExpireMany)
		var wg sync.WaitGroup
		for batch := range slices.Chunk(due, fsm.MaxExpireMany) {
			wg.Go(func() { s.expire(ctx, batch) })
		}
		wg.Wait()
		if len(due) == inFlight*fsm.MaxExpireMany {
			continue
		}
		wait := time.Second
		if !next.IsZero() {
			wait = min(time.Until(next), wait)
		}
		timer.Reset(max(wait, 0))
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		case <-s.deadlines.wake:
		}
	}
}

func (s *Server) expire(ctx context.Context, due []deadline) {
	es := make([]fsm.Expiry, len(due))
	for i, d := range due {
		es[i] = fsm.Expiry{Scope: d.scope, Token: d.token}
	}
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err := s.node.Apply(actx, fsm.Command{Op: fsm.OpExpireMany, Expiries: es, At: time.Now().UnixNano()})
	if err != nil {
		if ctx.Err() == nil {
			s.log.Warn("expire failed; will retry", "leases", len(due), "first_scope", due[0].scope, "first_token", due[0].token, "err", err)
		}
		at := time.Now().Add(100 * time.Millisecond)
		for _, d := range due {
			s.deadlines.retry(d.scope, d.token, at)
		}
	}
}

// onEvents runs in log order for every applied command's transitions.
func (s *Server) onEvents(events []fsm.Event) {
	now := time.Now()
	serving := s.ready.Load()
	for _, e := range events {
		switch e.Kind {
		case fsm.EventGranted:
			s.deadlines.granted(e.Scope, e.Lease, now)
		case fsm.EventReleased, fsm.EventExpired:
			s.deadlines.ended(e.Scope, e.Lease.Token)
		}
		s.waiters.notify(e)
		s.owners.event(e)
		// While the log is replayed at start-up, the transitions are old
		// news: log only what happens while serving.
		if serving {
			s.logEvent(e)
			if le, ok := fromFSM(e, now); ok {
				s.publish(le)
			}
		}
	}
}

func (s *Server) logEvent(e fsm.Event) {
	level := slog.LevelInfo
	if e.Kind == fsm.EventCancelled {
		level = slog.LevelDebug
	}
	s.log.LogAttrs(context.Background(), level, "lease "+e.Kind.String(),
		slog.String("scope", e.Scope),
		slog.Uint64("token", e.Lease.Token),
		slog.String("lease_id", e.Lease.ID.String()),
		slog.String("holder", e.Lease.Holder),
		slog.Duration("ttl", e.Lease.TTL),
	)
}

// waiters connects queued acquires to the grant that ends their wait.
type waiters struct {
	mu sync.Mutex
	m  map[string][]chan fsm.Event
}

// waitKey identifies a queued acquire: by request ID when it has one, so a
// retry finds the grant of its first attempt, else by lease ID.
func waitKey(scope string, l fsm.Lease) string {
	if l.RequestID != "" {
		return "r\x00" + scope + "\x00" + l.RequestID
	}
	return "i\x00" + l.ID.String()
}

func (w *waiters) add(key string) chan fsm.Event {
	ch := make(chan fsm.Event, 1)
	w.mu.Lock()
	w.m[key] = append(w.m[key], ch)
	w.mu.Unlock()
	return ch
}

func (w *waiters) remove(key string, ch chan fsm.Event) {
	w.mu.Lock()
	defer w.mu.Unlock()
	list := w.m[key]
	for i, c := range list {
		if c == ch {
			list = append(list[:i], list[i+1:]...)
			break
		}
	}
	if len(list) == 0 {
		delete(w.m, key)
	} else {
		w.m[key] = list
	}
}

func (w *waiters) notify(e fsm.Event) {
	if e.Kind != fsm.EventGranted && e.Kind != fsm.EventCancelled {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, ch := range w.m[waitKey(e.Scope, e.Lease)] {
		select {
		case ch <- e:
		default:
		}
	}
}
