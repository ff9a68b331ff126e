package client_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/fence-dev/fence"
	fencev1 "github.com/fence-dev/fence/api/fence/v1"
	"github.com/fence-dev/fence/client"
	"github.com/fence-dev/fence/fencetest"
)

// deadAddr returns a loopback address nothing listens on: connections to
// it are refused, as to a node that is down.
func deadAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// newClient returns a client of addrs, closed when the test ends.
func newClient(t testing.TB, addrs string, opts ...client.Option) *client.Client {
	t.Helper()
	c, err := client.New(addrs, append([]client.Option{client.WithHolder("tester")}, opts...)...)
	if err != nil {
		t.Fatalf("New(%q) = %v", addrs, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// exercise makes every lease call once through c and checks the answers
// against what the service holds.
func exercise(t *testing.T, c *client.Client, scope string) {
	t.Helper()
	ctx := testContext(t)
	g, err := c.Grant(ctx, scope, client.WithTTL(time.Minute))
	if err != nil {
		t.Fatalf("Grant: %v", err)
	}
	if _, err := c.Renew(ctx, scope, g.ID); err != nil {
		t.Fatalf("Renew: %v", err)
	}
	checkHeld(t, c, scope, "tester", g.Token)
	if all, err := c.List(ctx, scope); err != nil || len(all) != 1 || all[0].Token != g.Token {
		t.Fatalf("List(%q) = %v, %v; want the grant with token %d", scope, all, err, g.Token)
	}
	if tok, err := c.Release(ctx, scope, g.ID); err != nil || tok != g.Token {
		t.Fatalf("Release = %d, %v; want token %d", tok, err, g.Token)
	}
	l := acquire(t, c, scope)
	if l.Token().Value != g.Token+2 {
		t.Fatalf("Acquire after release: token %d, want %d, after the closing", l.Token().Value, g.Token+2)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatalf("Lease.Release: %v", err)
	}
}

// TestFailoverFromDeadAddress: with the first address down, every call
// moves on to the next one and succeeds there.
func TestFailoverFromDeadAddress(t *testing.T) {
	srv := fencetest.NewServer()
	t.Cleanup(srv.Close)
	c := newClient(t, deadAddr(t)+", "+srv.Addr)
	exercise(t, c, "orders")
}

// TestAllAddressesDown: a client whose first address works uses it; once
// no address answers, calls fail with fence.ErrUnavailable when the retry
// budget runs out.
func TestAllAddressesDown(t *testing.T) {
	srv := fencetest.NewServer()
	t.Cleanup(srv.Close)
	c := newClient(t, srv.Addr+","+deadAddr(t), client.WithRetryTimeout(300*time.Millisecond))
	exercise(t, c, "orders")
	g, err := c.Grant(testContext(t), "orders/kept", client.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}

	srv.Close()
	ctx := testContext(t)
	for name, call := range map[string]func() error{
		"Grant":   func() error { _, err := c.Grant(ctx, "orders"); return err },
		"Acquire": func() error { _, err := c.Acquire(ctx, "orders"); return err },
		"Renew":   func() error { _, err := c.Renew(ctx, "orders/kept", g.ID); return err },
		"Release": func() error { _, err := c.Release(ctx, "orders/kept", g.ID); return err },
		"Get":     func() error { _, err := c.Get(ctx, "orders"); return err },
		"List":    func() error { _, err := c.List(ctx, ""); return err },
	} {
		if err := call(); !errors.Is(err, fence.ErrUnavailable) {
			t.Errorf("%s with every address down = %v, want fence.ErrUnavailable", name, err)
		}
	}
}

// node is an HTTP server in front of the live service, standing for a
// cluster node that forwards to the leader. With lossy set it forwards
// each Acquire and then cuts the connection instead of answering: the
// grant is made, its answer lost.
type node struct {
	addr  string
	lossy bool
	hs    *http.Server
	fwd   *http.Transport

	mu   sync.Mutex
	lost []*fencev1.AcquireResponse // the answers it cut off, in order
}

type connKey struct{}

func startNode(t testing.TB, live string, lossy bool) *node {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	n := &node{addr: ln.Addr().String(), lossy: lossy, fwd: http.DefaultTransport.(*http.Transport).Clone()}
	target := &url.URL{Scheme: "http", Host: live}
	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			// Let the transport ask for and undo compression, so that a
			// recorded answer is plain protobuf.
			pr.Out.Header.Del("Accept-Encoding")
		},
		Transport: n.fwd,
	}
	n.hs = &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if !n.lossy || !strings.HasSuffix(r.URL.Path, "/Acquire") {
				proxy.ServeHTTP(w, r)
				return
			}
			rec := httptest.NewRecorder()
			proxy.ServeHTTP(rec, r)
			var resp fencev1.AcquireResponse
			if rec.Code == http.StatusOK && proto.Unmarshal(rec.Body.Bytes(), &resp) == nil {
				n.mu.Lock()
				n.lost = append(n.lost, &resp)
				n.mu.Unlock()
			}
			// Closing the connection itself, rather than hijacking it,
			// works for HTTP/2 as well as HTTP/1.1.
			r.Context().Value(connKey{}).(net.Conn).Close()
		}),
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			return context.WithValue(ctx, connKey{}, c)
		},
		Protocols: new(http.Protocols),
	}
	n.hs.Protocols.SetHTTP1(true)
	n.hs.Protocols.SetUnencryptedHTTP2(true)
	go func() { _ = n.hs.Serve(ln) }()
	t.Cleanup(n.close)
	return n
}

// close stops the node: its address refuses connections from then on.
func (n *node) close() {
	n.hs.Close()
	n.fwd.CloseIdleConnections()
}

func (n *node) lostAnswers() []*fencev1.AcquireResponse {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]*fencev1.AcquireResponse(nil), n.lost...)
}

// TestAcquireRetriedAcrossFailover: an acquire whose first attempt was
// granted by way of one node, but whose answer was lost with that node's
// connection, is retried at the next address with the same request ID and
// returns that same grant: one token for one Acquire. With the default
// transports the node gets a second try over the shared connection first
// (a connection of the call's own may have been refused), and loses that
// answer too.
func TestAcquireRetriedAcrossFailover(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []client.Option
		lost int // answers the lossy node loses before the client fails over
	}{
		{"default", nil, 2},
		{"HTTP/1.1", []client.Option{client.WithHTTPClient(&http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()})}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, direct := start(t)
			lossy := startNode(t, srv.Addr, true)
			c := newClient(t, lossy.addr+","+srv.Addr, tc.opts...)

			l := acquire(t, c, "orders", client.WithTTL(time.Minute))
			lost := lossyAnswers(t, lossy, tc.lost)
			first := lost[0].Lease
			for _, a := range lost[1:] {
				if a.Lease.Token != first.Token || a.Lease.LeaseId != first.LeaseId {
					t.Fatalf("the lossy node's answers differ: token %d lease %s, then token %d lease %s",
						first.Token, first.LeaseId, a.Lease.Token, a.Lease.LeaseId)
				}
			}
			if l.Token().Value != first.Token || l.ID().String() != first.LeaseId {
				t.Fatalf("Acquire = token %d lease %v; the lost first answer had token %d lease %s",
					l.Token().Value, l.ID(), first.Token, first.LeaseId)
			}
			// Only one token was ever issued for the scope.
			checkHeld(t, direct, "orders", "tester", first.Token)
			checkValidity(t, direct, l)
		})
	}
}

func lossyAnswers(t testing.TB, n *node, want int) []*fencev1.AcquireResponse {
	t.Helper()
	lost := n.lostAnswers()
	if len(lost) != want {
		t.Fatalf("%d acquire answers lost by the lossy node, want %d", len(lost), want)
	}
	return lost
}

// liveRenewals counts the renewals the service at host confirmed.
type liveRenewals struct {
	next http.RoundTripper
	host string
	n    atomic.Int64
}

func (lr *liveRenewals) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := lr.next.RoundTrip(r)
	if err == nil && resp.StatusCode == http.StatusOK && r.URL.Host == lr.host && (strings.HasSuffix(r.URL.Path, "/Renew") || strings.HasSuffix(r.URL.Path, "/RenewBatch")) {
		lr.n.Add(1)
	}
	return resp, err
}

func (lr *liveRenewals) CloseIdleConnections() {
	lr.next.(interface{ CloseIdleConnections() }).CloseIdleConnections()
}

// TestLeaseRenewsAfterFailover: a Lease acquired through one node keeps
// itself alive through the next address once that node goes down.
func TestLeaseRenewsAfterFailover(t *testing.T) {
	srv, direct := start(t)
	first := startNode(t, srv.Addr, false)
	lr := &liveRenewals{next: http.DefaultTransport.(*http.Transport).Clone(), host: srv.Addr}
	c := newClient(t, first.addr+","+srv.Addr, client.WithHTTPClient(&http.Client{Transport: lr}))

	l := acquire(t, c, "orders", client.WithTTL(300*time.Millisecond))
	first.close()
	eventually(t, "three renewals confirmed by the next address", func() bool { return lr.n.Load() >= 3 })
	if err := l.Err(); err != nil {
		t.Fatalf("lease lost across the failover: %v", err)
	}
	checkHeld(t, direct, "orders", "tester", l.Token().Value)
}

// TestClusterStatus: a one-node service reports itself as the only node
// and the leader, also through a client whose first address is down.
func TestClusterStatus(t *testing.T) {
	srv := fencetest.NewServer()
	t.Cleanup(srv.Close)
	c := newClient(t, deadAddr(t)+","+srv.Addr)
	ctx := testContext(t)

	st, err := c.ClusterStatus(ctx)
	if err != nil {
		t.Fatalf("ClusterStatus = %v", err)
	}
	if len(st.Nodes) != 1 {
		t.Fatalf("ClusterStatus lists %d nodes, want 1: %+v", len(st.Nodes), st)
	}
	n := st.Nodes[0]
	if n.State != "leader" || !n.Voter || n.ID == "" || n.APIAddr != srv.Addr || st.Leader != n.ID || st.NodeID != n.ID || st.Term == 0 {
		t.Errorf("ClusterStatus = %+v, want its one node, a voter at %s, as leader and answering, in a term above 0", st, srv.Addr)
	}

	// Changes the service refuses come back as *fence.InvalidError and
	// change nothing.
	for name, call := range map[string]func() error{
		"AddNode with a malformed ID":   func() error { _, err := c.AddNode(ctx, "no spaces", "127.0.0.1:1", "127.0.0.1:2"); return err },
		"RemoveNode of a non-member":    func() error { _, err := c.RemoveNode(ctx, "n9"); return err },
		"RemoveNode of the last member": func() error { _, err := c.RemoveNode(ctx, n.ID); return err },
	} {
		err := call()
		var inv *fence.InvalidError
		if !errors.As(err, &inv) || inv.Field != "node_id" {
			t.Errorf("%s = %v, want a *fence.InvalidError for node_id", name, err)
		}
	}
	if again, err := c.ClusterStatus(ctx); err != nil || len(again.Nodes) != 1 || again.Leader != n.ID {
		t.Errorf("ClusterStatus after refused changes = %+v, %v; want %+v", again, err, st)
	}
}
