package httpguard_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/client"
	"github.com/fence-dev/fence/fencetest"
	"github.com/fence-dev/fence/guard"
	"github.com/fence-dev/fence/guard/httpguard"
)

// register is a tiny guarded resource: the last write per scope, and the
// log of applied tokens.
type register struct {
	mu    sync.Mutex
	value map[string]string
	log   map[string][]uint64
	calls atomic.Int64
}

// mustMiddleware is httpguard.Middleware for a test, which fails if
// Middleware does.
func mustMiddleware(t testing.TB, g *guard.Guard, scope string, opts ...httpguard.Option) func(http.Handler) http.Handler {
	t.Helper()
	m, err := httpguard.Middleware(g, scope, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func newServer(t *testing.T, opts ...httpguard.Option) (*httptest.Server, *register) {
	t.Helper()
	reg := &register{value: map[string]string{}, log: map[string][]uint64{}}
	g := guard.New(guard.NewMemoryStore(), guard.WithLogger(slog.New(slog.DiscardHandler)))
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reg.calls.Add(1)
		scope := strings.TrimPrefix(r.URL.Path, "/")
		tok, _ := fence.ParseToken(r.Header.Get(httpguard.TokenHeader))
		body, _ := io.ReadAll(r.Body)
		reg.mu.Lock()
		reg.value[scope] = string(body)
		reg.log[scope] = append(reg.log[scope], tok.Value)
		reg.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	})
	opts = append(opts, httpguard.WithScopeFunc(func(r *http.Request) string { return strings.TrimPrefix(r.URL.Path, "/") }))
	srv := httptest.NewServer(mustMiddleware(t, g, "", opts...)(h))
	t.Cleanup(srv.Close)
	return srv, reg
}

func put(t *testing.T, url string, header map[string]string, body string) (*http.Response, httpguard.Problem) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPut, url, strings.NewReader(body))
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var p httpguard.Problem
	if resp.StatusCode >= 400 {
		if ct := resp.Header.Get("Content-Type"); ct != "application/problem+json" {
			t.Fatalf("status %d with Content-Type %q, want application/problem+json", resp.StatusCode, ct)
		}
		if err := json.NewDecoder(resp.Body).Decode(&p); err != nil {
			t.Fatal(err)
		}
	}
	return resp, p
}

func tokenHeader(scope string, v uint64) map[string]string {
	return map[string]string{httpguard.TokenHeader: fence.Token{Scope: scope, Value: v}.String()}
}

func TestMiddlewareStaleAndBadTokens(t *testing.T) {
	srv, reg := newServer(t)
	if resp, _ := put(t, srv.URL+"/orders", tokenHeader("orders", 42), "B"); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("token 42: status %d", resp.StatusCode)
	}
	resp, p := put(t, srv.URL+"/orders", tokenHeader("orders", 41), "A")
	if resp.StatusCode != http.StatusConflict || p.Type != httpguard.ProblemType || p.Scope != "orders" || p.PresentedToken != 41 || p.HighestToken != 42 {
		t.Fatalf("token 41 after 42: status %d problem %+v", resp.StatusCode, p)
	}
	if reg.value["orders"] != "B" {
		t.Fatalf("stored %q, want B's write", reg.value["orders"])
	}
	for name, h := range map[string]map[string]string{
		"missing":       {},
		"malformed":     {httpguard.TokenHeader: "41"},
		"another scope": tokenHeader("billing", 99),
		"bad sequence":  {httpguard.TokenHeader: "fence:v1:orders:42", httpguard.SequenceHeader: "x"},
	} {
		before := reg.calls.Load()
		resp, p := put(t, srv.URL+"/orders", h, "X")
		if resp.StatusCode != http.StatusBadRequest || p.Detail == "" {
			t.Errorf("%s: status %d problem %+v, want 400 with a detail", name, resp.StatusCode, p)
		}
		if reg.calls.Load() != before {
			t.Errorf("%s: the handler ran", name)
		}
	}
}

// TestMiddlewareConcurrent sends random older and newer tokens for three
// scopes from 32 goroutines: each scope's applied log must be
// non-decreasing and end with the highest token presented (invariant 6).
func TestMiddlewareConcurrent(t *testing.T) {
	srv, reg := newServer(t)
	var mu sync.Mutex
	highest := map[string]uint64{}
	var wg sync.WaitGroup
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 30 {
				scope := fmt.Sprintf("s%d", rand.IntN(3))
				v := uint64(1 + rand.IntN(50))
				mu.Lock()
				highest[scope] = max(highest[scope], v)
				mu.Unlock()
				resp, _ := put(t, srv.URL+"/"+scope, tokenHeader(scope, v), fmt.Sprint(v))
				if resp.StatusCode != http.StatusNoContent && resp.StatusCode != http.StatusConflict {
					t.Errorf("status %d", resp.StatusCode)
					return
				}
			}
		}()
	}
	wg.Wait()
	for scope, log := range reg.log {
		for i := 1; i < len(log); i++ {
			if log[i] < log[i-1] {
				t.Fatalf("%s: applied token %d after %d", scope, log[i], log[i-1])
			}
		}
		if reg.value[scope] != fmt.Sprint(highest[scope]) {
			t.Fatalf("%s: stored %s, want the write of the highest token %d", scope, reg.value[scope], highest[scope])
		}
	}
}

// TestTransportMarksLeaseLost plays the source text's story with a real
// fenced: A acquires, pauses past its TTL, B acquires a greater token and
// writes; A's late write is refused, A's lease reports itself lost, and
// A's next write is not even sent.
func TestTransportMarksLeaseLost(t *testing.T) {
	fs := fencetest.NewServer()
	defer fs.Close()
	c := fs.Client()
	defer c.Close()
	srv, reg := newServer(t)
	ctx := context.Background()

	a, err := c.Acquire(ctx, "orders", client.WithTTL(5*time.Second), client.WithHolder("A"))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Release(ctx)
	// B takes over: release A's lease behind its back, as expiry would.
	if _, err := c.Release(ctx, "orders", a.ID()); err != nil {
		t.Fatal(err)
	}
	b, err := c.Acquire(ctx, "orders", client.WithHolder("B"))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release(ctx)
	if b.Token().Value <= a.Token().Value {
		t.Fatalf("B's token %d is not above A's %d", b.Token().Value, a.Token().Value)
	}
	send := func(l httpguard.Lease, body string) (*http.Response, error) {
		hc := &http.Client{Transport: httpguard.NewTransport(l, nil)}
		return hc.Post(srv.URL+"/orders", "text/plain", strings.NewReader(body))
	}
	resp, err := send(b, "B")
	if err != nil || resp.StatusCode != http.StatusNoContent {
		t.Fatalf("B's write: %v %v", resp, err)
	}
	resp.Body.Close()

	resp, err = send(a, "A")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusConflict {
		t.Fatalf("A's stale write: status %d, want 409", resp.StatusCode)
	}
	select {
	case <-a.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("A's lease did not report itself lost after a stale rejection")
	}
	if !errors.Is(a.Err(), fence.ErrLeaseLost) || !strings.Contains(a.Err().Error(), "superseded") {
		t.Fatalf("A's lease error %v, want lost because superseded", a.Err())
	}
	calls := reg.calls.Load()
	if _, err := send(a, "A again"); !errors.Is(err, fence.ErrLeaseLost) {
		t.Fatalf("A's next write: %v, want a lost-lease error without sending", err)
	}
	if reg.calls.Load() != calls {
		t.Fatal("a request was sent with a lost lease")
	}
	if reg.value["orders"] != "B" {
		t.Fatalf("stored %q, want B's write", reg.value["orders"])
	}
}

// TestReadsAreFencedByDefault: a handler may write on GET (the register
// here writes on every method), so by default a read is fenced like a
// write: refused without a token (400) or with a stale one (409), and the
// handler does not run. WithUnfencedReads lets GET, HEAD, OPTIONS and
// TRACE through unchecked, and still fences the other methods.
func TestReadsAreFencedByDefault(t *testing.T) {
	reads := []string{http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace}
	writes := []string{http.MethodPut, http.MethodPost, http.MethodDelete, http.MethodPatch}
	for _, tc := range []struct {
		name        string
		opts        []httpguard.Option
		readsFenced bool
	}{
		{"default", nil, true},
		{"WithUnfencedReads", []httpguard.Option{httpguard.WithUnfencedReads()}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, reg := newServer(t, tc.opts...)
			if resp, _ := put(t, srv.URL+"/orders", tokenHeader("orders", 5), "v5"); resp.StatusCode != http.StatusNoContent {
				t.Fatalf("the current write: %s", resp.Status)
			}
			send := func(method string, header map[string]string) (status int, ran bool) {
				t.Helper()
				before := reg.calls.Load()
				req, _ := http.NewRequest(method, srv.URL+"/orders", nil)
				for k, v := range header {
					req.Header.Set(k, v)
				}
				resp, err := srv.Client().Do(req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				return resp.StatusCode, reg.calls.Load() > before
			}
			for _, method := range append(reads, writes...) {
				fenced := tc.readsFenced || slices.Contains(writes, method)
				for _, c := range []struct {
					name   string
					header map[string]string
					status int
				}{
					{"no token", nil, http.StatusBadRequest},
					{"a stale token", tokenHeader("orders", 4), http.StatusConflict},
				} {
					status, ran := send(method, c.header)
					switch {
					case fenced && (ran || status != c.status):
						t.Errorf("%s with %s: %d, handler ran %v; want %d and no run", method, c.name, status, ran, c.status)
					case !fenced && !ran:
						t.Errorf("%s with %s: %d without running the handler; want it passed unchecked", method, c.name, status)
					}
				}
			}
			if status, ran := send(http.MethodGet, tokenHeader("orders", 5)); !ran || status != http.StatusNoContent {
				t.Errorf("GET with the current token: %d, handler ran %v; want it run", status, ran)
			}
		})
	}
}

// TestTransportKeepsLeaseOnOthersRejection: a server that passes on the
// stale rejection of another lease's token (its own write downstream,
// under a lease of its own) does not end the caller's lease; a stale
// problem naming the caller's scope and token does, and so does a terse
// one that names neither.
func TestTransportKeepsLeaseOnOthersRejection(t *testing.T) {
	fs := fencetest.NewServer()
	defer fs.Close()
	c := fs.Client()
	defer c.Close()
	ctx := context.Background()

	// The server answers, whatever it is sent, the problem the test puts
	// in the request's X-Problem header, as a handler passing on another
	// service's answer would.
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/problem+json")
		w.WriteHeader(http.StatusConflict)
		_, _ = io.WriteString(w, r.Header.Get("X-Problem"))
	}))
	defer srv.Close()

	for _, tc := range []struct {
		name string
		// problem returns the body to answer, given the lease's token.
		problem func(own fence.Token) httpguard.Problem
		lost    bool
	}{
		{"another scope", func(own fence.Token) httpguard.Problem {
			return httpguard.Problem{Scope: "billing", PresentedToken: own.Value, HighestToken: own.Value + 1}
		}, false},
		{"another token of the scope", func(own fence.Token) httpguard.Problem {
			return httpguard.Problem{Scope: own.Scope, PresentedToken: own.Value - 1, HighestToken: own.Value}
		}, false},
		{"its own token", func(own fence.Token) httpguard.Problem {
			return httpguard.Problem{Scope: own.Scope, PresentedToken: own.Value, HighestToken: own.Value + 1}
		}, true},
		{"neither scope nor token", func(own fence.Token) httpguard.Problem {
			return httpguard.Problem{HighestToken: own.Value + 1}
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, err := c.Acquire(ctx, "orders")
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				// A lease lost only locally keeps its scope at the service:
				// free it for the next case.
				_ = l.Release(ctx)
				_, _ = c.Release(ctx, "orders", l.ID())
			}()
			p := tc.problem(l.Token())
			p.Type, p.Title, p.Status, p.Detail = httpguard.ProblemType, "Stale fencing token", http.StatusConflict, "stale"
			js, err := json.Marshal(p)
			if err != nil {
				t.Fatal(err)
			}
			req, _ := http.NewRequest(http.MethodPut, srv.URL+"/orders", strings.NewReader("x"))
			req.Header.Set("X-Problem", string(js))
			resp, err := (&http.Client{Transport: httpguard.NewTransport(l, nil)}).Do(req)
			if err != nil {
				t.Fatal(err)
			}
			var got httpguard.Problem
			err = json.NewDecoder(resp.Body).Decode(&got)
			resp.Body.Close()
			if err != nil || resp.StatusCode != http.StatusConflict || got != p {
				t.Fatalf("answer %d %+v (%v), want the problem passed on as it came, %+v", resp.StatusCode, got, err, p)
			}
			switch {
			case tc.lost && !errors.Is(l.Err(), fence.ErrLeaseLost):
				t.Fatalf("lease error %v, want it lost as stale", l.Err())
			case !tc.lost && l.Err() != nil:
				t.Fatalf("the lease ended on another lease's rejection: %v", l.Err())
			}
		})
	}
}

// TestTransportPassesOtherConflictsWhole: a 409 problem+json answer that
// is not a stale-token answer reaches the caller whole and unchanged,
// however long (issue 41, item 6: a body of 102,478 bytes came cut to
// 64 KiB), and one cut short on the wire fails the caller's read, as it
// would without the Transport, instead of ending early as if complete.
// The lease is left alone.
func TestTransportPassesOtherConflictsWhole(t *testing.T) {
	fs := fencetest.NewServer()
	defer fs.Close()
	c := fs.Client()
	defer c.Close()
	ctx := context.Background()
	l, err := c.Acquire(ctx, "orders")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)

	const size = 102_478
	p := httpguard.Problem{Type: "https://example.com/problems/version-conflict", Title: "Version conflict", Status: http.StatusConflict}
	js, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	p.Detail = strings.Repeat("x", size-len(js)) // the detail is all that grows
	long, err := json.Marshal(p)
	if err != nil || len(long) != size {
		t.Fatalf("the long problem has %d bytes (%v), want %d", len(long), err, size)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/problem+json")
		if r.URL.Path == "/cut" {
			// Announces the whole body and sends only its start: the
			// server then closes the connection.
			w.Header().Set("Content-Length", fmt.Sprint(len(long)))
			w.WriteHeader(http.StatusConflict)
			_, _ = w.Write(long[:1000])
			return
		}
		w.WriteHeader(http.StatusConflict)
		_, _ = w.Write(long)
	}))
	defer srv.Close()
	hc := &http.Client{Transport: httpguard.NewTransport(l, nil)}

	resp, err := hc.Post(srv.URL+"/orders", "text/plain", strings.NewReader("x"))
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusConflict || string(got) != string(long) {
		t.Errorf("answer %d with %d bytes (%v), want 409 with the %d bytes sent", resp.StatusCode, len(got), err, len(long))
	}

	resp, err = hc.Post(srv.URL+"/cut", "text/plain", strings.NewReader("x"))
	if err != nil {
		t.Fatal(err)
	}
	got, err = io.ReadAll(resp.Body)
	resp.Body.Close()
	if !errors.Is(err, io.ErrUnexpectedEOF) || string(got) != string(long[:1000]) {
		t.Errorf("a body cut after 1000 bytes read as %d bytes and %v, want those bytes and io.ErrUnexpectedEOF", len(got), err)
	}
	if err := l.Err(); err != nil {
		t.Errorf("the lease ended on a conflict that is not a stale answer: %v", err)
	}
}
