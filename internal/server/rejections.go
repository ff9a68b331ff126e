package server

import (
	"context"
	"fmt"
	"time"
	"unicode/utf8"

	"connectrpc.com/connect"

	"github.com/fence-dev/fence"
	fencev1 "github.com/fence-dev/fence/api/fence/v1"
	"github.com/fence-dev/fence/internal/eventlog"
	"github.com/fence-dev/fence/internal/wire"
)

const (
	// maxReport bounds the rejections of one ReportRejections request.
	maxReport = 1000
	// maxGuardName bounds a guard's name, in bytes.
	maxGuardName = 128
)

// ReportRejections implements fence.v1.LeaseService.ReportRejections.
func (s *Server) ReportRejections(ctx context.Context, req *connect.Request[fencev1.ReportRejectionsRequest]) (*connect.Response[fencev1.ReportRejectionsResponse], error) {
	m := req.Msg
	switch {
	case m.Guard == "" || len(m.Guard) > maxGuardName || !utf8.ValidString(m.Guard):
		return nil, wire.ToConnect(&fence.InvalidError{Field: "guard", Reason: fmt.Sprintf("want 1 to %d bytes of UTF-8, got %d bytes", maxGuardName, len(m.Guard))})
	case len(m.Rejections) > maxReport:
		return nil, wire.ToConnect(&fence.InvalidError{Field: "rejections", Reason: fmt.Sprintf("%d in one report, at most %d allowed", len(m.Rejections), maxReport)})
	}
	for i, r := range m.Rejections {
		if err := fence.ValidateScope(r.Scope); err != nil {
			return nil, wire.ToConnect(fmt.Errorf("rejection %d: %w", i, err))
		}
		if r.PresentedToken == 0 || r.PresentedToken > fence.MaxToken || r.HighestToken < r.PresentedToken || r.HighestToken > fence.MaxToken {
			return nil, wire.ToConnect(&fence.InvalidError{Field: fmt.Sprintf("rejections[%d]", i),
				Reason: fmt.Sprintf("presented token %d and highest token %d: want 1 ≤ presented ≤ highest ≤ %d", r.PresentedToken, r.HighestToken, uint64(fence.MaxToken))})
		}
	}
	if err := s.checkReady(); err != nil {
		return nil, wire.ToConnect(err)
	}
	now := time.Now()
	for _, r := range m.Rejections {
		at := now
		if r.Time != nil {
			at = r.Time.AsTime()
		}
		rj := eventlog.Rejection{Guard: m.Guard, Scope: r.Scope, Presented: r.PresentedToken, Highest: r.HighestToken,
			Holder: s.events.Holder(r.Scope, r.PresentedToken), At: at}
		s.rejected.Add(rj)
		s.metrics.rejected(rj)
		s.publish(eventlog.Event{Kind: eventlog.Rejected, Scope: rj.Scope, Token: rj.Presented, Holder: rj.Holder, At: at, Current: rj.Highest, Guard: rj.Guard})
	}
	if m.Dropped > 0 {
		s.rejected.AddDropped(m.Dropped)
		s.metrics.rejectionsDropped.Add(float64(m.Dropped))
	}
	return connect.NewResponse(&fencev1.ReportRejectionsResponse{}), nil
}
