package client

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fence-dev/fence"
)

// maxCoalesced bounds the acquires and releases one batch RPC carries, so
// that one answer stays small and one slow batch holds back few callers.
// Renewals go up to MaxRenewBatch: thousands of leases renewing at once
// (after a failover) should take a few calls.
const maxCoalesced = 256

// coalescer sends the concurrent calls of one kind made on a Client
// together. A call that finds none in flight goes out at once, with the
// calls made while its goroutine yielded once; the calls made while one is
// in flight queue and leave together, as one batch RPC, when it returns. A
// batch of one is the single RPC. There is no timer: a lone caller waits
// for nothing, and under load the batch grows with the time one call
// takes. It is safe for concurrent use.
//
// Every caller waits for its answer in one place, call.wait, and returns
// when its own context ends, with that context's error, whoever sends its
// call and whatever the other calls of its batch wait for.
type coalescer[In, Out any] struct {
	// one makes the single call.
	one func(ctx context.Context, in In) (Out, error)
	// many makes one batch call: an answer or error per item, or an error
	// for the call as a whole.
	many func(ctx context.Context, ins []In) ([]Out, []error, error)
	// max bounds the calls of one batch.
	max int
	// alone, in Unix nanoseconds, is until when calls go alone: a service
	// older than the batch call answered Unimplemented. It is asked again
	// after a while, so a client outlives the service's upgrade.
	alone atomic.Int64

	mu      sync.Mutex
	queue   []*call[In, Out]
	running bool // a goroutine is sending; it takes the queue when it is done
}

// call is one caller's call on its way through a coalescer. It is taken
// into a batch (sent) or given up by its caller before that (abandoned),
// never both; done closes when its answer is in, or when it is abandoned.
type call[In, Out any] struct {
	in    In
	ctx   context.Context
	out   Out
	err   error
	state atomic.Int32 // queued, sent or abandoned
	done  chan struct{}
}

const (
	queued int32 = iota
	sent
	abandoned
)

func newCall[In, Out any](ctx context.Context, in In) *call[In, Out] {
	return &call[In, Out]{in: in, ctx: ctx, done: make(chan struct{})}
}

// abandon gives the call up with err, unless it was sent already: then it
// reports false, and done closes when its batch is answered.
func (p *call[In, Out]) abandon(err error) bool {
	if !p.state.CompareAndSwap(queued, abandoned) {
		return false
	}
	p.err = err
	close(p.done)
	return true
}

// wait returns the call's answer, or ctx's error once ctx has ended: an
// answer that arrives after that is dropped, as a single call's would be.
// A call not sent yet never will be.
func (p *call[In, Out]) wait(ctx context.Context) (Out, error) {
	select {
	case <-p.done:
	case <-ctx.Done():
		p.abandon(ctx.Err())
	}
	if err := ctx.Err(); err != nil {
		var zero Out
		return zero, err
	}
	return p.out, p.err
}

// do makes the call for in, alone or in a batch, and waits for its answer.
func (b *coalescer[In, Out]) do(ctx context.Context, in In) (Out, error) {
	p := newCall[In, Out](ctx, in)
	b.start(p)
	return p.wait(ctx)
}

// start queues p, and sends it unless a call is in flight. A call that
// goes alone is sent on its caller's goroutine, under its own context: a
// hand-off to another goroutine would cost the lone caller a wake-up. A
// batch is sent by a goroutine of its own, which then sends the calls
// queued meanwhile, so that no caller waits for more than its own answer.
func (b *coalescer[In, Out]) start(p *call[In, Out]) {
	b.mu.Lock()
	b.queue = append(b.queue, p)
	if b.running {
		b.mu.Unlock()
		return
	}
	b.running = true
	b.mu.Unlock()
	// The answer of a batch wakes its callers one after another, and
	// their next calls come together: without this yield the first went
	// out alone, and the rest waited a round trip for it (eda15be:BENCHMARKS.md,
	// "Waves").
	runtime.Gosched()
	batch := b.take()
	if len(batch) == 1 {
		b.send(batch)
		if batch = b.take(); len(batch) == 0 {
			return
		}
	}
	go b.run(batch)
}

// run sends batch, then the calls queued meanwhile, until none is left.
func (b *coalescer[In, Out]) run(batch []*call[In, Out]) {
	for len(batch) > 0 {
		b.send(batch)
		batch = b.take()
	}
}

// take removes the next batch from the queue, or, if it is empty, ends
// the sending.
func (b *coalescer[In, Out]) take() []*call[In, Out] {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := min(len(b.queue), b.max)
	if n == 0 {
		b.running = false
		return nil
	}
	batch := b.queue[:n:n]
	b.queue = b.queue[n:]
	return batch
}

// send makes one call for the batch's callers still waiting. The call lasts
// until the latest of their deadlines and is cancelled once every one of
// them gave up.
func (b *coalescer[In, Out]) send(batch []*call[In, Out]) {
	live := batch[:0:0]
	for _, p := range batch {
		if !p.state.CompareAndSwap(queued, sent) {
			continue // abandoned: its caller has gone
		}
		if err := p.ctx.Err(); err != nil {
			p.err = err
			close(p.done)
			continue
		}
		live = append(live, p)
	}
	switch len(live) {
	case 0:
		return
	case 1:
		p := live[0]
		p.out, p.err = b.one(p.ctx, p.in)
		close(p.done)
		return
	}
	ins := make([]In, len(live))
	ctxs := make([]context.Context, len(live))
	for i, p := range live {
		ins[i], ctxs[i] = p.in, p.ctx
	}
	ctx, stop := sharedContext(ctxs)
	defer stop()
	var (
		outs []Out
		errs []error
		err  error
	)
	if time.Now().UnixNano() >= b.alone.Load() {
		outs, errs, err = b.many(ctx, ins)
	}
	if time.Now().UnixNano() < b.alone.Load() || errors.Is(err, fence.ErrUnimplemented) {
		if err != nil {
			b.alone.Store(time.Now().Add(time.Minute).UnixNano())
		}
		outs, errs, err = make([]Out, len(live)), make([]error, len(live)), nil
		var wg sync.WaitGroup
		for i, p := range live {
			wg.Go(func() { outs[i], errs[i] = b.one(p.ctx, p.in) })
		}
		wg.Wait()
	}
	for i, p := range live {
		if err != nil {
			p.err = err
		} else {
			p.out, p.err = outs[i], errs[i]
		}
		close(p.done)
	}
}

// sharedContext returns the context of one call made for many callers: it
// lasts until the latest of their deadlines (an hour for a caller without
// one), and is cancelled once every one of them has given up. stop
// releases it when the call has returned.
func sharedContext(ctxs []context.Context) (ctx context.Context, stop func()) {
	var latest time.Time
	for _, c := range ctxs {
		d, ok := c.Deadline()
		if !ok {
			d = time.Now().Add(time.Hour)
		}
		if d.After(latest) {
			latest = d
		}
	}
	ctx, cancel := context.WithDeadline(context.Background(), latest)
	var waiting atomic.Int64
	waiting.Store(int64(len(ctxs)))
	stops := make([]func() bool, len(ctxs))
	for i, c := range ctxs {
		stops[i] = context.AfterFunc(c, func() {
			if waiting.Add(-1) == 0 {
				cancel()
			}
		})
	}
	return ctx, func() {
		for _, s := range stops {
			s()
		}
		cancel()
	}
}
