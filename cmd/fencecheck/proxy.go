package main

import (
	"io"
	"net"
	"sync"
	"time"
)

// proxy is a TCP proxy in front of one target: a worker's way to the
// resource or to one fenced node. The nemesis can cut it (existing
// connections are closed, new ones refused) and can make it hold back the
// next connection's request for a while before it delivers it. Workers
// open one connection per resource request, so holding a connection holds
// one request: the delayed packet of the t0–t5 story. A proxy in front of
// a Raft port can instead refuse the peers in a set of source addresses
// (a partition between nodes). It is safe for concurrent use.
type proxy struct {
	ln     net.Listener
	target string
	done   chan struct{} // closed by close

	mu      sync.Mutex
	cut     bool
	refused map[string]bool // source IPs refused
	hold    []time.Duration // delays for the next connections
	onNext  []func()        // called as the next connections arrive
	onHold  func(d time.Duration)
	dropped int // held requests close dropped before their hold was over
	conns   map[net.Conn]string
	closed  bool
	wg      sync.WaitGroup
}

// newProxy listens on ip (port chosen by the system) and forwards to target.
func newProxy(ip, target string) (*proxy, error) {
	ln, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		return nil, err
	}
	p := &proxy{ln: ln, target: target, done: make(chan struct{}), refused: map[string]bool{}, conns: map[net.Conn]string{}}
	p.wg.Add(1)
	go p.serve()
	return p, nil
}

// addr returns the address clients dial.
func (p *proxy) addr() string { return p.ln.Addr().String() }

func (p *proxy) serve() {
	defer p.wg.Done()
	for {
		in, err := p.ln.Accept()
		if err != nil {
			return
		}
		src := in.RemoteAddr().(*net.TCPAddr).IP.String()
		p.mu.Lock()
		if p.cut || p.refused[src] || p.closed {
			p.mu.Unlock()
			in.Close()
			continue
		}
		var hold time.Duration
		if len(p.hold) > 0 {
			hold, p.hold = p.hold[0], p.hold[1:]
		}
		if len(p.onNext) > 0 {
			go p.onNext[0]()
			p.onNext = p.onNext[1:]
		}
		p.conns[in] = src
		p.wg.Add(1)
		p.mu.Unlock()
		go p.forward(in, src, hold)
	}
}

// forward pipes one connection. A held connection's bytes from the client
// wait in the kernel's buffers until the hold is over; then the proxy
// connects to the target and delivers them.
func (p *proxy) forward(in net.Conn, src string, hold time.Duration) {
	defer p.wg.Done()
	defer p.drop(in)
	if hold > 0 {
		t := time.NewTimer(hold)
		select {
		case <-t.C:
		case <-p.done:
			t.Stop()
			p.mu.Lock()
			p.dropped++
			p.mu.Unlock()
			return
		}
		p.mu.Lock()
		f := p.onHold
		p.mu.Unlock()
		if f != nil {
			f(hold)
		}
	}
	out, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	if err != nil {
		return
	}
	defer p.drop(out)
	p.mu.Lock()
	if p.closed || p.cut || p.refused[src] {
		p.mu.Unlock()
		return
	}
	p.conns[out] = src
	p.mu.Unlock()
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		io.Copy(dst, src)
		if tc, ok := dst.(*net.TCPConn); ok {
			tc.CloseWrite()
		}
		done <- struct{}{}
	}
	go pipe(out, in)
	go pipe(in, out)
	<-done
	<-done
}

func (p *proxy) drop(c net.Conn) {
	c.Close()
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

// setCut cuts the proxy off (closing its connections) or heals it.
func (p *proxy) setCut(cut bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = cut
	if cut {
		for c := range p.conns {
			c.Close()
		}
	}
}

// setRefused refuses (closing its connections) or admits the traffic of
// source IP ip.
func (p *proxy) setRefused(ip string, refused bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !refused {
		delete(p.refused, ip)
		return
	}
	p.refused[ip] = true
	for c, src := range p.conns {
		if src == ip {
			c.Close()
		}
	}
}

// setOnHold makes the proxy call f as it delivers a held request.
func (p *proxy) setOnHold(f func(d time.Duration)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.onHold = f
}

// holdNext makes the proxy hold the next connection's request for d.
func (p *proxy) holdNext(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.hold = append(p.hold, d)
}

// atNext calls f (in a goroutine of its own) when the next connection
// arrives.
func (p *proxy) atNext(f func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.onNext = append(p.onNext, f)
}

// disarm forgets the holds and calls armed for the next connections. It
// returns how many holds it forgot.
func (p *proxy) disarm() (holds int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	holds = len(p.hold)
	p.hold, p.onNext = nil, nil
	return holds
}

// droppedHolds returns how many held requests close dropped undelivered.
func (p *proxy) droppedHolds() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.dropped
}

// close stops the proxy, dropping held requests undelivered, and waits for
// its goroutines.
func (p *proxy) close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	close(p.done)
	p.hold, p.onNext = nil, nil
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.ln.Close()
	p.wg.Wait()
}
