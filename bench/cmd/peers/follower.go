package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/fence-dev/fence/client"
	"github.com/fence-dev/fence/guard"
	"github.com/fence-dev/fence/guard/follow"
)

// followerStats is what the follower of a fence-followed cell did, as it
// reports when it stops.
type followerStats struct {
	// Advanced is how many marks it advanced in its store (a grant's and a
	// closing's each, fewer when it fell behind and coalesced a scope's).
	Advanced uint64 `json:"advanced"`
	Resyncs  uint64 `json:"resyncs"`
	// MaxLag is the greatest Lag it reported, sampled every 50 ms from the
	// time it was ready until it stopped; Lag is the last.
	MaxLag time.Duration `json:"max_lag_ns"`
	Lag    time.Duration `json:"lag_ns"`
	// CPU is the follower process's own CPU time, from its start to its
	// stop: a little more than the measured time's (the server column has
	// it together with fenced's), to tell the two apart.
	CPU time.Duration `json:"cpu_ns"`
}

// followerMain runs guard/follow's Follower for every scope (prefix "")
// of the fenced at -fence, over a guard.MemoryStore: the follower a
// resource would attach to the lease service, with the cheapest store, so
// that what it costs the service (one more watcher of the leader's event
// ring) and the cores (the watch's delivery and decoding, the advances)
// shows. It prints readyLine once its watch is live: a lease it takes and
// releases after starting the follower has its closing token recorded in
// the store (it tries again every 100 ms until one has, as a lease that
// ended before the service took the watch is not in the stream). On
// SIGTERM it writes a followerStats to -stats.
func followerMain(args []string) error {
	fs := flag.NewFlagSet(roleFollower, flag.ContinueOnError)
	addr := fs.String("fence", "", "fenced address")
	statsPath := fs.String("stats", "", "file for the follower's figures, written when it stops")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *statsPath == "" {
		return errors.New("follower: no -stats file")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	c, err := client.New(*addr, client.WithHolder("bench-follower"))
	if err != nil {
		return err
	}
	defer c.Close()
	store := guard.NewMemoryStore()
	f := follow.New(c, store, "", follow.WithLogger(slog.New(slog.NewTextHandler(os.Stderr, nil))))
	fctx, cancel := context.WithCancel(ctx)
	var runErr error
	exited := make(chan struct{})
	go func() {
		runErr = f.Run(fctx)
		close(exited)
	}()
	defer func() {
		cancel()
		<-exited
	}()

	// closed waits up to 100 ms for the store to record a closing of probe
	// above token.
	const probe = "bench-follower-ready"
	closed := func(ctx context.Context, token uint64) (bool, error) {
		wait := time.NewTimer(100 * time.Millisecond)
		defer wait.Stop()
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for store.Highest(probe).Token <= token {
			select {
			case <-ctx.Done():
				return false, fmt.Errorf("no closing token of %s recorded: %w", probe, ctx.Err())
			case <-exited:
				return false, runErr
			case <-wait.C:
				return false, nil
			case <-tick.C:
			}
		}
		return true, nil
	}
	rctx, rcancel := context.WithTimeout(ctx, startBound)
	defer rcancel()
	for {
		l, err := c.Grant(rctx, probe)
		if err != nil {
			return fmt.Errorf("follower: grant %s: %w", probe, err)
		}
		if _, err := c.Release(rctx, probe, l.ID); err != nil {
			return fmt.Errorf("follower: release %s: %w", probe, err)
		}
		ok, err := closed(rctx, l.Token)
		if err != nil {
			return fmt.Errorf("follower: %w", err)
		}
		if ok {
			break
		}
	}
	fmt.Println(readyLine)

	var st followerStats
	sample := time.NewTicker(50 * time.Millisecond)
	defer sample.Stop()
	for ctx.Err() == nil {
		select {
		case <-ctx.Done():
		case <-exited:
			return fmt.Errorf("follower: %w", runErr)
		case <-sample.C:
			st.MaxLag = max(st.MaxLag, f.Lag())
		}
	}
	st.Lag = f.Lag()
	st.MaxLag = max(st.MaxLag, st.Lag)
	st.Advanced, st.Resyncs, st.CPU = f.Advanced(), f.Resyncs(), selfCPU()
	b, err := json.Marshal(st)
	if err != nil {
		return err
	}
	return os.WriteFile(*statsPath, b, 0o644)
}
