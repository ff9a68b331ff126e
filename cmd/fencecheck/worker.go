package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"hash/fnv"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/client"
	"github.com/fence-dev/fence/guard/httpguard"
	"github.com/fence-dev/fence/internal/history"
)

// worker is one client process: it acquires a scope, read-modify-writes
// the scope's register at the resource a few times with its token, and
// releases the lease or lets it run out; then again, until its time is
// up. It judges its lease's validity on its own clock, which runs at rate
// times real time: a worker with rate < 1 believes its lease valid for
// longer than it is, and renews late (the clock-drift fault).
type worker struct {
	name     string
	c        *client.Client
	resource string // base URL
	hc       *http.Client
	h        *history.Writer
	rng      *rand.Rand
	scopes   []string
	ttl      time.Duration
	rate     float64
	op       int64
}

func workerCmd(args []string) error {
	fs := flag.NewFlagSet("fencecheck worker", flag.ContinueOnError)
	name := fs.String("name", "w1", "process name in the history")
	fenced := fs.String("fenced", "", "fenced address(es), comma-separated")
	resource := fs.String("resource", "", "resource address")
	histPath := fs.String("history", "", "history file to write")
	scopes := fs.String("scopes", "bolt/0", "comma-separated scopes to work on")
	ttl := fs.Duration("ttl", time.Second, "lease TTL")
	rate := fs.Float64("clock-rate", 1, "how fast this worker's clock runs, relative to real time")
	d := fs.Duration("time", 20*time.Second, "stop after this long")
	maxOps := fs.Int("max-ops", 100000, "stop after this many operations")
	seed := fs.Uint64("seed", 1, "random seed")
	if err := fs.Parse(args); err != nil {
		return usageError{err}
	}
	if *fenced == "" || *resource == "" || *histPath == "" || *rate <= 0 {
		return usageError{errors.New("worker: --fenced, --resource, --history and a positive --clock-rate are required")}
	}
	c, err := client.New(*fenced, client.WithHolder(*name), client.WithRetryTimeout(2*time.Second))
	if err != nil {
		return err
	}
	defer c.Close()
	h, err := history.Create(*histPath)
	if err != nil {
		return err
	}
	defer h.Close()
	hs := fnv.New64a()
	hs.Write([]byte(*name))
	w := &worker{
		name: *name, c: c, resource: "http://" + *resource, h: h,
		// One connection per request, so that the proxy in front of the
		// resource can hold back exactly one request.
		hc:     &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 15 * time.Second},
		rng:    rand.New(rand.NewPCG(*seed, hs.Sum64())),
		scopes: strings.Split(*scopes, ","),
		ttl:    *ttl,
		rate:   *rate,
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, *d)
	defer cancel()
	for w.op < int64(*maxOps) && ctx.Err() == nil {
		w.epoch(ctx)
	}
	return nil
}

// elapsed is how much time the worker believes has passed since t.
func (w *worker) elapsed(t time.Time) time.Duration {
	return time.Duration(float64(time.Since(t)) * w.rate)
}

// begin records the invocation of a new operation.
func (w *worker) begin(e history.Event) history.Event {
	w.op++
	e.Type, e.Proc, e.Op = history.Invoke, w.name, w.op
	return w.h.Add(e)
}

// end records the completion of call.
func (w *worker) end(call history.Event, t history.Type, e history.Event) {
	e.Type, e.Proc, e.Op = t, call.Proc, call.Op
	w.h.Add(e)
}

// outcome classifies a fenced call's error.
func outcome(err error) (history.Type, string) {
	switch {
	case errors.Is(err, fence.ErrHeld):
		return history.Fail, history.ReasonHeld
	case errors.Is(err, fence.ErrLeaseLost), errors.Is(err, fence.ErrNotHolder):
		return history.Fail, history.ReasonLost
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return history.Info, history.ReasonTimeout
	}
	return history.Info, history.ReasonError
}

// epoch is one lease: acquire, a few read-modify-write cycles, release or
// abandon.
func (w *worker) epoch(ctx context.Context) {
	scope := w.scopes[w.rng.IntN(len(w.scopes))]
	call := w.begin(history.Event{F: history.Acquire, Scope: scope})
	sent := time.Now()
	actx, cancel := context.WithTimeout(ctx, 3*w.ttl)
	l, err := w.c.Grant(actx, scope, client.WithTTL(w.ttl), client.WithWait())
	cancel()
	if err != nil {
		t, why := outcome(err)
		w.end(call, t, history.Event{Reason: why, Err: err.Error()})
		if t == history.Fail {
			sleep(ctx, time.Duration(w.rng.IntN(100))*time.Millisecond)
		}
		return
	}
	w.end(call, history.OK, history.Event{Token: l.Token})
	// The lease counts from when the acquire was sent: the service's
	// deadline starts later, so this errs on the safe side (on a true clock).
	validFrom := sent
	margin := w.ttl / 10
	var seq uint64
	cycles := 1 + w.rng.IntN(4)
	for i := 0; i < cycles && ctx.Err() == nil; i++ {
		if w.elapsed(validFrom) >= w.ttl-margin {
			break // by this worker's clock, the lease has run out
		}
		if w.elapsed(validFrom) >= w.ttl/2 {
			call := w.begin(history.Event{F: history.Renew, Scope: scope, Token: l.Token})
			rsent := time.Now()
			rctx, cancel := context.WithTimeout(ctx, w.ttl)
			_, err := w.c.Renew(rctx, scope, l.ID)
			cancel()
			if err != nil {
				t, why := outcome(err)
				w.end(call, t, history.Event{Reason: why, Err: err.Error()})
				if why == history.ReasonLost {
					return
				}
				continue // transient: the next cycle decides by the clock
			}
			w.end(call, history.OK, history.Event{Token: l.Token})
			validFrom = rsent
		}
		seq++
		cur, ok := w.request(ctx, history.Read, l.FencingToken(), seq, "")
		if !ok {
			return // refused as stale, or unknown: this lease is done
		}
		// Think: the window in which a pause or a late timer makes the
		// write that follows stale.
		sleep(ctx, time.Duration(10+w.rng.IntN(90))*time.Millisecond)
		seq++
		if _, ok := w.request(ctx, history.Write, l.FencingToken(), seq, cur); !ok {
			return
		}
		sleep(ctx, time.Duration(w.rng.IntN(20))*time.Millisecond)
	}
	if w.rng.IntN(4) == 0 {
		return // let the lease run out
	}
	call = w.begin(history.Event{F: history.Release, Scope: scope, Token: l.Token})
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.ttl)
	_, err = w.c.Release(rctx, scope, l.ID)
	cancel()
	if err != nil {
		t, why := outcome(err)
		w.end(call, t, history.Event{Reason: why, Err: err.Error()})
		return
	}
	w.end(call, history.OK, history.Event{})
}

// request sends one read or write (of the value after from) with the
// lease's token (signed, if the service signs) and records it. It reports the value read or written and whether the lease
// may go on: false after a stale rejection (the lease is lost) or an
// unknown outcome.
func (w *worker) request(ctx context.Context, kind string, token fence.Token, seq uint64, from string) (string, bool) {
	scope := token.Scope
	e := history.Event{F: kind, Scope: scope, Token: token.Value, Seq: seq}
	if kind == history.Write {
		e.From = from
		e.Value = next(from, history.OpID(w.name, w.op+1))
	}
	call := w.begin(e)
	body, _ := json.Marshal(opRequest{Kind: kind, Value: e.Value})
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, w.resource+"/op/"+scope, bytes.NewReader(body))
	req.Header.Set(httpguard.TokenHeader, token.String())
	req.Header.Set(httpguard.SequenceHeader, strconv.FormatUint(seq, 10))
	req.Header.Set(RefHeader, call.ID())
	resp, err := w.hc.Do(req)
	if err != nil {
		w.end(call, history.Info, history.Event{Reason: history.ReasonTimeout, Err: err.Error()})
		return "", false
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	switch {
	case err != nil:
		w.end(call, history.Info, history.Event{Reason: history.ReasonError, Err: err.Error()})
		return "", false
	case resp.StatusCode == http.StatusConflict:
		w.end(call, history.Fail, history.Event{Reason: history.ReasonStale, Err: strings.TrimSpace(string(b))})
		return "", false
	case resp.StatusCode == http.StatusBadRequest:
		w.end(call, history.Fail, history.Event{Reason: history.ReasonError, Err: strings.TrimSpace(string(b))})
		return "", false
	case resp.StatusCode != http.StatusOK:
		// A server error may come after the write committed.
		w.end(call, history.Info, history.Event{Reason: history.ReasonError, Err: fmt.Sprintf("%s: %s", resp.Status, bytes.TrimSpace(b))})
		return "", false
	}
	var r opResponse
	if err := json.Unmarshal(b, &r); err != nil {
		w.end(call, history.Info, history.Event{Reason: history.ReasonError, Err: err.Error()})
		return "", false
	}
	w.end(call, history.OK, history.Event{Value: r.Value, Index: r.Index})
	return r.Value, true
}

// next returns the value a write by op puts after from: "N/OPID", N one
// more than from's.
func next(from, op string) string {
	n := 0
	if v, _, ok := strings.Cut(from, "/"); ok {
		n, _ = strconv.Atoi(v)
	}
	return fmt.Sprintf("%d/%s", n+1, op)
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
