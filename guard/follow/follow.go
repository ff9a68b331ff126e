package follow

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/client"
	"github.com/fence-dev/fence/guard"
)

// Follower advances a store's marks from the lease service's watch stream.
// Its methods are safe for concurrent use; Run runs once.
type Follower struct {
	c      *client.Client
	store  guard.Store
	prefix string
	log    *slog.Logger
	par    int

	mu      sync.Mutex
	pending map[string]mark // scope → the highest mark to advance to, not yet applied
	wake    chan struct{}   // signalled when pending gains an entry
	// open holds, by scope, the token of the newest lease an event or a
	// read of the state showed held and no event has shown ended yet: the
	// scopes a resync reads, to find the closings missed meanwhile. A scope
	// leaves it at its lease's end (its closing waits in pending until
	// recorded), so the follower remembers the leases held, not every
	// scope it ever saw.
	open map[string]uint64
	// listed says that the store's own scopes (a guard.Lister's) were
	// read, at the first start of the watch.
	listed bool
	// behind is, while the watch is broken or the state is being read
	// again, since when (0 otherwise).
	behind time.Time
	// inflight are the marks being applied, by scope.
	inflight map[string]mark

	// lastErr is the most recent failure and when it happened.
	lastErr   error
	lastErrAt time.Time

	advanced atomic.Uint64
	resyncs  atomic.Uint64
	position atomic.Uint64 // the watch position it resumes from
}

// mark is a token to advance a scope to, and when the service recorded
// the event that named it.
type mark struct {
	token uint64
	at    time.Time
}

// Option configures a Follower.
type Option interface{ apply(*Follower) }

type optionFunc func(*Follower)

func (f optionFunc) apply(fl *Follower) { f(fl) }

// WithLogger logs the follower's disconnections, resyncs and store errors
// to l (default slog.Default()).
func WithLogger(l *slog.Logger) Option { return optionFunc(func(f *Follower) { f.log = l }) }

// WithConcurrency sets how many scopes' marks are advanced at once
// (default 8): a store over the network then keeps up with a busy service.
// One scope's advances never overlap.
func WithConcurrency(n int) Option {
	return optionFunc(func(f *Follower) { f.par = max(n, 1) })
}

// New returns a Follower that advances store's marks for the scopes
// starting with prefix ("" for all), watching through c. Call Run.
func New(c *client.Client, store guard.Store, prefix string, opts ...Option) *Follower {
	f := &Follower{c: c, store: store, prefix: prefix, log: slog.Default(), par: 8,
		pending: map[string]mark{}, wake: make(chan struct{}, 1), open: map[string]uint64{}, inflight: map[string]mark{}}
	for _, o := range opts {
		o.apply(f)
	}
	return f
}

// Run follows the service until ctx ends, then returns ctx's error. It
// returns earlier only for a failure that retrying cannot mend: the prefix
// is invalid, or the caller may not watch it.
func (f *Follower) Run(ctx context.Context) error {
	f.lost() // not following until the service takes the watch
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		f.apply(ctx)
	}()
	err := f.watch(ctx)
	cancel()
	wg.Wait()
	return err
}

// Lag reports how far behind the service the follower is: the age of the
// oldest grant or closing it received but has not yet recorded in the
// store, by the time the service recorded it (so it includes the watch's
// delivery, and the clocks' difference between the two machines), or,
// while it is not following (from the start of Run until the service
// takes its watch, while the watch is broken, while it reads the state
// again), the time since it started or lost the stream. 0 when it has
// recorded everything it received.
func (f *Follower) Lag() time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	now := time.Now()
	var lag time.Duration
	if !f.behind.IsZero() {
		lag = now.Sub(f.behind)
	}
	for _, set := range []map[string]mark{f.pending, f.inflight} {
		for _, m := range set {
			lag = max(lag, now.Sub(m.at))
		}
	}
	return max(lag, 0)
}

// Advanced reports how many marks the follower has advanced in the store
// (including advances the store found already done).
func (f *Follower) Advanced() uint64 { return f.advanced.Load() }

// Resyncs reports how many times the follower read the state of the
// leases it knew held instead of resuming its watch: the service no longer
// held the events to resume from, or its watch had never started.
func (f *Follower) Resyncs() uint64 { return f.resyncs.Load() }

// Prefix returns the prefix of the scopes the follower follows.
func (f *Follower) Prefix() string { return f.prefix }

// Position reports the position in the service's watch stream up to which
// the follower has received every event, where it resumes after a
// disconnection: 0 until the service first takes its watch, and while it
// reads the state again after missed events.
func (f *Follower) Position() uint64 { return f.position.Load() }

// LastError reports when the follower's most recent failure happened,
// and what it was: a broken watch, a failed read of the state, a failed
// advance in the store, each of which it retries. A zero time and nil if
// none happened since New.
func (f *Follower) LastError() (time.Time, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lastErrAt, f.lastErr
}

// failed records err as the most recent failure.
func (f *Follower) failed(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lastErr, f.lastErrAt = err, time.Now()
}

// watch consumes the watch stream into pending, resuming after
// disconnections and reading the state again when it cannot resume.
func (f *Follower) watch(ctx context.Context) error {
	var pos uint64 // the position to resume from; 0: start afresh
	// A store that names its scopes lets a follower that starts afresh
	// close the leases that ended while none ran: it reads their state once
	// the watch has started, as after missed events.
	_, resync := f.store.(guard.Lister)
	backoff := 50 * time.Millisecond
	for {
		if resync {
			pos = 0
			f.position.Store(0)
		}
		opts := []client.WatchOption{client.WithProgress(func(next uint64) {
			// The service has taken the watch's start: whatever happens
			// from here on is in the stream, so the state read now
			// misses nothing.
			backoff = 50 * time.Millisecond
			if resync {
				if err := f.resync(ctx); err != nil {
					if ctx.Err() == nil {
						f.failed(fmt.Errorf("read the state again: %w", err))
						f.log.Warn("follow: could not read the state again; retrying", "prefix", f.prefix, "err", err)
					}
					return // at the next response
				}
				resync = false
			}
			pos = next
			f.position.Store(pos)
			f.caughtUp()
		})}
		if pos == 0 {
			opts = append(opts, client.WithHeld())
		}
		var err error
		for e, werr := range f.c.Watch(ctx, f.prefix, pos, opts...) {
			if werr != nil {
				err = werr
				break
			}
			if e.Position != 0 && !resync {
				pos = e.Position + 1
				f.position.Store(pos)
			}
			f.event(e)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		f.lost()
		if err != nil {
			f.failed(fmt.Errorf("watch: %w", err))
		}
		switch {
		case errors.Is(err, fence.ErrMissedEvents):
			f.log.Warn("follow: the service no longer holds the events to resume from; reading the state again", "prefix", f.prefix, "err", err)
			resync = true
		case errors.Is(err, fence.ErrInvalid), errors.Is(err, fence.ErrPermissionDenied), errors.Is(err, fence.ErrUnauthenticated):
			return fmt.Errorf("follow %q: %w", f.prefix, err)
		default:
			f.log.Warn("follow: the watch broke; resuming", "prefix", f.prefix, "position", pos, "err", err)
			if pos == 0 {
				// It never started: what ended meanwhile is known only
				// from the state.
				resync = true
			}
		}
		sleep := rand.N(backoff) + time.Millisecond
		backoff = min(2*backoff, 2*time.Second)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(sleep):
		}
	}
}

// lost records that the stream broke.
func (f *Follower) lost() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.behind.IsZero() {
		f.behind = time.Now()
	}
}

// caughtUp records that the stream is back and the state was read.
func (f *Follower) caughtUp() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.behind = time.Time{}
}

// resync reads the current state of the scopes whose lease the follower
// saw begin and not end, and the first time, for a store that is a
// guard.Lister, of every scope under the prefix the store has a mark for
// (not counted in Resyncs): a held scope advances to its lease's token, a
// free one to its last token (its closing, from log format 8 on; a token
// floor set since is above every token it had). A held scope's last token
// may be above its lease's (a token floor), so it is not used. The leases
// held now, which the follower did not see begin, come as the watch's
// held events.
func (f *Follower) resync(ctx context.Context) error {
	f.mu.Lock()
	read := make(map[string]bool, len(f.open))
	for s := range f.open {
		read[s] = true
	}
	f.mu.Unlock()
	l, list := f.store.(guard.Lister)
	if list = list && !f.listed; list {
		scopes, err := l.Scopes(ctx, f.prefix)
		if err != nil {
			return fmt.Errorf("list the store's scopes: %w", err)
		}
		for _, s := range scopes {
			// A mark no token could have made (a row written by hand)
			// would fail every Get, and the follower would never catch up.
			if fence.ValidateScope(s) == nil {
				read[s] = true
			}
		}
	} else {
		f.resyncs.Add(1)
	}
	now := time.Now()
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(f.par)
	for s := range read {
		g.Go(func() error {
			st, err := f.c.Get(gctx, s)
			if err != nil {
				return err
			}
			if st.Lease != nil {
				f.want(s, st.Lease.Token, now)
				f.track(s, st.Lease.Token, true)
			} else {
				f.want(s, st.LastToken, now)
				f.track(s, st.LastToken, false)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return err // read all again at the next try, the store's scopes too
	}
	f.listed = f.listed || list
	return nil
}

// event takes in one event of the stream.
func (f *Follower) event(e client.Event) {
	switch e.Kind {
	case client.EventGranted, client.EventHeld:
		f.want(e.Scope, e.Token, e.Time)
		f.track(e.Scope, e.Token, true)
	case client.EventReleased, client.EventExpired:
		// Under a log format before 8 nothing is closed: the token
		// itself still refuses every older one.
		f.want(e.Scope, max(e.Token, e.Closing), e.Time)
		f.track(e.Scope, e.Token, false)
	case client.EventLost:
		if e.Current != 0 {
			f.want(e.Scope, e.Current, e.Time)
		}
	}
}

// want records that scope's mark should be at least token.
func (f *Follower) want(scope string, token uint64, at time.Time) {
	if token == 0 || token > fence.MaxToken {
		return
	}
	if at.IsZero() || at.After(time.Now()) {
		at = time.Now()
	}
	f.mu.Lock()
	m, ok := f.pending[scope]
	if !ok || token > m.token {
		if ok {
			at = m.at // the oldest wait counts
		}
		f.pending[scope] = mark{token, at}
	}
	f.mu.Unlock()
	f.signal()
}

// track records that the lease with token began (held) or that every
// lease of scope up to token ended (!held): a scope is read at a resync
// while a lease it saw begin has not been seen to end.
func (f *Follower) track(scope string, token uint64, held bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	t, ok := f.open[scope]
	switch {
	case held && token > t && token <= fence.MaxToken:
		f.open[scope] = token
	case !held && ok && t <= token:
		delete(f.open, scope)
	}
}

// apply records the pending marks in the store until ctx ends, up to
// f.par scopes at once, one advance per scope at a time; a failed advance
// is retried, never dropped.
func (f *Follower) apply(ctx context.Context) {
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		f.mu.Lock()
		for s, m := range f.pending {
			if len(f.inflight) >= f.par {
				break
			}
			if _, busy := f.inflight[s]; busy {
				continue
			}
			f.inflight[s] = m
			delete(f.pending, s)
			wg.Go(func() { f.advanceOne(ctx, s, m) })
		}
		f.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-f.wake:
		}
	}
}

// advanceOne records m in the store, then lets the next mark of the scope
// go; a mark that failed goes back in line, after a pause.
func (f *Follower) advanceOne(ctx context.Context, scope string, m mark) {
	err := f.advance(ctx, scope, m.token)
	if err != nil && ctx.Err() == nil {
		f.failed(fmt.Errorf("advance %q to %d: %w", scope, m.token, err))
		f.log.Warn("follow: could not advance the mark; retrying", "scope", scope, "token", m.token, "err", err)
		select {
		case <-ctx.Done():
		case <-time.After(100*time.Millisecond + rand.N(100*time.Millisecond)):
		}
	}
	f.mu.Lock()
	delete(f.inflight, scope)
	if err != nil {
		// Back in line, merged with what came meanwhile; the oldest
		// wait counts.
		if p, ok := f.pending[scope]; !ok || p.token < m.token {
			f.pending[scope] = m
		} else {
			p.at = m.at
			f.pending[scope] = p
		}
	}
	f.mu.Unlock()
	f.signal()
}

func (f *Follower) signal() {
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

// advance moves scope's mark to token, unless it is past it already, with
// the store's own check and an apply that does nothing.
func (f *Follower) advance(ctx context.Context, scope string, token uint64) error {
	err := f.store.Fence(ctx, guard.Write{Token: fence.Token{Scope: scope, Value: token}}, false, func(context.Context) error { return nil })
	if _, ok := errors.AsType[*guard.StaleError](err); ok {
		err = nil // the mark is past it already
	}
	if err == nil {
		f.advanced.Add(1)
	}
	return err
}
