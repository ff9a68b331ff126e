package client

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/fence-dev/fence"
	fencev1 "github.com/fence-dev/fence/api/fence/v1"
)

// Lease is a held lease that keeps itself alive. It renews in the
// background at about a third of its TTL and reports itself lost, closing
// Done and cancelling Context, as soon as it can no longer be sure it holds
// the scope:
//   - the service answers that it is not the current lease;
//   - its local validity runs out: the send time of its last confirmed
//     renewal plus the TTL, minus the drift margin, on this process's
//     monotonic clock, passes without a newer confirmation;
//   - the holder calls MarkLost, for example after a guard rejected its
//     token as stale;
//   - it is released, or its Client is closed.
//
// A lost lease stays lost; acquire a new one to start a new epoch. A Lease
// is safe for concurrent use.
type Lease struct {
	c      *Client
	info   fence.Lease
	margin time.Duration

	ctx    context.Context
	cancel context.CancelCauseFunc
	stop   chan struct{} // closed when the lease is lost
	exited chan struct{} // closed when keepAlive has stopped renewing

	mu         sync.Mutex
	token      fence.Token // the token as last signed: renewals re-sign it with the current key
	validUntil time.Time   // local validity, monotonic
	err        error
	// renewal is the keep-alive's latest renewal: lose drops it if it
	// is still queued, and a release waits for it if it was sent.
	renewal *call[*fencev1.RenewRequest, fence.Lease]
}

// Acquire acquires a lease on scope and keeps it alive until it is released
// or lost. A held scope gives a *fence.HeldError unless WithWait is given.
// Transient failures are retried with the same request ID, so one Acquire
// never takes two tokens.
//
// Acquire on a closed Client fails with fence.ErrClosed, and so does an
// Acquire that Close overtakes: then the grant it obtained is released.
func (c *Client) Acquire(ctx context.Context, scope string, opts ...AcquireOption) (*Lease, error) {
	if c.isClosed() {
		return nil, fmt.Errorf("acquire %q: %w", scope, fence.ErrClosed)
	}
	a := c.acquireConfig(opts)
	chosenID := a.requestID != ""
	a = withRequestID(a)
	info, sent, retried, err := c.grant(ctx, scope, a)
	if err != nil {
		return nil, err
	}
	// The local validity counts from the send time, which must precede the
	// service's deadline: the service starts it when it grants, a queued
	// grant included, after the request was sent. Not so a grant that an
	// earlier attempt obtained, whose deadline started before this send:
	// a retry inside grant, or an earlier call with the request ID the
	// caller chose. Then one renewal gives the validity a send time of its
	// own. So does a wait in line that took more than a third of the TTL,
	// so that a lease starts with at least the validity a keep-alive
	// leaves it.
	abandon := func(err error) (*Lease, error) {
		rctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, _ = c.Release(rctx, scope, info.ID) // best effort: it would expire anyway
		return nil, err
	}
	if retried || chosenID || time.Since(sent) > info.TTL/3 {
		sent = time.Now()
		if _, err := c.Renew(ctx, scope, info.ID); err != nil {
			return abandon(err)
		}
	}
	margin := a.margin
	if margin == 0 {
		margin = max(info.TTL/20, 5*time.Millisecond)
	}
	l := &Lease{c: c, info: info, margin: margin, stop: make(chan struct{}), exited: make(chan struct{}),
		token: info.FencingToken(), validUntil: sent.Add(info.TTL - margin)}
	l.ctx, l.cancel = context.WithCancelCause(context.Background())
	if err := c.keep(l); err != nil {
		err = fmt.Errorf("acquire %q: %w", scope, err)
		l.cancel(err)
		return abandon(err)
	}
	go l.keepAlive(sent)
	return l, nil
}

// Token returns the lease's fencing token. Present it with every write to
// the protected resource. Its value never changes; when the service signs
// tokens, it is signed with the key the service signed it with at the last
// renewal, so that it stays verifiable after a key rotation.
func (l *Lease) Token() fence.Token {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.token
}

// ID returns the lease ID, which renew and release need.
func (l *Lease) ID() fence.LeaseID { return l.info.ID }

// Scope returns the scope the lease holds.
func (l *Lease) Scope() string { return l.info.Scope }

// Holder returns the holder name the lease was granted to.
func (l *Lease) Holder() string { return l.info.Holder }

// TTL returns the lease's time to live.
func (l *Lease) TTL() time.Duration { return l.info.TTL }

// Done returns a channel that is closed when the lease is lost or released.
func (l *Lease) Done() <-chan struct{} { return l.ctx.Done() }

// Context returns a context that is cancelled when the lease is lost or
// released; context.Cause gives the reason. Run the lease's work under it.
func (l *Lease) Context() context.Context { return l.ctx }

// Err returns nil while the lease is held, then why it ended: an error
// that matches fence.ErrLeaseLost.
func (l *Lease) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// ValidUntil returns the local deadline of the lease's authority on this
// process's monotonic clock: later than now while the lease is valid.
func (l *Lease) ValidUntil() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.validUntil
}

// MarkLost ends the lease's authority locally, with cause as the reason:
// call it when a guard rejects the lease's token as stale. The lease stops
// renewing; it is not released, as a newer holder may already own the
// scope. Retrying the rejected write with this token can never succeed.
func (l *Lease) MarkLost(cause error) {
	l.lose(&fence.LostError{Scope: l.info.Scope, Token: l.info.Token, Reason: fmt.Sprint(cause)})
}

// Release stops renewing and frees the scope at the service. Releasing a
// lease that is already lost only stops it and returns its loss reason,
// at once: it does not wait for the release the keep-alive sends when the
// lease's local validity runs out. Release returns when ctx ends, with its
// error.
func (l *Lease) Release(ctx context.Context) error {
	if !l.lose(&fence.LostError{Scope: l.info.Scope, Token: l.info.Token, Reason: "released by its holder"}) {
		return l.await(ctx, l.exited, l.Err())
	}
	// The keep-alive ends while the release is on its way, not before it:
	// waiting for it first put a goroutine's wake-up into every cycle. Its
	// renewal, if one was sent, goes first: answered after the release, it
	// would find the lease gone, and the leader would publish it as lost.
	if err := l.await(ctx, l.renewalDone(), nil); err != nil {
		return err
	}
	_, err := l.c.Release(ctx, l.info.Scope, l.info.ID)
	return l.await(ctx, l.exited, err)
}

// await waits until done closes, then returns err; or ctx's error if ctx
// ends first.
func (l *Lease) await(ctx context.Context, done <-chan struct{}, err error) error {
	select {
	case <-done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("release %q: %w", l.info.Scope, ctx.Err())
	}
}

// renewalDone returns a channel closed once the keep-alive's latest
// renewal has been answered or dropped: at once if there is none.
func (l *Lease) renewalDone() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.renewal == nil {
		return closed
	}
	return l.renewal.done
}

var closed = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// lose records the first reason the lease ended and stops it. It reports
// whether err was that first reason.
func (l *Lease) lose(err error) bool {
	l.mu.Lock()
	first := l.err == nil
	if first {
		l.err = err
	}
	r := l.renewal
	l.mu.Unlock()
	if first {
		if r != nil {
			r.abandon(err) // a renewal still queued never goes out
		}
		l.cancel(err)
		close(l.stop)
		l.c.forget(l)
	}
	return first
}

// keepAlive renews the lease until it is lost, then releases it if its
// local validity ran out (see releaseLost). exited closes in between: a
// Release of the lost lease waits for the renewals to stop, not for that
// release, which takes up to a TTL when the service does not answer.
func (l *Lease) keepAlive(start time.Time) {
	ranOut := l.renew(start)
	close(l.exited)
	if ranOut {
		l.releaseLost()
	}
}

// renew renews the lease every third of its TTL, counted from start, the
// send time its validity counts from, until the lease is lost: when the
// service says so, or when its local validity runs out, which renew
// reports.
func (l *Lease) renew(start time.Time) (ranOut bool) {
	every := l.info.TTL / 3
	next := start.Add(every)
	for {
		valid := l.ValidUntil()
		wake := next
		if valid.Before(wake) {
			wake = valid
		}
		t := time.NewTimer(time.Until(wake))
		select {
		case <-l.stop:
			t.Stop()
			return false
		case <-t.C:
		}
		if !time.Now().Before(valid) {
			return l.lose(&fence.LostError{Scope: l.info.Scope, Token: l.info.Token,
				Reason: fmt.Sprintf("no renewal confirmed within the TTL of %v (local validity ran out)", l.info.TTL)})
		}
		if time.Now().Before(next) {
			continue
		}
		sent := time.Now()
		renewed, err := l.renewOnce(valid)
		switch {
		case err == nil:
			l.mu.Lock()
			l.validUntil = sent.Add(l.info.TTL - l.margin)
			if renewed.Signed.Signed() {
				// The service signs with its current key: after a
				// rotation, guards stop accepting the old key's
				// signature once its grace ends.
				l.token = renewed.Signed
			}
			l.mu.Unlock()
			next = sent.Add(every)
		case errors.Is(err, fence.ErrLeaseLost), errors.Is(err, fence.ErrNotHolder):
			l.lose(err)
			return false
		default:
			// Transient: try again soon, while the lease is still valid.
			next = time.Now().Add(max(l.info.TTL/20, 10*time.Millisecond))
		}
	}
}

// releaseLost releases a lease lost only locally: the service may still
// count it current (a renewal it granted may have been answered too late),
// and would hold its scope for up to a TTL. A release frees the scope only
// while this lease ID is current, so it takes nothing from a newer holder.
// Best effort: the service expires the lease within a TTL anyway, which
// bounds the attempt, and Close ends it.
func (l *Lease) releaseLost() {
	ctx, cancel := context.WithTimeout(l.c.life, l.info.TTL)
	defer cancel()
	if l.await(ctx, l.renewalDone(), nil) == nil {
		_, _ = l.c.Release(ctx, l.info.Scope, l.info.ID)
	}
}

// renewOnce sends one renewal, in a batch with the other leases of the
// client that are due, and gives up when the lease's validity ends: an
// answer after that would come too late to extend it. Its context is not
// the lease's: a renewal that was sent is waited for after the lease is
// lost, so that a release goes after it; one still queued is dropped.
func (l *Lease) renewOnce(valid time.Time) (fence.Lease, error) {
	ctx, cancel := context.WithDeadline(context.Background(), valid)
	defer cancel()
	r := newCall[*fencev1.RenewRequest, fence.Lease](ctx, &fencev1.RenewRequest{Scope: l.info.Scope, LeaseId: l.info.ID.String()})
	l.mu.Lock()
	if err := l.err; err != nil {
		l.mu.Unlock()
		return fence.Lease{}, err
	}
	l.renewal = r
	l.mu.Unlock()
	l.c.renewals.start(r)
	return r.wait(ctx)
}
