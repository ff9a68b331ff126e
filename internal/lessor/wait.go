package lessor

import (
	"context"
	"fmt"
	"time"

	"github.com/fence-dev/fence/internal/fsm"
)

// wait is the life of a waiting acquire.
func (l *Lessor) wait(ctx context.Context, c fsm.Command) (fsm.Result, error) {
	// Listen before proposing: the grant may be applied before Apply
	// returns to us.
	key := waitKey(c.Scope, fsm.Lease{ID: c.LeaseID, RequestID: c.RequestID})
	grant, err := l.waiters.add(ctx, key)
	if err != nil {
		return fsm.Result{}, fmt.Errorf("acquire %q: %w", c.Scope, err)
	}
	defer l.waiters.remove(key, grant)
	r, err := l.carry(ctx, c)
	if err != nil {
		return r, err
	}
	if r.Outcome == fsm.Queued {
		// The office that answered it queued: its line is this office's,
		// and no longer than it lasts. With none, the next office's
		// promote drops it.
		o := l.office.Load()
		if o == nil {
			return fsm.Result{}, leaderChanged(c.Scope)
		}
		done := func(bool) {}
		if l.cfg.Queued != nil {
			done = l.cfg.Queued()
		}
		r, err = l.inLine(ctx, key, r, grant, o)
		done(err == nil)
	}
	if r.Outcome == fsm.Granted {
		l.waiters.answered(key)
	}
	return r, err
}

// carry brings a waiting acquire into an entry and returns its result
// there: parked until an entry carries it (see joins), or proposed now.
func (l *Lessor) carry(ctx context.Context, c fsm.Command) (fsm.Result, error) {
	j, now := l.joins.park(l.node, c, time.Now())
	if j == nil {
		return l.proposeOne(ctx, c)
	}
	if now {
		// Its scope is free: propose now, carrying it behind whatever
		// parked before it. If this entry fails, j is answered with its
		// error; if another entry took j first, that one answers it.
		l.propose(ctx, nil)
	}
	select {
	case a := <-j.done:
		return a.r, a.err
	case <-ctx.Done():
	}
	if l.joins.unpark(j) {
		return fsm.Result{}, fmt.Errorf("wait for %q: %w", c.Scope, ctx.Err())
	}
	// An entry carries it: its answer is on its way, and a place in line
	// is withdrawn as any other.
	a := <-j.done
	return a.r, a.err
}

// flushLoop proposes the parked acquires that must not wait for another
// entry to carry them, until ctx is done.
func (l *Lessor) flushLoop(ctx context.Context) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-l.joins.kick:
		case <-timer.C:
		}
		due, next := l.joins.due(l.node, time.Now())
		if due {
			// The acquires it fails are answered with its error.
			if _, err := l.propose(ctx, nil); err != nil && ctx.Err() == nil {
				l.cfg.Logger.Warn("proposing waiting acquires failed", "err", err)
			}
			next = time.Now() // look again at once
		}
		if next.IsZero() {
			next = time.Now().Add(time.Hour) // nothing parked: a park wakes it
		}
		timer.Reset(time.Until(next))
	}
}

// inLine waits in the state machine's line until the queued acquire is
// granted, the office o ends or the line is dropped (a promote), both
// answered "leader changed", or its caller gives up, in which case it
// withdraws from the line, unless another attempt with the same request ID
// uses that place or its grant.
func (l *Lessor) inLine(ctx context.Context, key string, queued fsm.Result, grant chan fsm.Event, o *office) (fsm.Result, error) {
	granted := func(e fsm.Event) (fsm.Result, error) {
		if e.Kind == fsm.EventGranted {
			return fsm.Result{Outcome: fsm.Granted, Scope: e.Scope, Lease: e.Lease}, nil
		}
		return fsm.Result{}, leaderChanged(queued.Scope)
	}
	select {
	case e := <-grant:
		return granted(e)
	case <-o.left:
		// A grant that came with the end of the office is still one.
		select {
		case e := <-grant:
			return granted(e)
		default:
		}
		// Not withdrawn: a deposed leader cannot, and the next
		// leader's promote drops the line; a retry with the same
		// request ID finds this place if the line outlived the office.
		return fsm.Result{}, leaderChanged(queued.Scope)
	case <-ctx.Done():
	}
	if !l.waiters.abandon(key) {
		return fsm.Result{}, fmt.Errorf("wait for %q: %w", queued.Scope, ctx.Err())
	}
	defer l.waiters.withdrawn(key)
	cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := l.submit(cctx, fsm.Command{Op: fsm.OpCancel, Scope: queued.Scope, LeaseID: queued.Lease.ID, At: time.Now().UnixNano()})
	if err != nil {
		l.cfg.Logger.Warn("withdrawing a waiter failed", "scope", queued.Scope, "lease", queued.Lease.ID.Fingerprint(), "err", err)
	}
	return fsm.Result{}, fmt.Errorf("wait for %q: %w", queued.Scope, ctx.Err())
}
