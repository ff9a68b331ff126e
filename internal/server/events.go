package server

import (
	"time"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/internal/fsm"
)

// eventKind names a lease event as fenced shows it: in metrics, the watch
// stream and the status page. Unlike fsm.EventKind it includes what happens
// off the log: renewals, renewals answered lost, and stale rejections
// reported by guards.
type eventKind uint8

const (
	kindGranted  eventKind = iota + 1 // a new lease began
	kindRenewed                       // its holder renewed it (off the log)
	kindReleased                      // its holder released it
	kindExpired                       // the leader expired it
	kindLost                          // a renewal was answered lost
	kindRejected                      // a guard refused a write with a stale token
)

var kindNames = [...]string{"", "granted", "renewed", "released", "expired", "lost", "rejected"}

func (k eventKind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return "unknown"
}

// leaseEvent is one lease event. Position is assigned when the leader
// records it in its event ring.
type leaseEvent struct {
	Position uint64
	Kind     eventKind
	Scope    string
	Token    uint64
	Holder   string
	LeaseID  fence.LeaseID // zero for rejections
	TTL      time.Duration
	At       time.Time
	// Current is, for lost, the scope's current token (0 if free) and, for
	// rejected, the highest token the guard had accepted.
	Current uint64
	Guard   string // for rejected: the guard that reported it
}

// fromFSM converts an applied transition; cancelled waiters are not lease
// events and give ok == false.
func fromFSM(e fsm.Event, at time.Time) (leaseEvent, bool) {
	var k eventKind
	switch e.Kind {
	case fsm.EventGranted:
		k = kindGranted
	case fsm.EventReleased:
		k = kindReleased
	case fsm.EventExpired:
		k = kindExpired
	default:
		return leaseEvent{}, false
	}
	return leaseEvent{Kind: k, Scope: e.Scope, Token: e.Lease.Token, Holder: e.Lease.Holder,
		LeaseID: e.Lease.ID, TTL: e.Lease.TTL, At: at}, true
}

// publish records an event that happened while this node is the serving
// leader: it is counted and, with a position, offered to watchers.
func (s *Server) publish(e leaseEvent) {
	s.metrics.event(e)
	s.events.append(s.node.Term(), e)
}

// renewed publishes a confirmed renewal.
func (s *Server) renewed(scope string, l fsm.Lease) {
	s.publish(leaseEvent{Kind: kindRenewed, Scope: scope, Token: l.Token, Holder: l.Holder, LeaseID: l.ID, TTL: l.TTL, At: time.Now()})
}

// renewRefused publishes a renewal answered lost; other refusals (an
// unknown lease ID) are not lease events.
func (s *Server) renewRefused(r fsm.Result) {
	if r.Outcome != fsm.Lost {
		return
	}
	holder := r.Lease.Holder
	if holder == "" {
		holder = s.events.holder(r.Scope, r.Lease.Token)
	}
	s.publish(leaseEvent{Kind: kindLost, Scope: r.Scope, Token: r.Lease.Token, Holder: holder, LeaseID: r.Lease.ID, At: time.Now(), Current: r.Current})
}
