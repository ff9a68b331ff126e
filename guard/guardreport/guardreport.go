// Package guardreport sends a guard's stale rejections to fenced, so that
// one place (fenced's status page, its metrics and its watchers) shows
// which holders kept writing after losing their lease.
//
// A Reporter is a guard.Observer. It never slows the write path: a
// rejection is put in a bounded buffer without blocking, and a background
// goroutine sends the buffer to the service in batches. When the buffer is
// full, rejections are dropped and counted, and the count is reported with
// the next batch. Reporting is best effort: the guard's decision never
// depends on it.
//
// # Usage
//
//	rep := guardreport.New(c, "orders-db", guardreport.WithObserver(metrics.Observer("sql")))
//	defer rep.Close(context.Background())
//	g := guard.New(store, guard.WithObserver(rep))
package guardreport

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/fence-dev/fence/client"
	"github.com/fence-dev/fence/guard"
)

// Reporter batches a guard's stale rejections and sends them to fenced. It
// is safe for concurrent use.
type Reporter struct {
	c        *client.Client
	name     string
	next     guard.Observer
	interval time.Duration
	limit    int
	log      *slog.Logger

	mu      sync.Mutex
	buf     []client.Rejection
	dropped uint64
	failing bool // the last send failed: log again only after a success

	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

// Option configures a Reporter.
type Option interface{ apply(*Reporter) }

type optionFunc func(*Reporter)

func (f optionFunc) apply(r *Reporter) { f(r) }

// WithInterval sets how often buffered rejections are sent (default 1s).
func WithInterval(d time.Duration) Option { return optionFunc(func(r *Reporter) { r.interval = d }) }

// WithBuffer sets how many rejections wait to be sent at most (default
// 1000); more are dropped and counted.
func WithBuffer(n int) Option { return optionFunc(func(r *Reporter) { r.limit = n }) }

// WithObserver passes every accepted and rejected write on to o as well,
// such as guardmetrics' observer: a guard has one observer.
func WithObserver(o guard.Observer) Option { return optionFunc(func(r *Reporter) { r.next = o }) }

// WithLogger logs failed sends to l (default slog.Default()), once per run
// of failures.
func WithLogger(l *slog.Logger) Option { return optionFunc(func(r *Reporter) { r.log = l }) }

// New starts a Reporter that sends to the service c talks to, naming the
// guarded resource name ("orders-db") for people. Close it when done.
func New(c *client.Client, name string, opts ...Option) *Reporter {
	r := &Reporter{c: c, name: name, interval: time.Second, limit: 1000, log: slog.Default(),
		stop: make(chan struct{}), done: make(chan struct{})}
	for _, o := range opts {
		o.apply(r)
	}
	r.limit = max(r.limit, 1)
	go r.loop()
	return r
}

// Accepted implements guard.Observer.
func (r *Reporter) Accepted(scope string) {
	if r.next != nil {
		r.next.Accepted(scope)
	}
}

// Rejected implements guard.Observer: it buffers the rejection, or counts
// it as dropped when the buffer is full. It never blocks on the network.
func (r *Reporter) Rejected(e *guard.StaleError) {
	if r.next != nil {
		r.next.Rejected(e)
	}
	r.mu.Lock()
	if len(r.buf) < r.limit {
		r.buf = append(r.buf, client.Rejection{Scope: e.Scope, Presented: e.Presented, Highest: e.Highest, Time: time.Now()})
	} else {
		r.dropped++
	}
	r.mu.Unlock()
}

// Flush sends what is buffered now and returns when the service has it.
func (r *Reporter) Flush(ctx context.Context) error {
	for {
		r.mu.Lock()
		n := min(len(r.buf), client.MaxReport)
		batch := r.buf[:n:n]
		r.buf = r.buf[n:]
		dropped := r.dropped
		r.dropped = 0
		r.mu.Unlock()
		if n == 0 && dropped == 0 {
			return nil
		}
		if err := r.c.ReportRejections(ctx, r.name, batch, dropped); err != nil {
			r.mu.Lock()
			// Put the batch back in front of what came since, as far as it
			// fits; the rest counts as dropped.
			keep := min(len(batch), max(r.limit-len(r.buf), 0))
			r.buf = append(batch[:keep:keep], r.buf...)
			r.dropped += dropped + uint64(len(batch)-keep)
			r.mu.Unlock()
			return err
		}
	}
}

func (r *Reporter) loop() {
	defer close(r.done)
	t := time.NewTicker(r.interval)
	defer t.Stop()
	for {
		select {
		case <-r.stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), max(r.interval, 5*time.Second))
		err := r.Flush(ctx)
		cancel()
		r.mu.Lock()
		logIt := err != nil && !r.failing
		r.failing = err != nil
		r.mu.Unlock()
		if logIt {
			r.log.Warn("reporting stale rejections to fenced failed; will retry", "guard", r.name, "err", err)
		}
	}
}

// Close stops the background sending and sends what is left, giving up
// when ctx ends. It does not close the client.
func (r *Reporter) Close(ctx context.Context) error {
	r.closeOnce.Do(func() { close(r.stop) })
	<-r.done
	return r.Flush(ctx)
}
