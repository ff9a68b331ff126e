package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/fence-dev/fence/client"
)

// proc is a child process: fenced, the resource or a worker. It can be
// started again after it exits (a restart after kill -9). Safe for
// concurrent use.
type proc struct {
	name string
	bin  string
	args []string
	log  string // stdout and stderr, appended across restarts

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
	paused bool
}

func newProc(dir, name, bin string, args ...string) *proc {
	return &proc{name: name, bin: bin, args: args, log: filepath.Join(dir, name+".log")}
}

// start starts the process (again).
func (p *proc) start() error {
	f, err := os.OpenFile(p.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	cmd := exec.Command(p.bin, p.args...)
	cmd.Stdout, cmd.Stderr = f, f
	dieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", p.name, err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	p.mu.Lock()
	p.cmd, p.exited, p.paused = cmd, exited, false
	p.mu.Unlock()
	return nil
}

func (p *proc) current() (*exec.Cmd, chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd, p.exited
}

// running reports whether the process is alive.
func (p *proc) running() bool {
	cmd, exited := p.current()
	if cmd == nil {
		return false
	}
	select {
	case <-exited:
		return false
	default:
		return true
	}
}

// signal sends sig if the process is alive.
func (p *proc) signal(sig syscall.Signal) error {
	cmd, _ := p.current()
	if cmd == nil || !p.running() {
		return errors.New(p.name + " is not running")
	}
	return cmd.Process.Signal(sig)
}

// pause stops the process with SIGSTOP; it reports false if it was
// already paused or is not running.
func (p *proc) pause() bool {
	p.mu.Lock()
	if p.paused {
		p.mu.Unlock()
		return false
	}
	p.paused = true
	p.mu.Unlock()
	if p.signal(syscall.SIGSTOP) != nil {
		p.mu.Lock()
		p.paused = false
		p.mu.Unlock()
		return false
	}
	return true
}

// resume continues a paused process.
func (p *proc) resume() {
	p.signal(syscall.SIGCONT)
	p.mu.Lock()
	p.paused = false
	p.mu.Unlock()
}

// wait waits up to d for the process to exit.
func (p *proc) wait(d time.Duration) bool {
	cmd, exited := p.current()
	if cmd == nil {
		return true
	}
	select {
	case <-exited:
		return true
	case <-time.After(d):
		return false
	}
}

// exitCode returns the exit status of the process's last run: -1 if it
// was ended by a signal or has not ended.
func (p *proc) exitCode() int {
	cmd, exited := p.current()
	if cmd == nil {
		return -1
	}
	select {
	case <-exited:
		return cmd.ProcessState.ExitCode()
	default:
		return -1
	}
}

// logSize returns the size of the process's log.
func (p *proc) logSize() int64 {
	fi, err := os.Stat(p.log)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// logFrom returns the process's log from offset off, at most its last
// 64 KiB.
func (p *proc) logFrom(off int64) string {
	f, err := os.Open(p.log)
	if err != nil {
		return ""
	}
	defer f.Close()
	off = max(off, p.logSize()-64<<10)
	b, _ := io.ReadAll(io.NewSectionReader(f, off, 64<<10))
	return string(b)
}

// kill sends SIGKILL and waits for the process to be gone.
func (p *proc) kill() {
	p.signal(syscall.SIGKILL)
	p.wait(10 * time.Second)
}

// stop asks the process to end (SIGCONT, then SIGTERM) and kills it if it
// has not within grace.
func (p *proc) stop(grace time.Duration) {
	p.resume()
	p.signal(syscall.SIGTERM)
	if !p.wait(grace) {
		p.kill()
	}
}

// node is one fenced process; in a cluster its Raft port sits behind a
// proxy that can refuse the other nodes.
type node struct {
	id, ip, api, raft string
	raftProxy         *proxy // nil for a single node
	p                 *proc
	dataDir           string
	disk              string // the tmpfs mounted for it, holding dataDir; "" if none
	noDisk            string // why there is none, when the fill fault is on
	// busy is held by a fault that stops, damages or fills the node, from
	// the moment it takes the node down until it has started it again, so
	// that two faults never start it twice.
	busy sync.Mutex
}

// freePort returns an address on ip whose port was free a moment ago.
func freePort(ip string) (string, error) {
	ln, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// startNodes starts one fenced, or a cluster of n with its own /24 of
// loopback addresses so that the partition proxies can tell the nodes
// apart by source address.
func (r *runner) startNodes(ctx context.Context) error {
	n := r.cfg.nodes
	base := fmt.Sprintf("127.%d.%d.", 1+rand.IntN(250), 1+rand.IntN(250))
	for i := range n {
		nd := &node{id: fmt.Sprintf("n%d", i+1), ip: "127.0.0.1"}
		if n > 1 {
			nd.ip = base + fmt.Sprint(10+i)
		}
		var err error
		if nd.api, err = freePort(nd.ip); err != nil {
			return fmt.Errorf("loopback address %s: %w", nd.ip, err)
		}
		args := []string{"--listen", nd.api}
		if r.cfg.storageOn() {
			args = append(args, storageArgs...)
		}
		if n > 1 {
			if nd.raft, err = freePort(nd.ip); err != nil {
				return err
			}
			if nd.raftProxy, err = newProxy(nd.ip, nd.raft); err != nil {
				return err
			}
			args = append(args, "--node-id", nd.id, "--raft-listen", nd.raft, "--raft-advertise", nd.raftProxy.addr(), "--election-timeout", "1s")
			if i == 0 {
				args = append(args, "--bootstrap")
			} else {
				args = append(args, "--join", r.nodes[0].api)
			}
		}
		nd.dataDir, nd.disk, nd.noDisk = r.newDisk(nd.id) // last: nothing may fail between the mount and the append
		nd.p = newProc(r.dir, "fenced-"+nd.id, r.fencedBin, append([]string{"--data-dir", nd.dataDir}, args...)...)
		r.nodes = append(r.nodes, nd)
	}
	var addrs []string
	for _, nd := range r.nodes {
		addrs = append(addrs, nd.api)
		if err := nd.p.start(); err != nil {
			return err
		}
		if nd == r.nodes[0] {
			if err := waitFor(ctx, 30*time.Second, "fenced "+nd.id+" to serve", func(ctx context.Context) error {
				c, err := client.New(nd.api, client.WithRetryTimeout(0))
				if err != nil {
					return err
				}
				defer c.Close()
				_, err = c.Get(ctx, "probe")
				return err
			}); err != nil {
				return err
			}
		}
	}
	var err error
	r.admin, err = client.New(strings.Join(addrs, ","), client.WithRetryTimeout(20*time.Second))
	if err != nil {
		return err
	}
	if n > 1 {
		return waitFor(ctx, 60*time.Second, fmt.Sprintf("%d voters", n), func(ctx context.Context) error {
			st, err := r.admin.ClusterStatus(ctx)
			if err != nil {
				return err
			}
			ok := 0
			for _, m := range st.Nodes {
				if m.Voter && m.APIAddr != "" && (m.State == "leader" || m.State == "follower") {
					ok++
				}
			}
			if ok != n || st.Leader == "" {
				return fmt.Errorf("%d of %d voters up, leader %q", ok, n, st.Leader)
			}
			return nil
		})
	}
	return nil
}

// leader returns the node that leads, asking the nodes themselves; for a
// single node, that node.
func (r *runner) leader(ctx context.Context) *node {
	if len(r.nodes) == 1 {
		return r.nodes[0]
	}
	for _, nd := range r.nodes {
		if !nd.p.running() {
			continue
		}
		c, err := client.New(nd.api, client.WithRetryTimeout(0))
		if err != nil {
			continue
		}
		sctx, cancel := context.WithTimeout(ctx, time.Second)
		st, err := c.ClusterStatus(sctx)
		cancel()
		c.Close()
		if err != nil || st.Leader == "" {
			continue
		}
		for _, l := range r.nodes {
			if l.id == st.Leader {
				return l
			}
		}
	}
	return nil
}

// isolate cuts nd off from the other nodes, or heals it: its own proxy
// refuses them, and theirs refuse it.
func (r *runner) isolate(nd *node, cut bool) {
	for _, o := range r.nodes {
		if o == nd {
			for _, peer := range r.nodes {
				if peer != nd {
					o.raftProxy.setRefused(peer.ip, cut)
				}
			}
			continue
		}
		o.raftProxy.setRefused(nd.ip, cut)
	}
}

// waitFor retries f until it succeeds or d passes.
func waitFor(ctx context.Context, d time.Duration, what string, f func(context.Context) error) error {
	deadline := time.Now().Add(d)
	for {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := f(cctx)
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("waiting for %s: %w", what, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitHTTP waits until url answers 200.
func waitHTTP(ctx context.Context, url string, d time.Duration) error {
	return waitFor(ctx, d, url, func(ctx context.Context) error {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return errors.New(resp.Status)
		}
		return nil
	})
}
