package raftnode

import (
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
}

func listen(bind, advertise string) (*tcpLayer, error) {
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
	l := &tcpLayer{Listener: ln, advertise: adv}
	if a := ln.Addr().(*net.TCPAddr); !a.IP.IsUnspecified() {
		l.local = &net.TCPAddr{IP: a.IP}
	}
	if adv.Port == 0 { // listening on port 0: advertise the port we got
		adv.Port = ln.Addr().(*net.TCPAddr).Port
	}
	return l, nil
}

func (l *tcpLayer) Addr() net.Addr { return l.advertise }

func (l *tcpLayer) Dial(addr raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	d := net.Dialer{Timeout: timeout}
	if l.local != nil {
		d.LocalAddr = l.local
	}
	return d.Dial("tcp", string(addr))
}
