package client

import (
	"context"
	crand "crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fence-dev/fence"
	fencev1 "github.com/fence-dev/fence/api/fence/v1"
	"github.com/fence-dev/fence/api/fence/v1/fencev1connect"
	"github.com/fence-dev/fence/internal/wire"
)

// DefaultAddr is where fenced listens unless told otherwise.
const DefaultAddr = "127.0.0.1:7480"

// Client talks to a fenced service of one node or a cluster. It is safe
// for concurrent use.
type Client struct {
	nodes []node
	cur   atomic.Int32 // index into nodes of the address calls go to
	// own carries the calls on connections of their own, shared the
	// others and the watches (see transport.go); WithHTTPClient makes
	// them one client.
	own, shared *http.Client
	cfg         config

	// The concurrent Acquire (without wait), Renew and Release calls,
	// coalesced into batch calls (see coalescer); the leases' keep-alives
	// renew through renewals too.
	acquires *coalescer[*fencev1.AcquireRequest, granted]
	renewals *coalescer[*fencev1.RenewRequest, fence.Lease]
	releases *coalescer[*fencev1.ReleaseRequest, uint64]

	mu     sync.Mutex
	leases map[*Lease]struct{} // kept alive now; Close ends them
	closed bool

	// life ends when Close begins, and with it every watch.
	life    context.Context
	endLife context.CancelFunc
}

// node is one address the client may call, with its service clients (see
// transport.go).
type node struct {
	own, shared service
	conns       ownConns // the calls under way on connections of their own
	live        *liveness
}

// New returns a client of the service at addr: one address ("host:port" or
// an http:// or https:// URL) or a comma-separated list of them, one per
// node of a cluster, such as "10.0.0.1:7480,10.0.0.2:7480,10.0.0.3:7480".
// Calls go to the first address until it fails, then to the next (see the
// package documentation, Several addresses). New does not connect until
// the first call.
func New(addr string, opts ...Option) (*Client, error) {
	cfg := config{retryTimeout: 10 * time.Second, acquire: acquireConfig{ttl: 10 * time.Second}}
	for _, o := range opts {
		o.applyClient(&cfg)
	}
	if cfg.acquire.holder == "" {
		cfg.acquire.holder = defaultHolder()
	}
	bases, err := baseURLs(addr)
	if err != nil {
		return nil, err
	}
	if cfg.tls != nil {
		for i, b := range bases {
			bases[i] = strings.Replace(b, "http://", "https://", 1)
		}
	}
	own, shared := cfg.httpClient, cfg.httpClient
	if shared == nil {
		own, shared = transports(cfg.tls)
	}
	c := &Client{own: own, shared: shared, cfg: cfg}
	c.life, c.endLife = context.WithCancel(context.Background())
	c.acquires = &coalescer[*fencev1.AcquireRequest, granted]{one: c.grantOne, many: c.grantMany, max: maxCoalesced}
	c.renewals = &coalescer[*fencev1.RenewRequest, fence.Lease]{one: c.renewOne, many: c.renewMany, max: MaxRenewBatch}
	c.releases = &coalescer[*fencev1.ReleaseRequest, uint64]{one: c.releaseOne, many: c.releaseMany, max: maxCoalesced}
	// Answers come uncompressed: a lease service runs near its clients,
	// where gzip costs more CPU than it saves (a third of a renewal batch's
	// CPU went to it), and the signatures in tokens do not compress.
	copts := []connect.ClientOption{connect.WithAcceptCompression("gzip", nil, nil)}
	if cfg.bearer != "" {
		copts = append(copts, connect.WithInterceptors(bearer("Bearer "+cfg.bearer)))
	}
	svc := func(h *http.Client, base string) service {
		return service{
			lease:   fencev1connect.NewLeaseServiceClient(h, base, copts...),
			cluster: fencev1connect.NewClusterServiceClient(h, base, copts...),
		}
	}
	for _, base := range bases {
		c.nodes = append(c.nodes, node{own: svc(own, base), shared: svc(shared, base), live: newLiveness(base, shared)})
	}
	return c, nil
}

// bearer adds an Authorization header to every call.
type bearer string

func (b bearer) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		req.Header().Set("Authorization", string(b))
		return next(ctx, req)
	}
}

func (b bearer) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		conn := next(ctx, spec)
		conn.RequestHeader().Set("Authorization", string(b))
		return conn
	}
}

func (b bearer) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

// baseURLs parses New's address list. Duplicates are refused: a node
// listed twice would take two turns in the failover order, which is never
// what was meant.
func baseURLs(list string) ([]string, error) {
	if strings.TrimSpace(list) == "" {
		return nil, fmt.Errorf("client: empty address; want host:port such as %s", DefaultAddr)
	}
	parts := strings.Split(list, ",")
	var bases []string
	for i, addr := range parts {
		addr = strings.TrimSpace(addr)
		if addr == "" {
			return nil, fmt.Errorf("client: %q: address %d of %d is empty; want host:port[,host:port...]", list, i+1, len(parts))
		}
		base, err := baseURL(addr)
		if err != nil {
			return nil, err
		}
		if slices.Contains(bases, base) {
			return nil, fmt.Errorf("client: %q: %s is listed twice; want each node's host:port once", list, addr)
		}
		bases = append(bases, base)
	}
	return bases, nil
}

func baseURL(addr string) (string, error) {
	switch {
	case strings.HasPrefix(addr, "http://"), strings.HasPrefix(addr, "https://"):
		return strings.TrimSuffix(addr, "/"), nil
	case strings.Contains(addr, "://"):
		return "", fmt.Errorf("client: %q: unsupported scheme; want host:port or an http:// URL", addr)
	}
	return "http://" + addr, nil
}

func defaultHolder() string {
	host, _ := os.Hostname()
	h := fmt.Sprintf("%s-%d@%s", filepath.Base(os.Args[0]), os.Getpid(), host)
	if len(h) > fence.MaxHolderLen {
		h = h[:fence.MaxHolderLen]
	}
	return h
}

// closeTimeout bounds how long Close spends releasing leases: a service
// that does not answer within it lets them expire on their TTL instead.
const closeTimeout = 2 * time.Second

// Close ends every Lease the client keeps alive and releases them, then
// closes idle connections. The leases report themselves lost at once
// (Done closes, Err says the client was closed): once Close has started,
// nothing renews them, so their holders must stop acting on them. The
// releases are best effort, all at once and bounded by two seconds in all:
// a lease whose release fails holds its scope at the service until its
// TTL runs out, and the error, joining each failure, says which. Close
// does not release leases already lost, nor leases from Grant, which
// the client does not keep alive.
//
// Close also ends the client's watches (Watch, WatchHeld and the
// elections built on them), with fence.ErrClosed.
//
// After Close, Acquire and Watch fail with fence.ErrClosed; other calls
// still work. Calling Close again does nothing. Close is safe for
// concurrent use.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	c.endLife()
	leases := make([]*Lease, 0, len(c.leases))
	for l := range c.leases {
		leases = append(leases, l)
	}
	c.mu.Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
	defer cancel()
	errs := make([]error, len(leases))
	var wg sync.WaitGroup
	for i, l := range leases {
		wg.Go(func() {
			// Held until now: not lost, so nobody else can hold it yet
			// and releasing it frees the scope for the next holder.
			if !l.lose(&fence.LostError{Scope: l.info.Scope, Token: l.info.Token, Reason: "its client was closed"}) {
				return // lost or released meanwhile
			}
			// Its renewal, if one is out, goes first (see Lease.Release).
			if err := l.await(ctx, l.exited, nil); err != nil {
				errs[i] = fmt.Errorf("close: %w (it expires after its TTL of %v)", err, l.info.TTL)
				return
			}
			if _, err := c.Release(ctx, l.info.Scope, l.info.ID); err != nil {
				errs[i] = fmt.Errorf("close: %w (it expires after its TTL of %v)", err, l.info.TTL)
			}
		})
	}
	wg.Wait()
	c.own.CloseIdleConnections()
	c.shared.CloseIdleConnections()
	return errors.Join(errs...)
}

// keep records l as kept alive, so Close can end it; it refuses once the
// client is closed.
func (c *Client) keep(l *Lease) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return fence.ErrClosed
	}
	if c.leases == nil {
		c.leases = make(map[*Lease]struct{})
	}
	c.leases[l] = struct{}{}
	return nil
}

func (c *Client) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

func (c *Client) forget(l *Lease) {
	c.mu.Lock()
	delete(c.leases, l)
	c.mu.Unlock()
}

// Grant acquires a lease once, without keeping it alive: the caller must
// renew it within its TTL. Most programs want Acquire. A held scope gives a
// *fence.HeldError.
func (c *Client) Grant(ctx context.Context, scope string, opts ...AcquireOption) (fence.Lease, error) {
	l, _, _, err := c.grant(ctx, scope, withRequestID(c.acquireConfig(opts)))
	return l, err
}

func (c *Client) acquireConfig(opts []AcquireOption) acquireConfig {
	a := c.cfg.acquire
	for _, o := range opts {
		o.applyAcquire(&a)
	}
	return a
}

// withRequestID gives a a random request ID unless the caller chose one.
// 96 random bits are plenty: an ID is only ever compared with the few
// recent grants and waiters of one scope, by one holder. The service keeps
// it with each held lease: 16 characters rather than the 32 of 128 bits in
// hex are 16 MB fewer at a million leases.
func withRequestID(a acquireConfig) acquireConfig {
	if a.requestID == "" {
		var b [12]byte
		_, _ = crand.Read(b[:])
		a.requestID = base64.RawURLEncoding.EncodeToString(b[:])
	}
	return a
}

// grant acquires and also returns the send time of the attempt that
// succeeded, from which the lease's local validity counts, and whether
// earlier attempts were made: then the grant may be theirs, with a deadline
// that started before that send time.
//
// An acquire without wait shares a call with the client's concurrent ones;
// a waiting acquire goes alone, since its wait would hold back the others.
func (c *Client) grant(ctx context.Context, scope string, a acquireConfig) (fence.Lease, time.Time, bool, error) {
	req := &fencev1.AcquireRequest{Scope: scope, Holder: a.holder, Wait: a.wait, RequestId: a.requestID}
	if a.ttl != 0 {
		req.Ttl = durationpb.New(a.ttl)
	}
	var (
		g   granted
		err error
	)
	if a.wait {
		g, err = c.grantOne(ctx, req)
	} else {
		g, err = c.acquires.do(ctx, req)
	}
	if err != nil {
		return fence.Lease{}, time.Time{}, false, fmt.Errorf("acquire %q: %w", scope, err)
	}
	return g.lease, g.sent, g.retried, nil
}

// granted is an acquire's answer: the lease, the send time of the attempt
// that succeeded, and whether earlier attempts were made.
type granted struct {
	lease   fence.Lease
	sent    time.Time
	retried bool
}

func (c *Client) grantOne(ctx context.Context, req *fencev1.AcquireRequest) (granted, error) {
	var sent time.Time
	attempts := 0
	// Every attempt sends this one req, whichever node it goes to: the
	// request ID is what lets the leader answer a retry after a failover
	// with the grant the lost answer carried.
	resp, err := retry(ctx, c, func(actx context.Context, s *service) (*connect.Response[fencev1.AcquireResponse], error) {
		attempts++
		sent = time.Now()
		return s.lease.Acquire(actx, connect.NewRequest(req))
	})
	if err != nil {
		return granted{}, err
	}
	return granted{wire.LeaseFrom(resp.Msg.Lease), sent, attempts > 1}, nil
}

// grantMany acquires in one AcquireBatch call. Its retries resend the same
// requests, request IDs included, so a retried batch gets the grants the
// lost answer carried, as a retried Acquire does.
func (c *Client) grantMany(ctx context.Context, reqs []*fencev1.AcquireRequest) ([]granted, []error, error) {
	var sent time.Time
	attempts := 0
	breq := &fencev1.AcquireBatchRequest{Acquires: reqs}
	resp, err := retry(ctx, c, func(actx context.Context, s *service) (*connect.Response[fencev1.AcquireBatchResponse], error) {
		attempts++
		sent = time.Now()
		return s.lease.AcquireBatch(actx, connect.NewRequest(breq))
	})
	if err != nil {
		return nil, nil, err
	}
	if len(resp.Msg.Results) != len(reqs) {
		return nil, nil, fmt.Errorf("%w: %d acquires answered with %d results", fence.ErrUnavailable, len(reqs), len(resp.Msg.Results))
	}
	out, errs := make([]granted, len(reqs)), make([]error, len(reqs))
	for i, r := range resp.Msg.Results {
		if r.Failure != nil || r.Lease == nil {
			errs[i] = wire.FromFailure(r.GetFailure())
			continue
		}
		out[i] = granted{wire.LeaseFrom(r.Lease), sent, attempts > 1}
	}
	return out, errs, nil
}

// Renew extends a lease by its TTL once. The token does not change.
// Concurrent calls share one RenewBatch call (see the package
// documentation, Batching).
func (c *Client) Renew(ctx context.Context, scope string, id fence.LeaseID) (fence.Lease, error) {
	l, err := c.renewals.do(ctx, &fencev1.RenewRequest{Scope: scope, LeaseId: id.String()})
	if err != nil {
		return fence.Lease{}, fmt.Errorf("renew %q: %w", scope, err)
	}
	return l, nil
}

func (c *Client) renewOne(ctx context.Context, req *fencev1.RenewRequest) (fence.Lease, error) {
	resp, err := retry(ctx, c, func(actx context.Context, s *service) (*connect.Response[fencev1.RenewResponse], error) {
		return s.lease.Renew(actx, connect.NewRequest(req))
	})
	if err != nil {
		return fence.Lease{}, err
	}
	return wire.LeaseFrom(resp.Msg.Lease), nil
}

func (c *Client) renewMany(ctx context.Context, reqs []*fencev1.RenewRequest) ([]fence.Lease, []error, error) {
	breq := &fencev1.RenewBatchRequest{Renewals: reqs, Leases: true}
	resp, err := retry(ctx, c, func(actx context.Context, s *service) (*connect.Response[fencev1.RenewBatchResponse], error) {
		return s.lease.RenewBatch(actx, connect.NewRequest(breq))
	})
	if err != nil {
		return nil, nil, err
	}
	if len(resp.Msg.Results) != len(reqs) {
		return nil, nil, fmt.Errorf("%w: %d renewals answered with %d results", fence.ErrUnavailable, len(reqs), len(resp.Msg.Results))
	}
	out, errs := make([]fence.Lease, len(reqs)), make([]error, len(reqs))
	for i, r := range resp.Msg.Results {
		switch {
		case r.Failure != nil:
			errs[i] = wire.FromFailure(r.Failure)
		case r.Lease == nil:
			// A service older than the leases field renewed it and
			// answered its time left only: ask again, alone, for the
			// lease Renew returns.
			out[i], errs[i] = c.renewOne(ctx, reqs[i])
		default:
			out[i] = wire.LeaseFrom(r.Lease)
		}
	}
	return out, errs, nil
}

// Release frees a lease and returns its token. The scope's next grant gets
// a greater token. Concurrent calls share one ReleaseBatch call (see the
// package documentation, Batching).
func (c *Client) Release(ctx context.Context, scope string, id fence.LeaseID) (uint64, error) {
	token, err := c.releases.do(ctx, &fencev1.ReleaseRequest{Scope: scope, LeaseId: id.String()})
	if err != nil {
		return 0, fmt.Errorf("release %q: %w", scope, err)
	}
	return token, nil
}

func (c *Client) releaseOne(ctx context.Context, req *fencev1.ReleaseRequest) (uint64, error) {
	ambiguous := false
	resp, err := retry(ctx, c, func(actx context.Context, s *service) (*connect.Response[fencev1.ReleaseResponse], error) {
		r, err := s.lease.Release(actx, connect.NewRequest(req))
		if err != nil && errors.Is(transient(ctx, err), fence.ErrUnavailable) {
			ambiguous = true
		}
		return r, err
	})
	if err != nil {
		if ambiguous && errors.Is(err, fence.ErrLeaseLost) {
			// An earlier attempt may have released it: either way the
			// lease is no longer ours, which is what release asks.
			return 0, nil
		}
		return 0, err
	}
	return resp.Msg.Token, nil
}

func (c *Client) releaseMany(ctx context.Context, reqs []*fencev1.ReleaseRequest) ([]uint64, []error, error) {
	ambiguous := false
	breq := &fencev1.ReleaseBatchRequest{Releases: reqs}
	resp, err := retry(ctx, c, func(actx context.Context, s *service) (*connect.Response[fencev1.ReleaseBatchResponse], error) {
		r, err := s.lease.ReleaseBatch(actx, connect.NewRequest(breq))
		if err != nil && errors.Is(transient(ctx, err), fence.ErrUnavailable) {
			ambiguous = true
		}
		return r, err
	})
	if err != nil {
		return nil, nil, err
	}
	if len(resp.Msg.Results) != len(reqs) {
		return nil, nil, fmt.Errorf("%w: %d releases answered with %d results", fence.ErrUnavailable, len(reqs), len(resp.Msg.Results))
	}
	out, errs := make([]uint64, len(reqs)), make([]error, len(reqs))
	for i, r := range resp.Msg.Results {
		if r.Failure == nil {
			out[i] = r.Token
			continue
		}
		// As for one release: after an attempt whose outcome is unknown,
		// a lost lease may be the one that attempt released.
		if err := wire.FromFailure(r.Failure); !ambiguous || !errors.Is(err, fence.ErrLeaseLost) {
			errs[i] = err
		}
	}
	return out, errs, nil
}

// ScopeState is what Get reports about a scope.
type ScopeState struct {
	Scope     string
	Lease     *fence.Lease // the current lease without its ID; nil if free
	LastToken uint64       // at least every token issued for the scope, and below its next: the token floor for a scope not granted since the service took office
	Waiters   int          // acquires queued behind the current lease
}

// Get reports a scope's current lease, if any, and its last token.
func (c *Client) Get(ctx context.Context, scope string) (ScopeState, error) {
	resp, err := retry(ctx, c, func(actx context.Context, s *service) (*connect.Response[fencev1.GetResponse], error) {
		return s.lease.Get(actx, connect.NewRequest(&fencev1.GetRequest{Scope: scope}))
	})
	if err != nil {
		return ScopeState{}, fmt.Errorf("get %q: %w", scope, err)
	}
	st := ScopeState{Scope: resp.Msg.Scope, LastToken: resp.Msg.LastToken, Waiters: int(resp.Msg.Waiters)}
	if resp.Msg.Lease != nil {
		l := wire.LeaseFrom(resp.Msg.Lease)
		st.Lease = &l
	}
	return st, nil
}

// List returns every held scope starting with prefix, in scope order,
// without lease IDs.
func (c *Client) List(ctx context.Context, prefix string) ([]fence.Lease, error) {
	var out []fence.Lease
	page := ""
	for {
		resp, err := retry(ctx, c, func(actx context.Context, s *service) (*connect.Response[fencev1.ListResponse], error) {
			return s.lease.List(actx, connect.NewRequest(&fencev1.ListRequest{Prefix: prefix, PageToken: page}))
		})
		if err != nil {
			return nil, fmt.Errorf("list %q: %w", prefix, err)
		}
		for _, l := range resp.Msg.Leases {
			out = append(out, wire.LeaseFrom(l))
		}
		if page = resp.Msg.NextPageToken; page == "" {
			return out, nil
		}
	}
}

// retry calls f with the current node until it succeeds, fails for a
// reason other than the service being unavailable, ctx ends, or the
// client's retry budget runs out. After each failure that says the node is
// unavailable the client moves on to the next address, so the retry, and
// every later call, goes there. The pauses between attempts are a pacer's
// (from 20ms to 100ms, none after a refused connection), and one budget
// covers all the addresses tried. Errors come back as fence's errors. Each
// try is one attempt.
func retry[T any](ctx context.Context, c *Client, f func(context.Context, *service) (T, error)) (T, error) {
	give := time.Now().Add(c.cfg.retryTimeout)
	var p pacer
	for {
		i := c.cur.Load()
		v, refused, err := attempt(ctx, c, &c.nodes[i], f)
		if err == nil {
			return v, nil
		}
		if !errors.Is(err, fence.ErrUnavailable) || ctx.Err() != nil {
			return v, err
		}
		// Only the call that saw the failure moves on: concurrent calls
		// failing on the same node must not skip the next one.
		c.cur.CompareAndSwap(i, (i+1)%int32(len(c.nodes)))
		if !p.pause(ctx, give, refused, len(c.nodes)) {
			return v, err
		}
	}
}

// attempt calls f once on n: over a connection of its own if n takes one
// (unless WithHTTPClient gave one client for all calls),
// under a context that a failed liveness probe of n cancels (see
// transport.go). A call whose own connection broke before it was answered
// goes again, at once, over the shared one: fenced closes a connection
// beyond its limits as it accepts it, and a node that crashed fails the
// second try as it did the first. refused reports that the node refused
// the connection.
func attempt[T any](ctx context.Context, c *Client, n *node, f func(context.Context, *service) (T, error)) (_ T, refused bool, _ error) {
	s := &n.shared
	if c.own != c.shared && n.conns.take() {
		s = &n.own
		defer n.conns.give()
	}
	actx, unwatch := n.live.watch(ctx)
	defer unwatch()
	v, err := f(actx, s)
	if err != nil && broken(actx, err) {
		// The client's idle connections of their own count against the
		// node's limits: closing them makes room for the shared one.
		c.own.CloseIdleConnections()
		if s == &n.own {
			n.conns.refused()
			v, err = f(actx, &n.shared)
		}
	}
	switch {
	case err == nil:
		return v, false, nil
	case actx.Err() != nil && ctx.Err() == nil:
		return v, false, context.Cause(actx) // the node failed a liveness probe
	}
	return v, refusedConn(err), transient(ctx, err)
}

// broken reports whether err says the call's connection failed while ctx
// lives: an error the client made up, not one the service answered (such
// as a follower's "not the leader", also unavailable).
func broken(ctx context.Context, err error) bool {
	switch connect.CodeOf(err) {
	case connect.CodeCanceled, connect.CodeUnknown, connect.CodeUnavailable:
		return !connect.IsWireError(err) && ctx.Err() == nil
	}
	return false
}

// transient converts a call's error to fence's errors, and reports a broken
// connection as fence.ErrUnavailable: connect-go calls a reset stream
// "canceled" even when our context is still alive, and an answer cut off by
// a crash "unknown".
func transient(ctx context.Context, err error) error {
	code := connect.CodeOf(err)
	if (code == connect.CodeCanceled || code == connect.CodeUnknown) && ctx.Err() == nil {
		return fmt.Errorf("%w: %v", fence.ErrUnavailable, err)
	}
	return wire.FromConnect(err)
}
