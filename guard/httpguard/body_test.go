package httpguard_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/guard"
	"github.com/fence-dev/fence/guard/boltguard"
	"github.com/fence-dev/fence/guard/httpguard"
	"github.com/fence-dev/fence/guard/internal/ordersdb"
)

// signalBody is a request body that closes reached once it has given n
// bytes.
type signalBody struct {
	io.ReadCloser
	n       int
	once    sync.Once
	reached chan struct{}
}

func (b *signalBody) Read(p []byte) (int, error) {
	k, err := b.ReadCloser.Read(p)
	if b.n -= k; b.n <= 0 {
		b.once.Do(func() { close(b.reached) })
	}
	return k, err
}

// TestStalledBodyHoldsNoWrites: a client that sends its headers and 10 of
// its 100 body bytes, then stalls, does not hold up a write to another
// scope, on bbolt (plain and Batched) and SQLite, whose fenced sections
// take the whole database's write lock. The body was read inside the
// fenced section, so the other write waited for the whole stall. The
// stalled request is served once its body comes.
func TestStalledBodyHoldsNoWrites(t *testing.T) {
	bolt := func(t *testing.T) *boltguard.Store {
		store, err := boltguard.Open(filepath.Join(t.TempDir(), "data.db"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { store.Close() })
		return store
	}
	for _, tc := range []struct {
		name  string
		guard func(*testing.T) (*guard.Guard, []httpguard.Option)
	}{
		{"bbolt", func(t *testing.T) (*guard.Guard, []httpguard.Option) { return guard.New(bolt(t)), nil }},
		{"bbolt Batched", func(t *testing.T) (*guard.Guard, []httpguard.Option) {
			return guard.New(bolt(t).Batched()), []httpguard.Option{httpguard.WithRepeats()}
		}},
		{"SQLite", func(t *testing.T) (*guard.Guard, []httpguard.Option) {
			_, store := ordersdb.Open(t)
			return guard.New(store), nil
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g, opts := tc.guard(t)
			opts = append(opts, httpguard.WithScopeFunc(func(r *http.Request) string { return r.PathValue("scope") }))
			write := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				b, err := io.ReadAll(r.Body)
				if err != nil {
					http.Error(w, err.Error(), http.StatusBadRequest)
					return
				}
				w.WriteHeader(http.StatusCreated)
				fmt.Fprintf(w, "stored %d bytes", len(b))
			})
			reached := make(chan struct{})
			fenced := mustMiddleware(t, g, "", opts...)(write)
			mux := http.NewServeMux()
			mux.Handle("POST /write/{scope}", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.PathValue("scope") == "stalled" {
					r.Body = &signalBody{ReadCloser: r.Body, n: 10, reached: reached}
				}
				fenced.ServeHTTP(w, r)
			}))
			srv := httptest.NewServer(mux)
			defer srv.Close()

			c, err := net.Dial("tcp", srv.Listener.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(time.Minute))
			fmt.Fprintf(c, "POST /write/stalled HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n%s: %s\r\n\r\n%s",
				httpguard.TokenHeader, fence.Token{Scope: "stalled", Value: 1}, strings.Repeat("a", 10))
			unstalled := false
			unstall := func() {
				if !unstalled {
					unstalled = true
					io.WriteString(c, strings.Repeat("b", 90))
				}
			}
			defer unstall() // so that the server can close
			select {
			case <-reached:
			case <-time.After(30 * time.Second):
				t.Fatal("the server never read the stalled body's first 10 bytes")
			}

			// Bounded, so that a failing test ends: the write would wait
			// for the whole stall, which lasts until it is given up.
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/write/other", strings.NewReader("other"))
			req.Header.Set(httpguard.TokenHeader, fence.Token{Scope: "other", Value: 1}.String())
			resp, err := srv.Client().Do(req)
			if err != nil {
				t.Fatalf("a write to another scope while a body stalls: %v; want it done at once", err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusCreated {
				t.Fatalf("a write to another scope while a body stalls: %s %s; want 201", resp.Status, b)
			}

			unstall()
			stalled, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatal(err)
			}
			b, _ = io.ReadAll(stalled.Body)
			if stalled.StatusCode != http.StatusCreated || string(b) != "stored 100 bytes" {
				t.Fatalf("the stalled request, once sent: %s %q; want 201, stored 100 bytes", stalled.Status, b)
			}
		})
	}
}

// TestBodyOverLimitIs413: a body over the limit (WithMaxBody) is answered
// 413 with a problem, whether its length was announced or not, and the
// handler never runs, nor does the mark move; a body at the limit is
// served whole. WithMaxBody must be positive.
func TestBodyOverLimitIs413(t *testing.T) {
	store := guard.NewMemoryStore()
	var ran atomic.Int64
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ran.Add(1)
		b, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "%d", len(b))
	})
	srv := httptest.NewServer(mustMiddleware(t, guard.New(store), "s", httpguard.WithMaxBody(64))(h))
	defer srv.Close()
	post := func(body io.Reader, token uint64) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, srv.URL, body)
		req.Header.Set(httpguard.TokenHeader, fence.Token{Scope: "s", Value: token}.String())
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, announced := range []bool{true, false} {
		body := io.Reader(strings.NewReader(strings.Repeat("x", 65)))
		if !announced {
			body = io.MultiReader(body) // chunked
		}
		code, msg := post(body, 2)
		var p httpguard.Problem
		if code != http.StatusRequestEntityTooLarge || json.Unmarshal([]byte(msg), &p) != nil || p.Status != 413 || p.Scope != "s" {
			t.Errorf("65 bytes over a limit of 64, length announced %v: %d %s; want a 413 problem", announced, code, msg)
		}
	}
	if m := store.Highest("s"); ran.Load() != 0 || m.Token != 0 {
		t.Fatalf("after bodies over the limit: the handler ran %d times, the mark is %d; want neither", ran.Load(), m.Token)
	}
	if code, msg := post(strings.NewReader(strings.Repeat("x", 64)), 1); code != http.StatusOK || msg != "64" {
		t.Errorf("64 bytes at a limit of 64: %d %q; want 200, the handler's 64", code, msg)
	}
	for _, n := range []int64{0, -1} {
		if _, err := httpguard.Middleware(guard.New(store), "s", httpguard.WithMaxBody(n)); err == nil {
			t.Errorf("WithMaxBody(%d) accepted", n)
		}
	}
}
