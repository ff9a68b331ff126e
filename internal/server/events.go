package server

import (
	"time"

	"github.com/fence-dev/fence/internal/eventlog"
	"github.com/fence-dev/fence/internal/fsm"
)

// publish records an event that happened while this node is the serving
// leader: it is counted and, with a position, offered to watchers.
func (s *Server) publish(e eventlog.Event) {
	s.metrics.event(e)
	s.events.Append(s.node.Term(), e)
}

// renewed publishes a confirmed renewal.
func (s *Server) renewed(scope string, l fsm.Lease) {
	s.publish(eventlog.Event{Kind: eventlog.Renewed, Scope: scope, Token: l.Token, Holder: l.Holder, LeaseID: l.ID, TTL: l.TTL, At: time.Now()})
}

// renewRefused publishes a renewal answered lost; other refusals (an
// unknown lease ID) are not lease events.
func (s *Server) renewRefused(r fsm.Result) {
	if r.Outcome != fsm.Lost {
		return
	}
	holder := r.Lease.Holder
	if holder == "" {
		holder = s.events.Holder(r.Scope, r.Lease.Token)
	}
	s.publish(eventlog.Event{Kind: eventlog.Lost, Scope: r.Scope, Token: r.Lease.Token, Holder: holder, LeaseID: r.Lease.ID, At: time.Now(), Current: r.Current})
}
