// Package fencetest runs a real fenced inside a test process, on loopback,
// with its data in a temporary directory: the fence counterpart of
// net/http/httptest.
//
// # Usage
//
//	srv := fencetest.NewServer()
//	defer srv.Close()
//	c := srv.Client()
//	lease, err := c.Acquire(ctx, "orders")
//
// # Caveats
//
// The server is a full one-node Raft cluster writing to disk with fsync;
// it is fast but not free. Reuse one per test where you can.
package fencetest

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/fence-dev/fence/client"
	"github.com/fence-dev/fence/internal/server"
)

// Server is a running fenced. Its methods are safe for concurrent use.
type Server struct {
	// Addr is the API's host:port on loopback.
	Addr string

	srv   *server.Server
	dir   string
	close sync.Once
}

// Option configures a Server.
type Option interface{ apply(*server.Config) }

type optionFunc func(*server.Config)

func (f optionFunc) apply(c *server.Config) { f(c) }

// WithMaxTTL sets the largest TTL the server grants (default 5m). A
// maximum below the 10s default TTL lowers the default to it.
func WithMaxTTL(d time.Duration) Option {
	return optionFunc(func(c *server.Config) {
		c.MaxTTL = d
		c.DefaultTTL = min(c.DefaultTTL, d)
	})
}

// WithLogger sends the server's logs to l (default: discarded).
func WithLogger(l *slog.Logger) Option { return optionFunc(func(c *server.Config) { c.Logger = l }) }

// WithSigning makes the server sign the tokens it grants, as fenced does by
// default; Keys then fetches its public keys. Without it tokens are
// unsigned, so examples can print them.
func WithSigning() Option { return optionFunc(func(c *server.Config) { c.SignTokens = true }) }

// WithClockFloor makes the server's tokens start above its wall clock in
// microseconds, as fenced's do, where without it they count from 1 so that
// examples can print them. fenced sets that floor at every start, so that
// a data directory restored from a backup, or one that lost the end of its
// log, still grants tokens above every one it issued before; a fencetest
// server's data directory lives and dies with it.
func WithClockFloor() Option { return optionFunc(func(c *server.Config) { c.NoClockFloor = false }) }

// WithKeyPublishDelay sets how long a key added by RotateSigningKey is
// published before it signs (default 5m, as fenced's --key-publish-delay);
// 0 makes a new key sign at once.
func WithKeyPublishDelay(d time.Duration) Option {
	return optionFunc(func(c *server.Config) { c.KeyPublishDelay = d })
}

// WithMaxConnsPerAddr bounds the API connections open at once from one IP
// address (or IPv6 /64), as fenced's --max-conns-per-addr does (default
// 1024): the server closes a connection beyond it as it accepts it.
// Clients of the server then share fewer connections, as many clients
// behind one address do.
func WithMaxConnsPerAddr(n int) Option {
	return optionFunc(func(c *server.Config) { c.MaxConnsPerAddr = n })
}

// NewServer starts a server on a free loopback port and waits until it
// grants. It panics if it cannot, like httptest.NewServer.
func NewServer(opts ...Option) *Server {
	dir, err := os.MkdirTemp("", "fencetest-")
	if err != nil {
		panic(fmt.Sprintf("fencetest: %v", err))
	}
	cfg := server.DefaultConfig()
	cfg.DataDir = dir
	cfg.Listen = "127.0.0.1:0"
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg.SignTokens = false
	cfg.NoClockFloor = true
	for _, o := range opts {
		o.apply(&cfg)
	}
	srv, err := server.Start(cfg)
	if err != nil {
		os.RemoveAll(dir)
		panic(fmt.Sprintf("fencetest: start: %v", err))
	}
	for deadline := time.Now().Add(30 * time.Second); !srv.Ready(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			srv.Close(context.Background())
			os.RemoveAll(dir)
			panic("fencetest: server did not become leader within 30s")
		}
	}
	return &Server{Addr: srv.Addr(), srv: srv, dir: dir}
}

// Client returns a client of the server.
func (s *Server) Client(opts ...client.Option) *client.Client {
	c, err := client.New(s.Addr, opts...)
	if err != nil {
		panic(fmt.Sprintf("fencetest: %v", err)) // unreachable: Addr is well formed
	}
	return c
}

// Close stops the server and removes its data. Calling it again does
// nothing.
func (s *Server) Close() {
	s.close.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		s.srv.Close(ctx)
		os.RemoveAll(s.dir)
	})
}
