// Package server is fenced: the lease service's RPC handlers, the stamping
// of commands with time and lease IDs, forwarding to the leader, and the
// wiring of the parts on top of a raftnode.Node: the lease lifecycle
// (internal/lessor), the recent events and reported rejections
// (internal/eventlog), authorization (internal/authz) and the status page
// (internal/status).
package server

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/fence-dev/fence"
	fencev1 "github.com/fence-dev/fence/api/fence/v1"
	"github.com/fence-dev/fence/api/fence/v1/fencev1connect"
	"github.com/fence-dev/fence/internal/authz"
	"github.com/fence-dev/fence/internal/eventlog"
	"github.com/fence-dev/fence/internal/fsm"
	"github.com/fence-dev/fence/internal/lessor"
	"github.com/fence-dev/fence/internal/raftnode"
	"github.com/fence-dev/fence/internal/status"
)

// Server is a running fenced. Its methods are safe for concurrent use.
type Server struct {
	cfg      Config
	log      *slog.Logger
	node     *raftnode.Node
	lessor   *lessor.Lessor
	disk     *diskSpace     // refuses grants before the data directory's disk is full
	metrics  *metrics       // metrics.go
	events   *eventlog.Ring // recent lease events, for watchers
	lines    *eventLines    // the lease events' log lines
	presign  *presigner     // signs a reacquired scope's next token ahead
	rejected *eventlog.Rejections
	status   *status.Page

	http   *http.Server
	ln     net.Listener
	proxy  *httputil.ReverseProxy // to the leader
	peers  *http.Client           // for joining and asking peers
	failed chan error             // a background task's fatal error

	signer signer
	auth   *authz.Auth // nil: no authentication
	// clusterCA is the CA of the nodes' certificates, for authenticate.
	clusterCA *x509.CertPool
	owners    authz.Owners

	closeOnce sync.Once // Close may be called more than once
	closeErr  error
	closing   chan struct{} // closed once the server has left office and begins to shut down

	gmu       sync.Mutex
	leaderGen chan struct{} // closed when the leader changes

	stopJoin context.CancelFunc
	bg       sync.WaitGroup
}

// Start opens the data directory, starts Raft and serves the API on
// cfg.Listen. It returns once the listener is bound; the server becomes
// ready to grant once it is leader and has applied its whole log.
func Start(cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	s := &Server{cfg: cfg, log: cfg.Logger, failed: make(chan error, 1), leaderGen: make(chan struct{}), closing: make(chan struct{})}
	if cfg.AuthFile != "" {
		a, err := authz.Load(cfg.AuthFile)
		if err != nil {
			return nil, err
		}
		s.auth = a
		if s.clusterCA, err = cfg.TLS.clusterCA(); err != nil {
			return nil, err
		}
		if !cfg.TLS.enabled() {
			s.log.Warn("--auth-file without TLS: bearer tokens travel in clear text, and anyone who sees one can act as its identity; give --tls-cert and --tls-key")
		}
		if len(a.Nodes) > 0 && cfg.TLS.singleCA() {
			s.log.Warn("one CA signs clients' and nodes' certificates: any certificate it issues naming a node is that node; give the nodes their own CA with --tls-ca",
				"nodes", a.Nodes)
		}
	}
	peerTransport, err := cfg.TLS.peerTransport()
	if err != nil {
		return nil, err
	}
	s.peers = &http.Client{Transport: peerTransport}
	s.proxy = s.newProxy(peerTransport)
	s.metrics = newMetrics(s)
	s.lessor = lessor.New(lessor.Config{Logger: cfg.Logger, TakeOffice: s.takeOffice, Queued: s.metrics.queued, TokenFloor: cfg.TokenFloor, NoClockFloor: cfg.NoClockFloor,
		Admit: func(c fsm.Command) (func(), error) {
			if err := s.disk.err(); err != nil {
				return nil, err
			}
			return s.owners.Admit(c, cfg.MaxLeasesPerIdentity, cfg.MaxWaitersPerIdentity)
		}})
	s.events = eventlog.NewRing(eventlog.RingSize)
	s.rejected = eventlog.NewRejections()
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("listen: %w", err)
	}
	s.ln = ln
	total, perAddr := cfg.connLimits()
	limited := limitConns(ln, total, perAddr, s.log, func(limit string) { s.metrics.connsRefused.WithLabelValues(limit).Inc() })
	s.metrics.conns(limited)
	ln = limited
	var raftTLS *tls.Config
	if cfg.RaftListen != "" {
		if raftTLS, err = cfg.TLS.raftConfig(); err != nil {
			ln.Close()
			return nil, err
		}
	}
	s.lines = newEventLines(s.log)
	s.presign = newPresigner(s)
	node, err := raftnode.Open(raftnode.Config{
		TLS:               raftTLS,
		NodeID:            cfg.NodeID,
		DataDir:           cfg.DataDir,
		LogStore:          cfg.RaftLog,
		RaftListen:        cfg.RaftListen,
		RaftAdvertise:     cfg.RaftAdvertise,
		Bootstrap:         cfg.Bootstrap,
		Restore:           cfg.Restore,
		ElectionTimeout:   cfg.ElectionTimeout,
		SnapshotThreshold: cfg.SnapshotThreshold,
		SegmentSize:       cfg.RaftSegmentSize,
		SnapshotInterval:  cfg.SnapshotInterval,
		Logger:            cfg.Logger,
		OnEvents:          s.onEvents,
		OnRestore:         s.restored,
		OnLeader:          s.lessor.Lead,
		OnLeaderChange:    s.leaderChanged,
	})
	if err != nil {
		ln.Close()
		s.lines.Close()
		s.presign.Close()
		return nil, err
	}
	s.node = node
	s.disk = &diskSpace{free: node.FreeSpace, dir: cfg.DataDir, log: s.log,
		min: cmp.Or(cfg.MinFreeSpace, 2*uint64(node.SegmentSize()), 64<<20)}
	s.lessor.Open(node)
	s.status = status.New(status.Config{
		NodeID: cfg.NodeID, Logger: cfg.Logger, Node: node, Lessor: s.lessor,
		Events: s.events, Rejected: s.rejected, Readiness: s.readiness,
		Cluster: func(ctx context.Context) (*fencev1.StatusResponse, error) {
			resp, err := cluster{s}.Status(ctx, connect.NewRequest(&fencev1.StatusRequest{}))
			if err != nil {
				return nil, err
			}
			return resp.Msg, nil
		},
		LeaderChange: s.leaderGeneration,
	})

	mux := http.NewServeMux()
	opts := []connect.HandlerOption{
		requestLimits(), // each RPC's largest valid request, inflated too: no gzip bombs
		// Compressing a 200-byte answer costs more than sending it.
		connect.WithCompressMinBytes(4 << 10),
		connect.WithInterceptors(s.metrics.interceptor()),
		jsonCodecs(), // errors that name the field
	}
	if s.auth != nil {
		opts = append(opts, connect.WithInterceptors(s.auth.Interceptor()))
	}
	mux.Handle(fencev1connect.NewLeaseServiceHandler(s, opts...))
	mux.Handle(fencev1connect.NewClusterServiceHandler(cluster{s}, opts...))
	s.routes(mux)
	s.http = &http.Server{
		Handler:           cutSlowReaders(cmp.Or(cfg.WriteTimeout, 30*time.Second), guardBodies(requestLimit, s.authenticate(s.forward(mux)))),
		ConnContext:       authz.ConnContext,
		ReadHeaderTimeout: 10 * time.Second,
		// The whole request, body included: over HTTP/1 of the connection,
		// over HTTP/2 of each stream (guardBodies then closes the
		// connection).
		ReadTimeout:    cmp.Or(cfg.ReadTimeout, defaultReadTimeout),
		MaxHeaderBytes: 64 << 10,
		Protocols:      new(http.Protocols),
		IdleTimeout:    5 * time.Minute,
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
			s.lessor.Stop()
			node.Close()
			s.lines.Close()
			s.presign.Close()
			s.lessor.Wait()
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
func (s *Server) Ready() bool { return s.lessor.Ready() }

// Close hands the leadership to another voter if this node leads (see
// raftnode.Node.HandOff), ends the calls that wait on it (its waiting
// acquires and watches, and the calls it forwards: their callers retry at
// the leader), stops serving, waits up to the context's deadline for
// requests in flight, and closes Raft and the stores. Later calls return
// the first call's result.
func (s *Server) Close(ctx context.Context) error {
	s.closeOnce.Do(func() { s.closeErr = s.close(ctx) })
	return s.closeErr
}

func (s *Server) close(ctx context.Context) error {
	// A leader hands off before it stops serving: its cluster then has a
	// leader again after an election started at once, not after the
	// followers' election timeout, and the calls that reach this node
	// meanwhile are forwarded to the new leader or retried there.
	switch handed, err := s.node.HandOff(ctx); {
	case err != nil:
		s.log.Warn("could not hand the leadership to another voter before stopping; the others elect one after their election timeout", "err", err)
	case handed:
		s.log.Info("handed the leadership to another voter before stopping")
	}
	s.lessor.Stop()  // answers every waiting acquire "leader changed"
	s.events.Close() // ends watches, which Shutdown would wait for
	close(s.closing) // ends forwarded calls, which Shutdown would wait for
	err := s.http.Shutdown(ctx)
	if err != nil {
		s.http.Close()
	}
	if s.stopJoin != nil {
		s.stopJoin()
	}
	err = errors.Join(err, s.node.Close())
	s.lines.Close() // after the node: no event comes after it closed
	s.presign.Close()
	s.lessor.Wait()
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

// takeOffice is the server's part of taking office, once the lessor has
// extended every lease: its address for followers to forward to, and the
// signing key. The count of leases by owner is kept on every node
// (onEvents, restored).
func (s *Server) takeOffice(ctx context.Context) error {
	if err := s.recordSelf(ctx); err != nil {
		return fmt.Errorf("record this node's API address: %w", err)
	}
	if err := s.ensureKey(ctx); err != nil {
		return fmt.Errorf("create the token-signing key: %w", err)
	}
	return nil
}

// restored runs when a snapshot replaced the state, on the goroutine that
// applies the log, in order with onEvents: the lessor's deadlines and the
// count of leases by owner forget the leases that ended meanwhile.
func (s *Server) restored(st *fsm.State) {
	s.lessor.Restored(st, time.Now())
	s.owners.Reset(st.Leases())
	s.log.Info("state restored from snapshot", "held_leases", st.HeldCount())
}

// onEvents runs in log order for every applied command's transitions.
func (s *Server) onEvents(events []fsm.Event) {
	now := time.Now()
	serving := s.lessor.Ready()
	s.lessor.Applied(events, now)
	for _, e := range events {
		s.owners.Event(e)
		// While the log is replayed at start-up, the transitions are old
		// news: log only what happens while serving.
		if serving {
			s.lines.add(now, e)
			if e.Kind == fsm.EventGranted && s.cfg.SignTokens {
				s.presign.granted(fence.Token{Scope: e.Scope, Value: e.Lease.Token})
			}
			if le, ok := eventlog.FromFSM(e, now); ok {
				s.publish(le)
			}
		}
	}
}

// authenticate puts the caller's identity in each request's context, when
// auth is on.
func (s *Server) authenticate(next http.Handler) http.Handler {
	if s.auth == nil {
		return next
	}
	return s.auth.Authenticate(next, publicPath, s.clusterCA)
}

// publicPath is what anyone may fetch even with auth on: health checks and
// the public keys.
func publicPath(p string) bool { return p == "/healthz" || p == "/readyz" || p == keysPath }
