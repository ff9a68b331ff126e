package fencetest

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/client"
)

// TestMain checks that a closed Server leaves no goroutine behind: not
// Raft's, not the HTTP server's, not its clients' connections.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// TestServerServes: a new server is ready to grant at once, its client
// works, and Close removes its data directory.
func TestServerServes(t *testing.T) {
	srv := newServer(t)
	dir := srv.dir
	if _, err := os.Stat(dir); err != nil {
		t.Fatalf("data dir: %v", err)
	}
	c := srv.Client(client.WithHolder("me"))
	ctx := testContext(t)
	g, err := c.Grant(ctx, "orders")
	if err != nil {
		srv.Close()
		t.Fatalf("first Grant = %v; the server should be ready when NewServer returns", err)
	}
	st, err := c.Get(ctx, "orders")
	if err != nil || st.Lease == nil || st.Lease.Holder != "me" || st.Lease.Token != 1 || g.Token != 1 {
		t.Errorf("Get = %+v, %v; want held by me with token 1", st, err)
	}
	c.Close()
	srv.Close()
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("data dir after Close: %v, want it removed", err)
	}
}

// TestServersAreIndependent: each server has its own state, so tests that
// use their own servers do not see each other's tokens.
func TestServersAreIndependent(t *testing.T) {
	ctx := testContext(t)
	for i := range 2 {
		srv := newServer(t)
		c := srv.Client()
		g, err := c.Grant(ctx, "orders")
		c.Close()
		srv.Close()
		if err != nil || g.Token != 1 {
			t.Errorf("server %d: first grant = %d, %v; want token 1", i, g.Token, err)
		}
	}
}

// newServer is NewServer for tests of NewServer itself: a panic fails the
// test instead of ending the test binary.
func newServer(t *testing.T, opts ...Option) (srv *Server) {
	t.Helper()
	defer func() {
		if r := recover(); r != nil {
			t.Fatalf("NewServer panicked: %v", r)
		}
	}()
	return NewServer(opts...)
}

// TestWithMaxTTL: the server grants TTLs up to the configured maximum and
// refuses longer ones, also when the maximum is below the server's 10s
// default TTL, as tests of short leases want.
func TestWithMaxTTL(t *testing.T) {
	for _, max := range []time.Duration{time.Minute, time.Second} {
		t.Run(max.String(), func(t *testing.T) {
			srv := newServer(t, WithMaxTTL(max))
			defer srv.Close()
			c := srv.Client()
			defer c.Close()
			ctx := testContext(t)

			_, err := c.Grant(ctx, "orders", client.WithTTL(max+time.Millisecond))
			var inv *fence.InvalidError
			if !errors.As(err, &inv) || inv.Field != "ttl" {
				t.Fatalf("Grant above the max TTL = %v, want an invalid ttl", err)
			}
			if _, err := c.Grant(ctx, "orders", client.WithTTL(max)); err != nil {
				t.Fatalf("Grant at the max TTL = %v", err)
			}
		})
	}
}

// syncBuffer is a bytes.Buffer that the server's goroutines may write
// while the test reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// TestWithLogger: lease transitions reach the given logger with the
// fields docs/design.md names.
func TestWithLogger(t *testing.T) {
	var buf syncBuffer
	srv := newServer(t, WithLogger(slog.New(slog.NewTextHandler(&buf, nil))))
	defer srv.Close()
	c := srv.Client(client.WithHolder("logged"))
	defer c.Close()
	ctx := testContext(t)

	g, err := c.Grant(ctx, "orders")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Release(ctx, "orders", g.ID); err != nil {
		t.Fatal(err)
	}
	srv.Close() // the event lines are written off the state machine's goroutine, by Close at the latest
	logs := buf.String()
	for _, want := range []string{
		`msg="lease granted" scope=orders token=1 lease=` + g.ID.Fingerprint() + ` holder=logged`,
		`msg="lease released" scope=orders token=1`,
	} {
		if !strings.Contains(logs, want) {
			t.Errorf("logs lack %q:\n%s", want, logs)
		}
	}
	if strings.Contains(logs, g.ID.String()) {
		t.Errorf("logs hold the lease ID %s, a secret of its holder:\n%s", g.ID, logs)
	}
}

// TestCloseTwice: like httptest.Server.Close, Close may be called more
// than once, for example by a deferred Close after a test stopped the
// server on purpose.
func TestCloseTwice(t *testing.T) {
	srv := newServer(t)
	srv.Close()
	defer func() {
		if r := recover(); r != nil {
			t.Errorf("second Close panicked: %v", r)
		}
	}()
	srv.Close()
}

// TestClientAfterClose: a client of a closed server gets
// fence.ErrUnavailable, not a hang.
func TestClientAfterClose(t *testing.T) {
	srv := newServer(t)
	c := srv.Client(client.WithRetryTimeout(100 * time.Millisecond))
	defer c.Close()
	srv.Close()
	_, err := c.Get(testContext(t), "orders")
	if !errors.Is(err, fence.ErrUnavailable) {
		t.Errorf("Get from a closed server = %v, want fence.ErrUnavailable", err)
	}
}

// TestWithClockFloor: with the option, the first token is above the wall
// clock in microseconds when the server started, as fenced's first is.
func TestWithClockFloor(t *testing.T) {
	before := uint64(time.Now().UnixMicro())
	srv := NewServer(WithClockFloor())
	defer srv.Close()
	c := srv.Client()
	defer c.Close()
	l, err := c.Acquire(context.Background(), "orders")
	if err != nil {
		t.Fatal(err)
	}
	if got := l.Token().Value; got <= before {
		t.Fatalf("first token %d, want above the clock floor %d", got, before)
	}
}
