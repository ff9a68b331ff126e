package raftnode

import (
	"crypto/tls"
	"fmt"
	"net"
	"time"

	"github.com/hashicorp/raft"
)

// tcpLayer is raft's stream layer over plain TCP. Unlike raft's own
// NewTCPTransport it dials from the host it listens on, when that is one
// address: peers, firewalls and the tests' partitioning proxies then see
// which node a connection comes from.
type tcpLayer struct {
	net.Listener
	advertise net.Addr
	local     *net.TCPAddr // nil: let the kernel choose
	tls       *tls.Config  // nil: plain TCP
}

func listen(bind, advertise string, tc *tls.Config) (*tcpLayer, error) {
	adv, err := net.ResolveTCPAddr("tcp", advertise)
	if err != nil {
		return nil, fmt.Errorf("raft advertise address %q: %w", advertise, err)
	}
	if adv.IP == nil || adv.IP.IsUnspecified() {
		return nil, fmt.Errorf("raft advertise address %q: peers cannot dial an unspecified host; give --raft-advertise", advertise)
	}
	ln, err := net.Listen("tcp", bind)
	if err != nil {
		return nil, fmt.Errorf("raft listen: %w", err)
	}
	l := &tcpLayer{Listener: ln, advertise: adv, tls: tc}
	if tc != nil {
		// Both ends prove they hold a certificate of the cluster's CA: a
		// stranger can neither join the Raft traffic nor pose as a node.
		server := tc.Clone()
		server.ClientAuth = tls.RequireAndVerifyClientCert
		server.ClientCAs = tc.RootCAs
		l.Listener = tls.NewListener(ln, server)
	}
	if a := ln.Addr().(*net.TCPAddr); !a.IP.IsUnspecified() {
		l.local = &net.TCPAddr{IP: a.IP}
	}
	if adv.Port == 0 { // listening on port 0: advertise the port we got
		adv.Port = ln.Addr().(*net.TCPAddr).Port
	}
	return l, nil
}

func (l *tcpLayer) Addr() net.Addr { return l.advertise }

// Accept returns the next connection, which answers a log format probe
// itself (see probeConn).
func (l *tcpLayer) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &probeConn{Conn: c}, nil
}

func (l *tcpLayer) Dial(addr raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	d := net.Dialer{Timeout: timeout}
	if l.local != nil {
		d.LocalAddr = l.local
	}
	if l.tls != nil {
		return (&tls.Dialer{NetDialer: &d, Config: l.tls}).Dial("tcp", string(addr))
	}
	return d.Dial("tcp", string(addr))
}
