package client

import (
	"context"
	"fmt"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/fence-dev/fence"
	fencev1 "github.com/fence-dev/fence/api/fence/v1"
	"github.com/fence-dev/fence/internal/wire"
)

// MaxRenewBatch is the most renewals one RenewBatch call may carry.
const MaxRenewBatch = 1000

// Renewal names one lease to renew in RenewBatch.
type Renewal struct {
	Scope string
	ID    fence.LeaseID
}

// RenewResult is one lease's answer in RenewBatch: its time left, a full
// TTL from when the service renewed it, or the error Renew would have
// returned for it. The lease's token does not change.
type RenewResult struct {
	ExpiresIn time.Duration
	Err       error
}

// RenewBatch renews up to MaxRenewBatch leases in one call, each on its
// own: a lease that is no longer current gets its own error, as from Renew,
// and the others are renewed all the same. The results are in the order of
// rs; a scope the caller may not renew is refused in its own result. The
// error is for the call as a whole (bad input, no leader, no credentials),
// and then nothing was renewed.
func (c *Client) RenewBatch(ctx context.Context, rs []Renewal) ([]RenewResult, error) {
	if len(rs) == 0 {
		return nil, nil
	}
	req := &fencev1.RenewBatchRequest{Renewals: make([]*fencev1.RenewRequest, len(rs))}
	for i, r := range rs {
		req.Renewals[i] = &fencev1.RenewRequest{Scope: r.Scope, LeaseId: r.ID.String()}
	}
	resp, err := retry(ctx, c, func(actx context.Context, s *service) (*connect.Response[fencev1.RenewBatchResponse], error) {
		return s.lease.RenewBatch(actx, connect.NewRequest(req))
	})
	if err != nil {
		return nil, fmt.Errorf("renew %d leases: %w", len(rs), err)
	}
	if len(resp.Msg.Results) != len(rs) {
		return nil, fmt.Errorf("renew %d leases: %w: the service answered %d results", len(rs), fence.ErrUnavailable, len(resp.Msg.Results))
	}
	out := make([]RenewResult, len(rs))
	for i, r := range resp.Msg.Results {
		if r.Failure != nil {
			out[i].Err = fmt.Errorf("renew %q: %w", rs[i].Scope, wire.FromFailure(r.Failure))
			continue
		}
		out[i].ExpiresIn = r.ExpiresIn.AsDuration()
	}
	return out, nil
}

// renewer sends the keep-alive renewals of a client's leases together:
// while one RenewBatch call is out, the renewals that come due queue up and
// go in the next one. A process holding thousands of leases, or all of them
// renewing at once after a failover, makes a few calls instead of one each.
type renewer struct {
	c       *Client
	mu      sync.Mutex
	queue   []*queuedRenewal
	running bool
}

type queuedRenewal struct {
	Renewal
	ctx  context.Context
	done chan error
}

// renew renews one lease through the next batch, giving up when ctx ends.
func (b *renewer) renew(ctx context.Context, r Renewal) error {
	q := &queuedRenewal{Renewal: r, ctx: ctx, done: make(chan error, 1)}
	b.mu.Lock()
	b.queue = append(b.queue, q)
	start := !b.running
	b.running = true
	b.mu.Unlock()
	if start {
		go b.run()
	}
	select {
	case err := <-q.done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("renew %q: %w", r.Scope, ctx.Err())
	}
}

// run sends batches until the queue is empty.
func (b *renewer) run() {
	for {
		b.mu.Lock()
		n := min(len(b.queue), MaxRenewBatch)
		if n == 0 {
			b.running = false
			b.mu.Unlock()
			return
		}
		batch := b.queue[:n:n]
		b.queue = b.queue[n:]
		b.mu.Unlock()
		b.send(batch)
	}
}

// send makes one call for batch. The call lasts until the latest of its
// renewals' deadlines, and is cancelled once every one of them gave up.
func (b *renewer) send(batch []*queuedRenewal) {
	rs := make([]Renewal, len(batch))
	ctxs := make([]context.Context, len(batch))
	for i, q := range batch {
		rs[i], ctxs[i] = q.Renewal, q.ctx
	}
	ctx, stop := sharedContext(ctxs)
	defer stop()
	results, err := b.c.RenewBatch(ctx, rs)
	for i, q := range batch {
		if err != nil {
			q.done <- err
		} else {
			q.done <- results[i].Err
		}
	}
}
