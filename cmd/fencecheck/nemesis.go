package main

import (
	"context"
	"fmt"
	"time"
)

// inject carries out the schedule: each fault starts at its time and heals
// itself after its duration. It returns once the run's time is up and
// every fault has healed.
func (r *runner) inject(ctx context.Context) {
	start := time.Now()
	end := start.Add(r.cfg.d)
	for _, f := range r.sched.faults {
		if !sleepUntil(ctx, start.Add(f.At)) {
			break
		}
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			r.do(ctx, f)
		}()
	}
	sleepUntil(ctx, end)
	close(r.ended)
	for _, w := range r.workers {
		w.res.disarm() // pauses armed for a request that never came
	}
	r.wg.Wait()
}

// sleepUntil sleeps until t; it reports false if ctx ended first.
func sleepUntil(ctx context.Context, t time.Time) bool {
	timer := time.NewTimer(time.Until(t))
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-timer.C:
		return true
	}
}

// do injects one fault and heals it.
func (r *runner) do(ctx context.Context, f fault) {
	hold := func() {
		t := time.NewTimer(f.For)
		defer t.Stop()
		select {
		case <-ctx.Done():
		case <-t.C:
		}
	}
	switch f.Kind {
	case faultPause:
		w := r.workers[f.Target]
		pause := func(when string) {
			if !w.p.pause() {
				return // already paused, or done
			}
			r.fault(faultPause, fmt.Sprintf("%s: SIGSTOP %sfor %v (TTL %v)", w.name, when, f.For.Round(time.Millisecond), r.cfg.ttl))
			hold()
			w.p.resume()
		}
		if !f.AtRequest {
			pause("")
			return
		}
		done := make(chan struct{})
		w.res.atNext(func() { defer close(done); pause("as it sends a request to the resource, ") })
		select {
		case <-done:
		case <-ctx.Done():
		case <-r.ended: // never armed past the run
		}
	case faultDelay:
		// Recorded by the proxy when a request is actually held.
		r.workers[f.Target].res.holdNext(f.For)
	case faultPartition:
		w := r.workers[f.Target]
		r.fault(faultPartition, fmt.Sprintf("%s: cut off from fenced for %v", w.name, f.For.Round(time.Millisecond)))
		for _, p := range w.fenced {
			p.setCut(true)
		}
		hold()
		for _, p := range w.fenced {
			p.setCut(false)
		}
	case faultCrash:
		nd := r.leader(ctx)
		if nd == nil {
			return // no leader right now: skip
		}
		what := "fenced"
		if len(r.nodes) > 1 {
			what = "the leader, " + nd.id
		}
		r.fault(faultCrash, fmt.Sprintf("kill -9 %s; restart after %v", what, f.For.Round(time.Millisecond)))
		nd.p.kill()
		hold()
		if err := nd.p.start(); err != nil {
			r.fault("error", fmt.Sprintf("restart %s: %v", nd.id, err))
		}
	case faultResourceCrash:
		r.fault(faultResourceCrash, fmt.Sprintf("kill -9 the resource; restart after %v", f.For.Round(time.Millisecond)))
		r.resource.kill()
		hold()
		if err := r.resource.start(); err != nil {
			r.fault("error", fmt.Sprintf("restart the resource: %v", err))
		}
	case faultNodePartition:
		var nd *node
		if f.Target < len(r.nodes) {
			nd = r.nodes[f.Target]
		} else if nd = r.leader(ctx); nd == nil {
			return
		}
		r.fault(faultNodePartition, fmt.Sprintf("%s: cut off from the other nodes for %v", nd.id, f.For.Round(time.Millisecond)))
		r.isolate(nd, true)
		hold()
		r.isolate(nd, false)
	}
}
