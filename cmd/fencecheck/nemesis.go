package main

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync/atomic"
	"syscall"
	"time"
)

// inject carries out the schedule: each fault starts at its time and heals
// itself after its duration. It returns once the run's time is up and
// every fault has healed.
func (r *runner) inject(ctx context.Context) {
	start := time.Now()
	end := start.Add(r.cfg.d)
	for i, f := range r.sched.faults {
		if !sleepUntil(ctx, start.Add(f.At)) {
			for _, f := range r.sched.faults[i:] {
				r.miss(f.Kind, "the run was interrupted")
			}
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
		// Pauses armed for a request that never came count themselves
		// in do.
		for range w.res.disarm() {
			r.miss(faultDelay, "no request to the resource came before the run ended")
		}
	}
	r.wg.Wait()
}

// miss records that a planned fault of kind was not injected, and why.
func (r *runner) miss(kind, why string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.missed == nil {
		r.missed = map[string]map[string]int{}
	}
	if r.missed[kind] == nil {
		r.missed[kind] = map[string]int{}
	}
	r.missed[kind][why]++
}

// printMissed says which planned faults were not injected and why, so
// that the schedule's counts and the report's add up.
func (r *runner) printMissed() {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, whys := range r.missed {
		for _, c := range whys {
			n += c
		}
	}
	if n == 0 {
		r.printf("every planned fault was injected\n")
		return
	}
	r.printf("planned but not injected: %d, so \"faults injected\" below counts fewer than the schedule:\n", n)
	for _, kind := range slices.Sorted(maps.Keys(r.missed)) {
		for _, why := range slices.Sorted(maps.Keys(r.missed[kind])) {
			r.printf("  %-15s %d  %s\n", kind, r.missed[kind][why], why)
		}
	}
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

// stopGrace bounds how long a fenced sent SIGTERM may take to exit: it
// gives requests in flight up to 10 s, and a leader hands off first.
const stopGrace = 15 * time.Second

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
				if w.p.running() {
					r.miss(faultPause, "its worker was already paused")
				} else {
					r.miss(faultPause, "its worker was not running")
				}
				return
			}
			r.fault(faultPause, fmt.Sprintf("%s: SIGSTOP %sfor %v (TTL %v)", w.name, when, f.For.Round(time.Millisecond), r.cfg.ttl))
			hold()
			w.p.resume()
		}
		if !f.AtRequest {
			pause("")
			return
		}
		// claimed settles a race between the request and the run's end:
		// the pause is either injected or counted as missed, not both.
		var claimed atomic.Bool
		done := make(chan struct{})
		w.res.atNext(func() {
			defer close(done)
			if claimed.CompareAndSwap(false, true) {
				pause("as it sends a request to the resource, ")
			}
		})
		select {
		case <-done:
		case <-ctx.Done():
			if claimed.CompareAndSwap(false, true) {
				r.miss(faultPause, "the run was interrupted")
			}
		case <-r.ended: // never armed past the run
			if claimed.CompareAndSwap(false, true) {
				r.miss(faultPause, "its worker sent no request to the resource before the run ended")
			}
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
	case faultCrash, faultStop:
		nd := r.leader(ctx)
		if nd == nil {
			r.miss(f.Kind, "there was no leader to take down at the time")
			return
		}
		if !nd.busy.TryLock() {
			r.miss(f.Kind, "the node to take down was in another fault")
			return
		}
		defer nd.busy.Unlock()
		what := "fenced"
		if len(r.nodes) > 1 {
			what = "the leader, " + nd.id
		}
		if f.Kind == faultCrash {
			r.fault(faultCrash, fmt.Sprintf("kill -9 %s; restart after %v", what, f.For.Round(time.Millisecond)))
			nd.p.kill()
		} else {
			r.fault(faultStop, fmt.Sprintf("SIGTERM %s (a leader hands off first); restart after %v", what, f.For.Round(time.Millisecond)))
			nd.p.signal(syscall.SIGTERM)
			if !nd.p.wait(stopGrace) {
				r.fault("error", fmt.Sprintf("%s did not exit within %v of SIGTERM; killed", nd.id, stopGrace))
				nd.p.kill()
			}
		}
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
			r.miss(faultNodePartition, "there was no leader to cut off at the time")
			return
		}
		r.fault(faultNodePartition, fmt.Sprintf("%s: cut off from the other nodes for %v", nd.id, f.For.Round(time.Millisecond)))
		r.isolate(nd, true)
		hold()
		r.isolate(nd, false)
	case faultCorrupt, faultTruncate, faultRestore, faultFill:
		r.doStorage(ctx, f, hold)
	}
}
