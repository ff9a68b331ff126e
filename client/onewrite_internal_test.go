package client

import (
	"context"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"
)

// countedConn counts the writes made to a connection.
type countedConn struct {
	net.Conn
	writes *atomic.Int32
}

func (c countedConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

// TestOneWriteACall: a unary call on a connection of its own goes out in
// one write, headers and body together, so that the node reads it whole
// at once rather than waking again for the body.
func TestOneWriteACall(t *testing.T) {
	s := StartServer(t, nil)
	c, err := New(s.Addr(), WithHolder("one-write"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var tr *http.Transport
	switch rt := c.own.Transport.(type) {
	case oneWrite:
		tr = rt.Transport
	case *http.Transport:
		tr = rt
	}
	if tr == nil {
		t.Fatalf("the client's own transport is a %T", c.own.Transport)
	}
	var writes atomic.Int32
	dial := tr.DialContext
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return countedConn{conn, &writes}, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	const cycles = 3
	for range cycles {
		l, err := c.Grant(ctx, "one-write", WithTTL(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Release(ctx, l.Scope, l.ID); err != nil {
			t.Fatal(err)
		}
	}
	if got := writes.Load(); got != 2*cycles {
		t.Errorf("%d calls made %d writes to their connection, want one each", 2*cycles, got)
	}
}
