package server

import (
	"context"
	"log/slog"
	"time"

	"github.com/fence-dev/fence/internal/eventlog"
	"github.com/fence-dev/fence/internal/fsm"
	"github.com/fence-dev/fence/internal/lessor"
)

// publish records an event that happened while this node is the serving
// leader: it is counted and, with a position, offered to watchers.
func (s *Server) publish(e eventlog.Event) {
	s.metrics.event(e)
	s.events.Append(s.node.Term(), e)
}

// renewedEvent is the event of a confirmed renewal.
func renewedEvent(scope string, l fsm.Lease, at time.Time) eventlog.Event {
	return eventlog.Event{Kind: eventlog.Renewed, Scope: scope, Token: l.Token, Holder: l.Holder, LeaseID: l.ID, TTL: l.TTL, At: at}
}

// renewRefused publishes a renewal answered lost; other refusals (an
// unknown lease ID) are not lease events. A lease no longer in the state
// has no holder in r: the event ring finds it, if it records the loss.
func (s *Server) renewRefused(r fsm.Result) {
	if r.Outcome != fsm.Lost {
		return
	}
	s.publish(eventlog.Event{Kind: eventlog.Lost, Scope: r.Scope, Token: r.Lease.Token, Holder: r.Lease.Holder, LeaseID: r.Lease.ID, At: time.Now(), Current: r.Current})
}

// confirmed records the renewals of decided (of the leases asked) that
// were granted, once confirmed to their holders: logged at debug level,
// counted, and offered to watchers, the event ring's lock taken once for
// them all.
func (s *Server) confirmed(ctx context.Context, asked []lessor.Renewal, decided []lessor.Renewed) {
	at := time.Now()
	events := func(yield func(eventlog.Event) bool) {
		for j, r := range decided {
			if r.Outcome == fsm.Granted && !yield(renewedEvent(asked[j].Scope, r.Lease, at)) {
				return
			}
		}
	}
	if s.log.Enabled(ctx, slog.LevelDebug) {
		for e := range events {
			s.log.LogAttrs(ctx, slog.LevelDebug, "lease renewed",
				slog.String("scope", e.Scope), slog.Uint64("token", e.Token),
				slog.String("lease", e.LeaseID.Fingerprint()), slog.String("holder", e.Holder), slog.Duration("ttl", e.TTL))
		}
	}
	s.events.AppendAll(s.node.Term(), func(yield func(eventlog.Event) bool) {
		for e := range events {
			s.metrics.event(e)
			if !yield(e) {
				return
			}
		}
	})
}
