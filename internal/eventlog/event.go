// Package eventlog is what the leader remembers of recent lease events, for
// people and watchers: the events themselves, numbered by term in a
// bounded ring that watches read and resume from, and the stale writes that
// guards report. It is in memory only and knows nothing of RPCs.
package eventlog

import (
	"strings"
	"time"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/internal/fsm"
)

// Kind names a lease event as fenced shows it: in metrics, the watch
// stream and the status page. Unlike fsm.EventKind it includes what happens
// off the log: renewals, renewals answered lost, and stale rejections
// reported by guards.
type Kind uint8

const (
	Granted  Kind = iota + 1 // a new lease began
	Renewed                  // its holder renewed it (off the log); the ring keeps some only
	Released                 // its holder released it
	Expired                  // the leader expired it
	Lost                     // a renewal was answered lost; the ring keeps one a lease
	Rejected                 // a guard refused a write with a stale token; the ring keeps some only
)

var kindNames = [...]string{"", "granted", "renewed", "released", "expired", "lost", "rejected"}

// Class is the kind's CSS class on the status page.
func (k Kind) Class() string { return "k-" + strings.ReplaceAll(k.String(), " ", "-") }

func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return "unknown"
}

// Event is one lease event. Position is assigned when the leader
// records it in its event ring.
type Event struct {
	Position uint64
	Kind     Kind
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
	// Closing is, for released and expired from log format 8 on, the
	// token value the end consumed, granted to nobody (fsm.Event.Closing).
	Closing uint64
}

// FromFSM converts an applied transition; cancelled waiters are not lease
// events and give ok == false.
func FromFSM(e fsm.Event, at time.Time) (Event, bool) {
	var k Kind
	switch e.Kind {
	case fsm.EventGranted:
		k = Granted
	case fsm.EventReleased:
		k = Released
	case fsm.EventExpired:
		k = Expired
	default:
		return Event{}, false
	}
	return Event{Kind: k, Scope: e.Scope, Token: e.Lease.Token, Holder: e.Lease.Holder,
		LeaseID: e.Lease.ID, TTL: e.Lease.TTL, At: at, Closing: e.Closing}, true
}
