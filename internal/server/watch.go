package server

import (
	"context"
	"errors"
	"fmt"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/fence-dev/fence"
	fencev1 "github.com/fence-dev/fence/api/fence/v1"
	"github.com/fence-dev/fence/internal/eventlog"
	"github.com/fence-dev/fence/internal/fsm"
	"github.com/fence-dev/fence/internal/wire"
)

// watchBatch bounds the events of one watch response.
const watchBatch = 256

// watchHeldPage bounds the held leases of one watch response, and how many
// are copied out of the state at a time: a watch of a million held leases
// sends them a thousand at a time instead of in one message.
const watchHeldPage = 1000

// watchProgress is how far a watch's position may move on without being
// sent, when no event matches its prefix: a watcher that reconnects must
// still find its position in the ring.
const watchProgress = eventlog.RingSize / 4

// errSteppedDown ends a watch when this node stops leading; the watcher
// reconnects and is forwarded to the new leader.
var errSteppedDown = fmt.Errorf("%w: the leader changed; watch again from the last position read", fence.ErrUnavailable)

// Watch implements fence.v1.LeaseService.Watch.
func (s *Server) Watch(ctx context.Context, req *connect.Request[fencev1.WatchRequest], stream *connect.ServerStream[fencev1.WatchResponse]) error {
	m := req.Msg
	if err := fence.ValidatePrefix(m.Prefix); err != nil {
		return wire.ToConnect(err)
	}
	if err := s.checkReady(); err != nil {
		return wire.ToConnect(err)
	}
	gen := s.leaderGeneration()
	term := s.node.Term()
	from := m.StartPosition
	if from == 0 {
		from = s.events.Position(term)
	} else if err := s.events.Start(from, term); err != nil {
		return wire.ToConnect(err)
	}
	first := &fencev1.WatchResponse{}
	if m.IncludeHeld {
		// After taking the position, so that nothing granted in between
		// is missed (it may be sent twice: held, then granted). Every page
		// but the last goes out alone, resuming at the start position; a
		// lease released between pages is missed by no one either: its
		// release comes after that position.
		after := ""
		for {
			var held []fsm.ScopeInfo
			s.node.Read(func(st *fsm.State) { held = st.Held(m.Prefix, after, watchHeldPage+1) })
			more := len(held) > watchHeldPage
			if more {
				held = held[:watchHeldPage]
			}
			for _, in := range held {
				first.Events = append(first.Events, heldEvent(in))
			}
			if !more {
				break
			}
			first.NextPosition, first.MoreHeld = from, true
			if err := stream.Send(first); err != nil {
				return err
			}
			after = held[len(held)-1].Scope
			first = &fencev1.WatchResponse{}
		}
	}
	events, next, changed, err := s.events.Read(from, m.Prefix, watchBatch)
	if err != nil {
		return wire.ToConnect(err)
	}
	for _, e := range events {
		first.Events = append(first.Events, watchEvent(e))
	}
	first.NextPosition = next
	if err := stream.Send(first); err != nil {
		return err
	}
	sent := next
	for {
		select {
		case <-changed:
		case <-gen:
			return wire.ToConnect(errSteppedDown)
		case <-ctx.Done():
			return wire.ToConnect(ctx.Err())
		}
		events, next, changed, err = s.events.Read(next, m.Prefix, watchBatch)
		if err != nil {
			if errors.Is(err, fence.ErrMissedEvents) {
				err = fmt.Errorf("this watch fell behind: %w", err)
			}
			return wire.ToConnect(err)
		}
		if len(events) == 0 && next-sent < watchProgress {
			continue
		}
		resp := &fencev1.WatchResponse{NextPosition: next}
		for _, e := range events {
			resp.Events = append(resp.Events, watchEvent(e))
		}
		if err := stream.Send(resp); err != nil {
			return err
		}
		sent = next
	}
}

var wireKinds = [...]fencev1.EventKind{
	eventlog.Granted:  fencev1.EventKind_EVENT_KIND_GRANTED,
	eventlog.Renewed:  fencev1.EventKind_EVENT_KIND_RENEWED,
	eventlog.Released: fencev1.EventKind_EVENT_KIND_RELEASED,
	eventlog.Expired:  fencev1.EventKind_EVENT_KIND_EXPIRED,
	eventlog.Lost:     fencev1.EventKind_EVENT_KIND_LOST,
	eventlog.Rejected: fencev1.EventKind_EVENT_KIND_REJECTED,
}

func watchEvent(e eventlog.Event) *fencev1.WatchEvent {
	w := &fencev1.WatchEvent{
		Position:      e.Position,
		Kind:          wireKinds[e.Kind],
		Scope:         e.Scope,
		Token:         e.Token,
		Holder:        e.Holder,
		LeaseIdPrefix: e.LeaseID.Fingerprint(),
		Time:          timestamppb.New(e.At),
		CurrentToken:  e.Current,
		Guard:         e.Guard,
		ClosingToken:  e.Closing,
	}
	if e.TTL > 0 {
		w.Ttl = durationpb.New(e.TTL)
	}
	return w
}

func heldEvent(in fsm.ScopeInfo) *fencev1.WatchEvent {
	l := in.Lease
	w := &fencev1.WatchEvent{
		Kind:          fencev1.EventKind_EVENT_KIND_HELD,
		Scope:         in.Scope,
		Token:         l.Token,
		Holder:        l.Holder,
		LeaseIdPrefix: l.ID.Fingerprint(),
		Ttl:           durationpb.New(l.TTL),
	}
	if l.GrantedAt != 0 {
		w.Time = timestamppb.New(time.Unix(0, l.GrantedAt))
	}
	return w
}
