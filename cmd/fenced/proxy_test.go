package main

import (
	"io"
	"net"
	"sync"
	"testing"
)

// partitionProxy stands in front of one node's Raft port. Every node dials
// its peers from its own loopback address (the Raft transport binds the
// host it listens on), so the proxy knows which node each connection comes
// from. cut(ip) drops the traffic of one node, in both directions: the
// proxy of the cut node refuses everyone, and every other proxy refuses
// the cut node.
type partitionProxy struct {
	addr   string
	ip     string // the node behind this proxy
	target string

	mu    sync.Mutex
	cut   map[string]bool // cut-off node IPs
	conns map[net.Conn]string
	ln    net.Listener
}

// partitions is every proxy of a test, so one call cuts a node off from all.
var (
	partitionsMu sync.Mutex
	partitions   = map[testing.TB][]*partitionProxy{}
)

func newPartitionProxy(t testing.TB, ip, target string) *partitionProxy {
	t.Helper()
	ln, err := net.Listen("tcp", ip+":0")
	if err != nil {
		t.Fatal(err)
	}
	p := &partitionProxy{addr: ln.Addr().String(), ip: ip, target: target, cut: map[string]bool{}, conns: map[net.Conn]string{}, ln: ln}
	go p.serve()
	t.Cleanup(func() {
		ln.Close()
		p.mu.Lock()
		for c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
	})
	partitionsMu.Lock()
	partitions[t] = append(partitions[t], p)
	partitionsMu.Unlock()
	t.Cleanup(func() {
		partitionsMu.Lock()
		delete(partitions, t)
		partitionsMu.Unlock()
	})
	return p
}

func (p *partitionProxy) refuses(src string) bool { return p.cut[src] || p.cut[p.ip] }

func (p *partitionProxy) serve() {
	for {
		in, err := p.ln.Accept()
		if err != nil {
			return
		}
		src := in.RemoteAddr().(*net.TCPAddr).IP.String()
		p.mu.Lock()
		if p.refuses(src) {
			p.mu.Unlock()
			in.Close()
			continue
		}
		p.mu.Unlock()
		out, err := net.Dial("tcp", p.target)
		if err != nil {
			in.Close()
			continue
		}
		p.mu.Lock()
		if p.refuses(src) {
			// Cut while this connection was being dialled: set did not
			// see it, so it must not outlive the cut.
			p.mu.Unlock()
			in.Close()
			out.Close()
			continue
		}
		p.conns[in], p.conns[out] = src, src
		p.mu.Unlock()
		pipe := func(dst, src net.Conn) {
			io.Copy(dst, src)
			dst.Close()
			src.Close()
			p.mu.Lock()
			delete(p.conns, dst)
			delete(p.conns, src)
			p.mu.Unlock()
		}
		go pipe(out, in)
		go pipe(in, out)
	}
}

func (p *partitionProxy) set(ip string, cut bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !cut {
		delete(p.cut, ip)
		return
	}
	p.cut[ip] = true
	for c, src := range p.conns {
		if p.refuses(src) {
			c.Close()
		}
	}
}

// isolate cuts the node at ip off from every other node of the test, or
// heals it.
func isolate(t testing.TB, ip string, cut bool) {
	partitionsMu.Lock()
	defer partitionsMu.Unlock()
	for _, p := range partitions[t] {
		p.set(ip, cut)
	}
}
