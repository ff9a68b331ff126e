package client

import (
	"context"
	"fmt"
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
