package server

import (
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"time"
)

// connLimiter is a listener that keeps at most total connections open, and
// at most perAddr from one remote IP address (see addrKey). A connection
// beyond either limit is accepted and closed at once, rather than left in
// the kernel's backlog as netutil.LimitListener would: the client learns
// at once, and the backlog stays free for the clients the limits are there
// to serve. With the total a fraction of the process's file descriptors,
// fenced keeps descriptors for its Raft log, snapshots and peers whatever
// comes in.
type connLimiter struct {
	net.Listener
	total, perAddr int
	log            *slog.Logger
	onRefuse       func(limit string) // counts a refusal by the limit's flag

	mu      sync.Mutex
	open    int
	byAddr  map[netip.Prefix]int
	logged  time.Time // when a refusal was last logged
	refused int       // refusals since then
}

func limitConns(ln net.Listener, total, perAddr int, log *slog.Logger, onRefuse func(limit string)) *connLimiter {
	return &connLimiter{Listener: ln, total: total, perAddr: perAddr, log: log, onRefuse: onRefuse, byAddr: make(map[netip.Prefix]int)}
}

// Accept returns the next connection within the limits, closing the ones
// beyond them.
func (l *connLimiter) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		addr := remoteKey(c)
		if limit := l.admit(addr); limit != "" {
			c.Close()
			l.onRefuse(limit)
			l.logRefusal(addr, limit)
			continue
		}
		return &limitedConn{Conn: c, release: sync.OnceFunc(func() { l.release(addr) })}, nil
	}
}

// The limits, named as their flags.
const (
	limitTotal   = "max-conns"
	limitPerAddr = "max-conns-per-addr"
)

// admit counts a new connection from addr, or says which limit refuses it.
func (l *connLimiter) admit(addr netip.Prefix) (limit string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.open >= l.total:
		return limitTotal
	case l.byAddr[addr] >= l.perAddr:
		return limitPerAddr
	}
	l.open++
	l.byAddr[addr]++
	return ""
}

func (l *connLimiter) release(addr netip.Prefix) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.open--
	if l.byAddr[addr]--; l.byAddr[addr] <= 0 {
		delete(l.byAddr, addr)
	}
}

// openConns is how many connections are open now.
func (l *connLimiter) openConns() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.open
}

// logRefusal logs a refused connection, at most once a minute with the
// count since: a flood must not flood the log too.
func (l *connLimiter) logRefusal(addr netip.Prefix, limit string) {
	why := "the server has its most connections open (--max-conns)"
	if limit == limitPerAddr {
		why = "the address has its most connections open (--max-conns-per-addr)"
	}
	l.mu.Lock()
	l.refused++
	if time.Since(l.logged) < time.Minute {
		l.mu.Unlock()
		return
	}
	n, open, fromAddr := l.refused, l.open, l.byAddr[addr]
	l.refused, l.logged = 0, time.Now()
	l.mu.Unlock()
	l.log.Warn("connections refused: "+why, "refused", n, "last_from", addr.String(), "open", open, "open_from_addr", fromAddr,
		"max_conns", l.total, "max_conns_per_addr", l.perAddr)
}

// remoteKey is addrKey of the connection's remote address. Connections
// without an IP address (not TCP) share the zero prefix.
func remoteKey(c net.Conn) netip.Prefix {
	ap, err := netip.ParseAddrPort(c.RemoteAddr().String())
	if err != nil {
		return netip.Prefix{}
	}
	return addrKey(ap.Addr())
}

// addrKey is what connections from a are counted by: an IPv4 address, or
// the /64 of an IPv6 one, because a single IPv6 host is commonly given a
// whole /64 and could otherwise open the limit from each of its addresses.
func addrKey(a netip.Addr) netip.Prefix {
	a = a.Unmap().WithZone("")
	bits := 32
	if a.Is6() {
		bits = 64
	}
	p, _ := a.Prefix(bits)
	return p
}

// limitedConn gives its place back when closed, once however often Close
// is called.
type limitedConn struct {
	net.Conn
	release func()
}

func (c *limitedConn) Close() error {
	c.release()
	return c.Conn.Close()
}

// CloseWrite lets net/http half-close an HTTP/1 connection before it closes
// it, as it does a TCP connection, so the client reads the last answer
// rather than a reset.
func (c *limitedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
