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

// maxCoalesced bounds the calls one batch RPC carries, so that one answer
// stays small and one slow batch holds back few callers.
const maxCoalesced = 256

// coalescer sends the concurrent calls of one kind made on a Client
// together. A call that finds none in flight goes out at once, with the
// calls made while its goroutine yielded once; the calls made while one is
// in flight queue and leave together, as one batch RPC, when it returns. A
// batch of one is the single RPC. There is no timer: a lone caller waits
// for nothing, and under load the batch grows with the time one call
// takes. It is safe for concurrent use.
type coalescer[In, Out any] struct {
	// one makes the single call.
	one func(ctx context.Context, in In) (Out, error)
	// many makes one batch call: an answer or error per item, or an error
	// for the call as a whole.
	many func(ctx context.Context, ins []In) ([]Out, []error, error)
	// alone, in Unix nanoseconds, is until when calls go alone: a service
	// older than the batch call answered Unimplemented. It is asked again
	// after a while, so a client outlives the service's upgrade.
	alone atomic.Int64

	mu      sync.Mutex
	queue   []*pending[In, Out]
	running bool
}

type pending[In, Out any] struct {
	in   In
	ctx  context.Context
	out  Out
	err  error
	done chan struct{}
}

// do makes the call for in, alone or in the next batch.
func (b *coalescer[In, Out]) do(ctx context.Context, in In) (Out, error) {
	p := &pending[In, Out]{in: in, ctx: ctx, done: make(chan struct{})}
	b.mu.Lock()
	b.queue = append(b.queue, p)
	if !b.running {
		b.running = true
		b.mu.Unlock()
		// The answer of a batch wakes its callers one after another, and
		// their next calls come together: without this yield the first
		// went out alone, and the rest waited a round trip for it
		// (BENCHMARKS.md, "Waves").
		runtime.Gosched()
		b.mu.Lock()
		batch := b.takeLocked()
		b.mu.Unlock()
		b.send(batch)
		b.next()
		return p.out, p.err
	}
	b.mu.Unlock()
	select {
	case <-p.done:
		return p.out, p.err
	case <-ctx.Done():
		// Not sent yet, it never will be (send skips it); sent, its
		// answer is dropped, as a single call's would be.
		var zero Out
		return zero, ctx.Err()
	}
}

// next ends the call in flight: the calls that queued meanwhile leave now.
func (b *coalescer[In, Out]) next() {
	b.mu.Lock()
	if len(b.queue) == 0 {
		b.running = false
		b.mu.Unlock()
		return
	}
	b.mu.Unlock()
	go b.run()
}

// run sends batches until the queue is empty.
func (b *coalescer[In, Out]) run() {
	for {
		b.mu.Lock()
		batch := b.takeLocked()
		if len(batch) == 0 {
			b.running = false
			b.mu.Unlock()
			return
		}
		b.mu.Unlock()
		b.send(batch)
	}
}

// takeLocked removes the next batch from the queue. b.mu is held.
func (b *coalescer[In, Out]) takeLocked() []*pending[In, Out] {
	n := min(len(b.queue), maxCoalesced)
	batch := b.queue[:n:n]
	b.queue = b.queue[n:]
	return batch
}

// send makes one call for the batch's callers still waiting. The call lasts
// until the latest of their deadlines and is cancelled once every one of
// them gave up.
func (b *coalescer[In, Out]) send(batch []*pending[In, Out]) {
	live := batch[:0:0]
	for _, p := range batch {
		if p.ctx.Err() != nil {
			p.err = p.ctx.Err()
			close(p.done) // its caller has returned already, or is the one sending
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
