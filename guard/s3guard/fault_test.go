package s3guard_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/fence-dev/fence/guard"
	"github.com/fence-dev/fence/guard/s3guard"
)

// TestLostResponse: the server applies a swap of the mark, but its answer
// is lost (a proxy on loopback forwards the PUT, then closes the
// connection). The SDK retries, or reports a broken connection; either
// way the writer reads the mark again, finds its own commit there, and
// reports the write done, even under a strict sequence, where the mark
// now equals the write and would refuse it as a repeat. And when no swap
// reaches the server at all, the write fails and changes nothing (the SDK
// reports a lost answer as a response error of status 0, which is no
// answer at all).
func TestLostResponse(t *testing.T) {
	ctx := context.Background()
	_, bucket, prefix := testS3(t)
	endpoint, key, secret, _, err := s3URL()
	if err != nil {
		t.Fatal(err)
	}
	target, _ := url.Parse(endpoint)
	var drop, dropped atomic.Int64 // answers to drop, answers dropped
	var swallow atomic.Bool        // drop the mark's PUTs before they reach the server
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPut && strings.Contains(r.URL.Path, "/marks/") && swallow.Load() {
			dropped.Add(1)
			if conn, _, err := w.(http.Hijacker).Hijack(); err == nil {
				conn.Close() // never sent on, and no answer
			}
			return
		}
		out := r.Clone(r.Context())
		out.URL.Scheme, out.URL.Host, out.RequestURI = target.Scheme, target.Host, ""
		// out.Host stays the proxy's, which the request was signed for.
		resp, err := transport.RoundTrip(out)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		if r.Method == http.MethodPut && strings.Contains(r.URL.Path, "/marks/") && drop.Add(-1) >= 0 {
			io.Copy(io.Discard, resp.Body)
			dropped.Add(1)
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				conn.Close() // applied, and no answer
			}
			return
		}
		for k, v := range resp.Header {
			w.Header()[k] = v
		}
		w.WriteHeader(resp.StatusCode)
		io.Copy(w, resp.Body)
	}))
	defer proxy.Close()
	g := s3guard.New(newClient(proxy.URL, key, secret), bucket, quiet, s3guard.WithPrefix(prefix), s3guard.WithStrictSequence())
	for i, c := range []struct {
		body  string
		drops int64
	}{
		// The first swap creates the mark (If-None-Match: *), the others
		// replace it (If-Match). One answer lost: the SDK's retry gets
		// 412; every answer lost: the SDK gives up on the connection.
		{"created", 1}, {"overwritten", 1}, {"never answered", 100},
	} {
		seq, body := i, c.body
		drop.Store(c.drops)
		dropped.Store(0)
		wr := w("lost", 5, uint64(seq+1))
		if err := g.Put(ctx, wr, "a", []byte(body)); err != nil {
			t.Fatalf("seq %d: Put with its answer lost: %v", seq+1, err)
		}
		if got, err := g.Get(ctx, "lost", "a"); err != nil || string(got) != body {
			t.Fatalf("Get = %q, %v; want %q", got, err, body)
		}
		if m, err := g.Highest(ctx, "lost"); err != nil || m != (guard.Mark{Token: 5, Seq: uint64(seq + 1)}) {
			t.Fatalf("Highest = %+v, %v", m, err)
		}
		if n := dropped.Load(); n < 1 || n > c.drops {
			t.Fatalf("%q: the proxy dropped %d answers, want 1 to %d", body, n, c.drops)
		}
	}

	// No swap reaches the server: the write must fail, and change
	// nothing a reader sees.
	swallow.Store(true)
	dropped.Store(0)
	if err := g.Put(ctx, w("lost", 5, 9), "a", []byte("never landed")); err == nil {
		t.Fatal("Put whose swap never reached the server: nil error")
	}
	if dropped.Load() == 0 {
		t.Fatal("the proxy swallowed no request")
	}
	if got, err := g.Get(ctx, "lost", "a"); err != nil || string(got) != "never answered" {
		t.Fatalf("Get after the failed write = %q, %v; want the last landed write", got, err)
	}
}
