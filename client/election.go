package client

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"sync"

	"github.com/fence-dev/fence"
	fencev1 "github.com/fence-dev/fence/api/fence/v1"
)

// Election elects one leader among the processes that campaign on the same
// scope, in the manner of etcd's concurrency.Election: the leader is the
// holder of the scope's lease, candidates wait in line for it, and the
// lease's fencing token tells every leadership apart, so the resources a
// leader writes to can refuse a deposed leader's writes. An Election is
// safe for concurrent use; one Election campaigns for one leadership at a
// time.
type Election struct {
	c     *Client
	scope string

	mu    sync.Mutex
	lease *Lease // held by this Election's campaign, until resigned
}

// Leader is who leads an election: the holder name its leader campaigned
// with and its lease's token. The zero Leader means the office is vacant.
type Leader struct {
	Holder string
	Token  uint64
}

// NewElection returns an election on scope.
func NewElection(c *Client, scope string) *Election {
	return &Election{c: c, scope: scope}
}

// Campaign waits in line until this process leads, then returns its lease,
// held under the name value. Leadership lasts until Resign, or until the
// lease is lost: watch its Done and stop leading when it closes. Send the
// lease's token with every write a leader makes. Campaign gives up when
// ctx ends. The options are those of Acquire (WithTTL, WithDriftMargin).
func (e *Election) Campaign(ctx context.Context, value string, opts ...AcquireOption) (*Lease, error) {
	opts = append(opts, WithHolder(value), WithWait())
	l, err := e.c.Acquire(ctx, e.scope, opts...)
	if err != nil {
		return nil, fmt.Errorf("campaign: %w", err)
	}
	e.mu.Lock()
	e.lease = l
	e.mu.Unlock()
	return l, nil
}

// Resign gives up leadership won by Campaign, releasing its lease so the
// next candidate in line leads. Resigning without leading does nothing.
func (e *Election) Resign(ctx context.Context) error {
	e.mu.Lock()
	l := e.lease
	e.lease = nil
	e.mu.Unlock()
	if l == nil {
		return nil
	}
	if err := l.Release(ctx); err != nil && !errors.Is(err, fence.ErrLeaseLost) {
		return fmt.Errorf("resign: %w", err)
	}
	return nil
}

// Leader reports who leads now; the zero Leader if nobody does.
func (e *Election) Leader(ctx context.Context) (Leader, error) {
	st, err := e.c.Get(ctx, e.scope)
	if err != nil || st.Lease == nil {
		return Leader{}, err
	}
	return Leader{Holder: st.Lease.Holder, Token: st.Lease.Token}, nil
}

// Observe yields the leader whenever it changes: first the current one,
// then each new one, and the zero Leader when the office falls vacant (a
// leader resigned, or its lease expired). While nobody leads at the start,
// the first value comes with the first leader. Consecutive values always
// differ. Observe follows the scope's events with Watch; if it falls so
// far behind that events are gone, it reads the current leader again and
// carries on, so it may skip leaders that came and went meanwhile but
// always catches up with the latest. The sequence ends when the caller
// stops ranging over it, or with one final error: ctx's when ctx ends.
func (e *Election) Observe(ctx context.Context) iter.Seq2[Leader, error] {
	return func(yield func(Leader, error) bool) {
		var last Leader
		stopped := false
		emit := func(l Leader) bool {
			if l == last {
				return true
			}
			last = l
			if !yield(l, nil) {
				stopped = true
				return false
			}
			return true
		}
		for {
			err := e.c.watch(ctx, e.scope, 0, true, func(first bool, resp *fencev1.WatchResponse) bool {
				now := last
				if first {
					// The held leases as the watch starts: the scope is
					// led only if it is among them.
					now = Leader{}
				}
				for _, ev := range resp.Events {
					if ev.Scope != e.scope { // the prefix also matches scope/...
						continue
					}
					switch eventKinds[ev.Kind] {
					case EventHeld, EventGranted:
						now = Leader{Holder: ev.Holder, Token: ev.Token}
					case EventReleased, EventExpired:
						if ev.Token == now.Token {
							now = Leader{}
						}
					}
					if !first && !emit(now) {
						return false
					}
				}
				return !first || emit(now)
			})
			if stopped {
				return
			}
			if errors.Is(err, fence.ErrMissedEvents) {
				continue // start again from the current state
			}
			yield(Leader{}, fmt.Errorf("observe: %w", err))
			return
		}
	}
}
