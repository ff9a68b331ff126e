package client

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strings"
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

// Client talks to a fenced service. It is safe for concurrent use.
type Client struct {
	rpc  fencev1connect.LeaseServiceClient
	http *http.Client
	cfg  config
}

// New returns a client of the service at addr ("host:port" or an http://
// URL). It does not connect until the first call.
func New(addr string, opts ...Option) (*Client, error) {
	cfg := config{retryTimeout: 10 * time.Second, acquire: acquireConfig{ttl: 10 * time.Second}}
	for _, o := range opts {
		o.applyClient(&cfg)
	}
	if cfg.acquire.holder == "" {
		cfg.acquire.holder = defaultHolder()
	}
	base, err := baseURL(addr)
	if err != nil {
		return nil, err
	}
	h := cfg.httpClient
	if h == nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.Protocols = new(http.Protocols)
		t.Protocols.SetUnencryptedHTTP2(true)
		h = &http.Client{Transport: t}
	}
	return &Client{rpc: fencev1connect.NewLeaseServiceClient(h, base), http: h, cfg: cfg}, nil
}

func baseURL(addr string) (string, error) {
	addr = strings.TrimSpace(addr)
	switch {
	case addr == "":
		return "", fmt.Errorf("client: empty address; want host:port such as %s", DefaultAddr)
	case strings.Contains(addr, ","):
		return "", fmt.Errorf("client: %q: several addresses are not supported yet; give one host:port", addr)
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

// Close releases idle connections. Leases already acquired keep working
// until released.
func (c *Client) Close() error {
	c.http.CloseIdleConnections()
	return nil
}

// Grant acquires a lease once, without keeping it alive: the caller must
// renew it within its TTL. Most programs want Acquire. A held scope gives a
// *fence.HeldError.
func (c *Client) Grant(ctx context.Context, scope string, opts ...AcquireOption) (fence.Lease, error) {
	a := c.acquireConfig(opts)
	l, _, _, err := c.grant(ctx, scope, a)
	return l, err
}

func (c *Client) acquireConfig(opts []AcquireOption) acquireConfig {
	a := c.cfg.acquire
	for _, o := range opts {
		o.applyAcquire(&a)
	}
	if a.requestID == "" {
		var b [16]byte
		_, _ = crand.Read(b[:])
		a.requestID = hex.EncodeToString(b[:])
	}
	return a
}

// grant acquires and also returns the send time of the attempt that
// succeeded, from which the lease's local validity counts, and whether
// earlier attempts were made: then the grant may be theirs, with a deadline
// that started before that send time.
func (c *Client) grant(ctx context.Context, scope string, a acquireConfig) (fence.Lease, time.Time, bool, error) {
	req := &fencev1.AcquireRequest{Scope: scope, Holder: a.holder, Wait: a.wait, RequestId: a.requestID}
	if a.ttl != 0 {
		req.Ttl = durationpb.New(a.ttl)
	}
	var sent time.Time
	attempts := 0
	resp, err := retry(ctx, c.cfg.retryTimeout, func() (*connect.Response[fencev1.AcquireResponse], error) {
		attempts++
		sent = time.Now()
		return c.rpc.Acquire(ctx, connect.NewRequest(req))
	})
	if err != nil {
		return fence.Lease{}, time.Time{}, false, fmt.Errorf("acquire %q: %w", scope, err)
	}
	return wire.LeaseFrom(resp.Msg.Lease), sent, attempts > 1, nil
}

// Renew extends a lease by its TTL once. The token does not change.
func (c *Client) Renew(ctx context.Context, scope string, id fence.LeaseID) (fence.Lease, error) {
	resp, err := retry(ctx, c.cfg.retryTimeout, func() (*connect.Response[fencev1.RenewResponse], error) {
		return c.rpc.Renew(ctx, connect.NewRequest(&fencev1.RenewRequest{Scope: scope, LeaseId: id.String()}))
	})
	if err != nil {
		return fence.Lease{}, fmt.Errorf("renew %q: %w", scope, err)
	}
	return wire.LeaseFrom(resp.Msg.Lease), nil
}

// Release frees a lease and returns its token. The scope's next grant gets
// a greater token.
func (c *Client) Release(ctx context.Context, scope string, id fence.LeaseID) (uint64, error) {
	ambiguous := false
	resp, err := retry(ctx, c.cfg.retryTimeout, func() (*connect.Response[fencev1.ReleaseResponse], error) {
		r, err := c.rpc.Release(ctx, connect.NewRequest(&fencev1.ReleaseRequest{Scope: scope, LeaseId: id.String()}))
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
		return 0, fmt.Errorf("release %q: %w", scope, err)
	}
	return resp.Msg.Token, nil
}

// ScopeState is what Get reports about a scope.
type ScopeState struct {
	Scope     string
	Lease     *fence.Lease // the current lease without its ID; nil if free
	LastToken uint64       // the highest token ever issued; 0 if never granted
	Waiters   int          // acquires queued behind the current lease
}

// Get reports a scope's current lease, if any, and its last token.
func (c *Client) Get(ctx context.Context, scope string) (ScopeState, error) {
	resp, err := retry(ctx, c.cfg.retryTimeout, func() (*connect.Response[fencev1.GetResponse], error) {
		return c.rpc.Get(ctx, connect.NewRequest(&fencev1.GetRequest{Scope: scope}))
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
		resp, err := retry(ctx, c.cfg.retryTimeout, func() (*connect.Response[fencev1.ListResponse], error) {
			return c.rpc.List(ctx, connect.NewRequest(&fencev1.ListRequest{Prefix: prefix, PageToken: page}))
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

// retry calls f until it succeeds, fails for a reason other than the
// service being unavailable, ctx ends, or the budget runs out. Backoff is
// exponential with full jitter, from 20ms to 1s. Errors come back as
// fence's errors.
func retry[T any](ctx context.Context, budget time.Duration, f func() (T, error)) (T, error) {
	give := time.Now().Add(budget)
	backoff := 20 * time.Millisecond
	for {
		v, err := f()
		if err == nil {
			return v, nil
		}
		err = transient(ctx, err)
		if !errors.Is(err, fence.ErrUnavailable) || ctx.Err() != nil {
			return v, err
		}
		sleep := rand.N(backoff) + time.Millisecond
		if time.Now().Add(sleep).After(give) {
			return v, err
		}
		t := time.NewTimer(sleep)
		select {
		case <-ctx.Done():
			t.Stop()
			return v, err
		case <-t.C:
		}
		backoff = min(2*backoff, time.Second)
	}
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
