package client

import (
	"context"
	"fmt"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	fencev1 "github.com/fence-dev/fence/api/fence/v1"
)

// Rejection is a write that a guard refused as stale.
type Rejection struct {
	Scope     string
	Presented uint64    // the token the write presented
	Highest   uint64    // the highest token the guard had accepted
	Time      time.Time // when the guard refused it; zero: when reported
}

// MaxReport is the most rejections one ReportRejections call may carry.
const MaxReport = 1000

// ReportRejections tells the service about writes that the guard named
// guard refused as stale, and how many more it dropped without reporting,
// so that the service's status page, metrics and watchers show which
// holders kept writing after losing their lease. Most guards use the
// guardreport package, which batches and sends in the background.
func (c *Client) ReportRejections(ctx context.Context, guard string, rs []Rejection, dropped uint64) error {
	req := &fencev1.ReportRejectionsRequest{Guard: guard, Dropped: dropped}
	for _, r := range rs {
		p := &fencev1.Rejection{Scope: r.Scope, PresentedToken: r.Presented, HighestToken: r.Highest}
		if !r.Time.IsZero() {
			p.Time = timestamppb.New(r.Time)
		}
		req.Rejections = append(req.Rejections, p)
	}
	_, err := retry(ctx, c, func(actx context.Context, s *service) (*connect.Response[fencev1.ReportRejectionsResponse], error) {
		return s.lease.ReportRejections(actx, connect.NewRequest(req))
	})
	if err != nil {
		return fmt.Errorf("report rejections: %w", err)
	}
	return nil
}
