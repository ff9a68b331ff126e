package client

import (
	"context"
	"errors"
	"math/rand/v2"
	"syscall"
	"time"
)

// How a call paces its attempts while the service is unavailable:
// exponential backoff with full jitter, from minPause doubling up to
// maxPause. A failover leaves no leader for about the election timeout (1 s
// by default), and the calls that wait for the new one find it at their
// next attempt: with pauses of up to a second they found it a third of a
// second late on average, where etcd's client, which tries every 25 ms,
// found its new leader at once (BENCHMARKS.md, "A three-node cluster").
// A tenth of a second keeps that wait a few tens of milliseconds, for at
// most about twenty attempts a second by each call under way, each
// answered by a refused connection or by a follower's "no leader", which
// cost the nodes little.
const (
	minPause = 20 * time.Millisecond
	maxPause = 100 * time.Millisecond
)

// pacer spaces the attempts of one call (or one watch's connections).
// A node that refused the connection is down, or not yet listening: it
// took no time to say so and says nothing about the others, so the next
// node is tried at once, but once around the list at most between two
// pauses, so that a service with every node down is not hammered. The zero
// value is ready to use; it is not safe for concurrent use.
type pacer struct {
	backoff time.Duration
	skipped int // refused nodes passed over at once since the last pause
}

// next returns how long to wait after a failed attempt, before trying the
// next of nodes; refused says the node refused the connection.
func (p *pacer) next(refused bool, nodes int) time.Duration {
	if refused && p.skipped < nodes-1 {
		p.skipped++
		return 0
	}
	p.skipped = 0
	p.backoff = min(max(2*p.backoff, minPause), maxPause)
	return rand.N(p.backoff) + time.Millisecond
}

// pause waits before the next attempt as next says, and reports true, or
// reports false at once if the wait would end after until, the call's
// retry budget, and as soon as ctx ends.
func (p *pacer) pause(ctx context.Context, until time.Time, refused bool, nodes int) bool {
	d := p.next(refused, nodes)
	switch {
	case time.Now().Add(d).After(until):
		return false
	case d == 0:
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// refusedConn reports whether err says that the node refused the
// connection: nothing was sent, no process listens there.
func refusedConn(err error) bool { return errors.Is(err, syscall.ECONNREFUSED) }
