package client

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"time"

	"connectrpc.com/connect"

	"github.com/fence-dev/fence"
	fencev1 "github.com/fence-dev/fence/api/fence/v1"
)

// EventKind says what happened to a lease.
type EventKind string

// The kinds of Event.
const (
	EventGranted  EventKind = "granted"  // a new lease began, with a new token
	EventRenewed  EventKind = "renewed"  // its holder renewed it; same token
	EventReleased EventKind = "released" // its holder released it
	EventExpired  EventKind = "expired"  // the service expired it
	EventLost     EventKind = "lost"     // a renewal was answered lost
	EventRejected EventKind = "rejected" // a guard refused a write with this stale token
	EventHeld     EventKind = "held"     // held when the watch began (WithHeld)
)

var eventKinds = map[fencev1.EventKind]EventKind{
	fencev1.EventKind_EVENT_KIND_GRANTED:  EventGranted,
	fencev1.EventKind_EVENT_KIND_RENEWED:  EventRenewed,
	fencev1.EventKind_EVENT_KIND_RELEASED: EventReleased,
	fencev1.EventKind_EVENT_KIND_EXPIRED:  EventExpired,
	fencev1.EventKind_EVENT_KIND_LOST:     EventLost,
	fencev1.EventKind_EVENT_KIND_REJECTED: EventRejected,
	fencev1.EventKind_EVENT_KIND_HELD:     EventHeld,
}

// Event is one lease event from Watch.
type Event struct {
	// Position orders the events; resume a watch after this event with
	// Position+1. It is 0 for EventHeld.
	Position uint64
	Kind     EventKind
	Scope    string
	// Token is the lease's fencing token; for EventRejected, the token the
	// guard refused.
	Token  uint64
	Holder string
	// LeaseFingerprint is the lease ID's fingerprint
	// (fence.LeaseID.Fingerprint): enough to tell leases apart, and to
	// find one's own with Lease.ID().Fingerprint(), but it reveals nothing
	// of the ID, which renews and releases the lease.
	LeaseFingerprint string
	TTL              time.Duration
	// Time is when the service recorded the event; for EventRejected,
	// when the guard refused the write; for EventHeld, when it was granted.
	Time time.Time
	// Current is, for EventLost, the scope's current token (0 if free) and,
	// for EventRejected, the highest token the guard had accepted.
	Current uint64
	// Guard names, for EventRejected, the guard that reported it.
	Guard string
	// Closing is, for EventReleased and EventExpired, the closing token:
	// a value the end of the lease consumed and granted to nobody, above
	// Token and below every later grant of the scope. A guard whose mark
	// is advanced to it refuses Token from then on (a follower,
	// guard/follow, does so). It is 0 when the end closed nothing: the service's log format
	// is below 8 (a member runs an older build), or Token was the maximum.
	Closing uint64
}

func eventFrom(e *fencev1.WatchEvent) Event {
	ev := Event{
		Position:         e.Position,
		Kind:             eventKinds[e.Kind],
		Scope:            e.Scope,
		Token:            e.Token,
		Holder:           e.Holder,
		LeaseFingerprint: e.LeaseIdPrefix, // the field's name predates fingerprints
		TTL:              e.Ttl.AsDuration(),
		Current:          e.CurrentToken,
		Guard:            e.Guard,
		Closing:          e.ClosingToken,
	}
	if ev.Kind == "" {
		ev.Kind = EventKind(fmt.Sprintf("unknown(%d)", e.Kind))
	}
	if e.Time != nil {
		ev.Time = e.Time.AsTime()
	}
	return ev
}

// WatchOption configures a watch.
type WatchOption interface{ applyWatch(*watchConfig) }

type watchConfig struct {
	held     bool
	progress func(next uint64)
}

type watchFunc func(*watchConfig)

func (f watchFunc) applyWatch(c *watchConfig) { f(c) }

// WithHeld makes a watch begin with an EventHeld for every lease held under
// its prefix when it starts, so the caller needs no separate List. A grant
// that happens as the watch starts may be reported twice: held, then
// granted, with the same token. The held leases come a thousand to a
// response; a connection lost before the last of them asks for them all
// again, so some may be reported held twice.
func WithHeld() WatchOption { return watchFunc(func(c *watchConfig) { c.held = true }) }

// WithProgress calls f after each response of the stream has been yielded,
// with the position that resumes the watch right after it: at least once
// for every connection as soon as the service has taken its start, events
// or none, and again every few thousand events of other scopes. A watcher
// learns from it that it has everything up to that point, and where to
// resume a later Watch (an event's Position+1 is the same place when the
// event ends a response). f runs on the goroutine ranging over the
// sequence, before the next event.
func WithProgress(f func(next uint64)) WatchOption {
	return watchFunc(func(c *watchConfig) { c.progress = f })
}

// Watch streams the lease events of the scopes starting with prefix (""
// for all), in the order the service's leader recorded them: grants,
// renewals, releases, expiries, renewals answered lost, and stale
// rejections that guards reported. So that no one holder or reporter
// crowds out the others' events, the leader records one renewal of a
// lease a quarter of its TTL at most, one loss a lease, and a stale
// token's rejection on a scope once, in a tenth of the events it keeps at
// most. from is where to begin: 0 for events from now on, or the Position
// of the last event handled plus one to resume an earlier watch.
//
// The sequence ends when the caller stops ranging over it, or with one
// final error: ctx's when ctx ends. Across a broken connection or a change of
// leader, Watch reconnects (to the next address, with backoff, within the
// client's retry timeout) and resumes where it was, so no event is skipped
// or repeated. If the service no longer retains the events to resume from
// (it keeps the most recent ten thousand, and a new leader starts afresh),
// the error matches fence.ErrMissedEvents: read the current state again
// (List, or WithHeld) and watch from now.
func (c *Client) Watch(ctx context.Context, prefix string, from uint64, opts ...WatchOption) iter.Seq2[Event, error] {
	var cfg watchConfig
	for _, o := range opts {
		o.applyWatch(&cfg)
	}
	return func(yield func(Event, error) bool) {
		err := c.watch(ctx, prefix, from, cfg.held, func(_ bool, resp *fencev1.WatchResponse) bool {
			for _, e := range resp.Events {
				if !yield(eventFrom(e), nil) {
					return false
				}
			}
			if cfg.progress != nil {
				cfg.progress(resp.NextPosition)
			}
			return true
		})
		if err != nil {
			yield(Event{}, err)
		}
	}
}

// watch runs a watch, reconnecting after transient failures and resuming
// at the last position received, and calls f with each response until f
// returns false (then watch returns nil) or a failure is final. first is
// true for the first response of a connection that asked for held leases.
func (c *Client) watch(ctx context.Context, prefix string, from uint64, held bool, f func(first bool, resp *fencev1.WatchResponse) bool) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	defer context.AfterFunc(c.life, func() { cancel(fmt.Errorf("%w: the watch ended with it", fence.ErrClosed)) })()
	pos := from
	var p pacer
	give := time.Now().Add(c.cfg.retryTimeout)
	for {
		i := c.cur.Load()
		stream, err := c.nodes[i].shared.lease.Watch(ctx, connect.NewRequest(&fencev1.WatchRequest{Prefix: prefix, StartPosition: pos, IncludeHeld: held}))
		if err == nil {
			first := held
			for stream.Receive() {
				// A connection that answers starts the retry budget afresh.
				p, give = pacer{}, time.Now().Add(c.cfg.retryTimeout)
				resp := stream.Msg()
				if !f(first, resp) {
					stream.Close()
					return nil
				}
				// A connection broken among the held pages asks for
				// them again: they resume at the start position.
				first, held = false, resp.MoreHeld
				pos = resp.NextPosition
			}
			err = stream.Err()
			stream.Close()
		}
		refused := false
		if err == nil {
			// The service ended the stream without an error, which it
			// does not do: treat it as a broken connection.
			err = fmt.Errorf("%w: the watch stream ended", fence.ErrUnavailable)
		} else {
			refused, err = refusedConn(err), transient(ctx, err)
		}
		if ctx.Err() != nil {
			return fmt.Errorf("watch %q: %w", prefix, context.Cause(ctx))
		}
		if !errors.Is(err, fence.ErrUnavailable) {
			return fmt.Errorf("watch %q: %w", prefix, err)
		}
		c.cur.CompareAndSwap(i, (i+1)%int32(len(c.nodes)))
		if !p.pause(ctx, give, refused, len(c.nodes)) {
			if ctx.Err() != nil {
				return fmt.Errorf("watch %q: %w", prefix, context.Cause(ctx))
			}
			return fmt.Errorf("watch %q: %w", prefix, err)
		}
	}
}
