package client

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/api/fence/v1/fencev1connect"
)

// How calls reach a node.
//
// A call goes over a connection of its own (HTTP/1.1, kept alive between
// calls) while fewer than maxOwnConns of the client's calls to the node are
// under way that way; the calls beyond those, and every watch, share one
// HTTP/2 connection a node. fenced closes a connection beyond its limits
// (--max-conns, and --max-conns-per-addr, which many clients behind one
// address can reach) as it accepts it: a call whose own connection breaks
// before it is answered goes again over the shared connection at once, the
// client closes its idle connections of their own, and its calls to the
// node share the HTTP/2 connection for refusalMemory. fenced reads, handles
// and answers an HTTP/1.1 request on the connection's goroutine, where over
// HTTP/2 the request and its answer each pass between several goroutines on
// either side: a lone caller's lock cycle took about a third longer over
// HTTP/2 (eda15be:BENCHMARKS.md, "Calls over connections of their own").
//
// HTTP/2's pings notice a node that stopped answering (paused, cut off);
// HTTP/1.1 has nothing like them. So a call under way for probeEvery has
// its node probed (GET /healthz over the shared connection, which takes no
// connection of its own; any live fenced answers it at once, leader or
// not), and probed again every probeEvery while it lasts: a node that does
// not answer within probeTimeout has the call cancelled, and the call fails
// over as one on a broken connection does. Concurrent calls to one node
// share a probe.
const (
	maxOwnConns   = 64
	refusalMemory = time.Minute
	probeEvery    = 2 * time.Second
	probeTimeout  = 2 * time.Second
)

// service is one node's API through one HTTP client.
type service struct {
	lease   fencev1connect.LeaseServiceClient
	cluster fencev1connect.ClusterServiceClient
}

// transports returns the HTTP clients of New's default: own for calls on
// connections of their own, shared for the calls over HTTP/2.
func transports(tlsConf *tls.Config) (own, shared *http.Client) {
	base := http.DefaultTransport.(*http.Transport)
	t1, t2 := base.Clone(), base.Clone()
	t1.Protocols, t2.Protocols = new(http.Protocols), new(http.Protocols)
	t1.Protocols.SetHTTP1(true)
	t1.MaxIdleConnsPerHost = maxOwnConns
	if tlsConf != nil {
		t1.TLSClientConfig, t2.TLSClientConfig = tlsConf.Clone(), tlsConf.Clone()
		t2.Protocols.SetHTTP2(true)
	} else {
		t2.Protocols.SetUnencryptedHTTP2(true)
	}
	// Pings notice a node that stopped answering (paused, cut off) within
	// seconds, so a watch reconnects and a call fails over instead of
	// hanging.
	t2.HTTP2 = &http.HTTP2Config{SendPingTimeout: 2 * time.Second, PingTimeout: 2 * time.Second}
	return &http.Client{Transport: oneWrite{t1}}, &http.Client{Transport: t2}
}

// maxOneWrite bounds the request bodies oneWrite copies.
const maxOneWrite = 64 << 10

// oneWrite sends a call's request, headers and body, in one write to its
// connection of its own. net/http's Transport flushes the headers on their
// own before a body it does not know to be in memory, and connect's body
// of a unary call is a type of its own: each call cost a second system
// call here and a second wake-up on the node, whose handler found the
// headers without the body and waited for it. A body of a known length up
// to maxOneWrite is copied into a bytes.Reader, a type the Transport knows
// and sends with the headers.
type oneWrite struct{ *http.Transport }

func (t oneWrite) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Body == nil || req.Body == http.NoBody || req.ContentLength <= 0 || req.ContentLength > maxOneWrite {
		return t.Transport.RoundTrip(req)
	}
	b := make([]byte, req.ContentLength)
	_, err := io.ReadFull(req.Body, b)
	req.Body.Close()
	if err != nil {
		return nil, fmt.Errorf("read the request's body: %w", err)
	}
	// A shallow copy, as the Transport makes of a request it changes:
	// RoundTrip must not change the caller's.
	r := *req
	r.Body = io.NopCloser(bytes.NewReader(b))
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil }
	return t.Transport.RoundTrip(&r)
}

// ownConns counts the calls under way on one node's connections of their
// own.
type ownConns struct {
	n         atomic.Int32
	refusedAt atomic.Int64 // Unix nanoseconds of the last refusal; 0 if none
}

// take reports whether a call may go over a connection of its own: give
// must then be called when it has returned. None may for refusalMemory
// after a refusal.
func (o *ownConns) take() bool {
	if at := o.refusedAt.Load(); at != 0 && time.Since(time.Unix(0, at)) < refusalMemory {
		return false
	}
	if o.n.Add(1) <= maxOwnConns {
		return true
	}
	o.n.Add(-1)
	return false
}

func (o *ownConns) give() { o.n.Add(-1) }

// refused records that the node refused, or broke, a connection of a
// call's own.
func (o *ownConns) refused() { o.refusedAt.Store(time.Now().UnixNano()) }

// liveness probes one node for the calls under way on it.
type liveness struct {
	url  string       // any answer from it means the node lives
	http *http.Client // with probeTimeout

	mu   sync.Mutex
	at   time.Time     // when the last probe ended
	err  error         // and its outcome
	busy chan struct{} // closed when the probe under way ends; nil if none
}

func newLiveness(base string, h *http.Client) *liveness {
	return &liveness{url: base + "/healthz", http: &http.Client{Transport: h.Transport, Timeout: probeTimeout}}
}

// watch returns ctx, cancelled also when the node fails a probe made while
// the call lasts, and a func that ends the watch, to call when the call has
// returned.
func (lv *liveness) watch(ctx context.Context) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	t := time.AfterFunc(probeEvery, func() {
		for {
			if err := lv.check(ctx); err != nil {
				cancel(err)
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(probeEvery):
			}
		}
	})
	return ctx, func() {
		t.Stop()
		cancel(nil)
	}
}

// check returns the outcome of a probe that ended less than probeEvery ago,
// of the one under way, or of a new one; nil if ctx ends first.
func (lv *liveness) check(ctx context.Context) error {
	lv.mu.Lock()
	if lv.busy == nil && time.Since(lv.at) < probeEvery {
		err := lv.err
		lv.mu.Unlock()
		return err
	}
	busy := lv.busy
	if busy == nil {
		busy = make(chan struct{})
		lv.busy = busy
		lv.mu.Unlock()
		err := lv.probe()
		lv.mu.Lock()
		lv.at, lv.err, lv.busy = time.Now(), err, nil
		lv.mu.Unlock()
		close(busy)
		return err
	}
	lv.mu.Unlock()
	select {
	case <-busy:
	case <-ctx.Done():
		return nil
	}
	lv.mu.Lock()
	defer lv.mu.Unlock()
	return lv.err
}

// probe asks the node for /healthz. Any answer will do: even a 404 from a
// server older than the page came from a live process.
func (lv *liveness) probe() error {
	resp, err := lv.http.Get(lv.url)
	if err != nil {
		return fmt.Errorf("%w: the node did not answer a liveness probe within %v: %v", fence.ErrUnavailable, probeTimeout, err)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10)) // so the connection is kept
	resp.Body.Close()
	return nil
}
