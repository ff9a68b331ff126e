package main

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// wlFailover is the failover workload of the cluster subcommand.
const wlFailover = "failover"

// roleCluster is the cluster subcommand: fence and etcd on three nodes.
const roleCluster = "cluster"

// failover is one kill of a cluster's leader under a steady load.
type failover struct {
	Run     int    `json:"run"`
	System  string `json:"system"`
	Clients int    `json:"clients"`
	Kill    int    `json:"kill"`
	Leader  string `json:"leader"` // the member killed
	// Took is the time from the kill to the first grant answered by the
	// new leader; Elected, to the first time the surviving members
	// agreed on a new leader that said so itself (asked every 50 ms).
	Took    time.Duration `json:"took_ns"`
	Elected time.Duration `json:"elected_ns"`
	// Rejoined is the time from the killed member's restart to the
	// cluster's being whole again.
	Rejoined time.Duration `json:"rejoined_ns"`
	// Errors is what the clients' calls returned in error from the kill
	// until the cluster was whole again; FirstError is the first of them.
	Errors     int64  `json:"errors"`
	FirstError string `json:"first_error,omitempty"`
}

// beforeKill is how long the load runs on a whole cluster before a kill.
const beforeKill = 2 * time.Second

// newLeaderGrant tells the first grant answered by a new leader. Each grant
// comes with a marker (clientArgs.granted): a grant of the new leader's
// has a marker above the one armed, every grant of the old leader's one
// at or below it. It is safe for concurrent use.
type newLeaderGrant struct {
	mu    sync.Mutex
	above uint64
	armed bool
	first time.Time
	found chan struct{}
	// grants counts every grant seen, armed or not.
	grants atomic.Int64
}

// arm starts looking for a grant whose marker is above above, and returns
// a channel closed when one is seen.
func (g *newLeaderGrant) arm(above uint64) <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.above, g.armed, g.first, g.found = above, true, time.Time{}, make(chan struct{})
	return g.found
}

// granted records a grant with marker seen at now.
func (g *newLeaderGrant) granted(marker uint64, now time.Time) {
	g.grants.Add(1)
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.armed && marker > g.above {
		g.armed, g.first = false, now
		close(g.found)
	}
}

// firstAt is when the first grant above the armed marker was seen; zero
// if none was yet.
func (g *newLeaderGrant) firstAt() time.Time {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.first
}

// loadErrors counts the errors of a steady load.
type loadErrors struct {
	n     atomic.Int64
	first atomic.Pointer[string]
}

// take returns the errors since the last take, and the first of them.
func (e *loadErrors) take() (int64, string) {
	first := ""
	if p := e.first.Swap(nil); p != nil {
		first = *p
	}
	return e.n.Swap(0), first
}

// steady runs every op back to back in its own goroutine until ctx ends.
// An op that fails is counted and tried again 10 ms later: the load
// rides through a failover, as a program would.
func steady(ctx context.Context, ops []op, errs *loadErrors) (wait func()) {
	var wg sync.WaitGroup
	for _, o := range ops {
		wg.Go(func() {
			for ctx.Err() == nil {
				if err := o(ctx); err != nil && ctx.Err() == nil {
					errs.n.Add(1)
					msg := err.Error()
					errs.first.CompareAndSwap(nil, &msg)
					select {
					case <-ctx.Done():
					case <-time.After(10 * time.Millisecond):
					}
				}
			}
		})
	}
	return wg.Wait
}

// runFailover starts a cluster of sys, puts the lock cycle of c.clients
// clients on it (the same workers as the lock-cycle cell, in this
// process, so that the kill and the grants are timed on one clock), and
// kills its leader with SIGKILL cfg.kills times: each time it waits for
// the first grant answered by the new leader, then restarts the killed
// member and waits for the cluster to be whole again.
func runFailover(ctx context.Context, cfg config, c cell, sys string) ([]failover, error) {
	dir, err := os.MkdirTemp(cfg.data, fmt.Sprintf("cluster-%s-%s-", c.workload, sys))
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	cl, err := startCluster(dir, sys, cfg.fenced, cfg.electionTimeout)
	if err != nil {
		return nil, err
	}
	defer cl.stop()
	var g newLeaderGrant
	a := clientArgs{system: sys, workload: wlLockCycle, clients: c.clients, granted: func(marker uint64) { g.granted(marker, time.Now()) }}
	switch sys {
	case sysFence:
		a.addr.fence = cl.addrs()
	case sysEtcd:
		a.addr.etcd = cl.addrs()
	}
	sctx, cancel := context.WithTimeout(ctx, setupBound)
	ops, cleanup, err := setup(sctx, a)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("setup: %w", err)
	}
	defer cleanup()
	lctx, stopLoad := context.WithCancel(ctx)
	var errs loadErrors
	wait := steady(lctx, ops, &errs)
	defer wait()
	defer stopLoad()

	var out []failover
	for k := 1; k <= cfg.kills; k++ {
		if err := awaitGrants(ctx, &g, beforeKill); err != nil {
			return out, fmt.Errorf("kill %d: %w", k, err)
		}
		lead, term, err := func() (*member, uint64, error) {
			lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			return cl.leader(lctx)
		}()
		if err != nil {
			return out, fmt.Errorf("kill %d: %w", k, err)
		}
		errs.take()
		killAt := time.Now()
		above := term // etcd: a grant in a later term
		if sys == sysFence {
			// The new leader's floor is its clock when it takes office.
			above = uint64(killAt.UnixMicro())
		}
		found := g.arm(above)
		cl.kill(lead)
		f := failover{System: sys, Clients: c.clients, Kill: k, Leader: lead.name}
		if f.Elected, err = awaitElection(ctx, cl, killAt); err != nil {
			return out, fmt.Errorf("kill %d of %s: %w", k, lead.name, err)
		}
		select {
		case <-found:
			f.Took = g.firstAt().Sub(killAt)
		case <-time.After(60 * time.Second):
			return out, fmt.Errorf("kill %d of %s: no grant by a new leader within 60s", k, lead.name)
		case <-ctx.Done():
			return out, ctx.Err()
		}
		restarted := time.Now()
		if err := cl.start(lead); err != nil {
			return out, fmt.Errorf("kill %d: restart: %w", k, err)
		}
		wctx, cancel := context.WithTimeout(ctx, startBound)
		err = cl.whole(wctx)
		cancel()
		if err != nil {
			return out, fmt.Errorf("kill %d: %w", k, err)
		}
		f.Rejoined = time.Since(restarted)
		f.Errors, f.FirstError = errs.take()
		out = append(out, f)
	}
	return out, nil
}

// awaitElection asks the running members every 50 ms, for at most a
// minute, until they agree on a leader, and returns the time since killAt.
func awaitElection(ctx context.Context, cl *cluster, killAt time.Time) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		if _, _, err := cl.agreed(ctx); err == nil {
			return time.Since(killAt), nil
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("no new leader agreed on: %w", ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// awaitGrants lets the load run for d and checks that it granted in the
// last second of it.
func awaitGrants(ctx context.Context, g *newLeaderGrant, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d - time.Second):
	}
	before := g.grants.Load()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(time.Second):
	}
	if g.grants.Load() == before {
		return fmt.Errorf("no grant in the last second of %s on a whole cluster", d)
	}
	return nil
}
