package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/client"
)

// ack is a grant the service acknowledged to a client.
type ack struct {
	scope string
	token uint64
	epoch int // the fenced process that granted it; -1 if a crash fell inside the call
}

// TestCrashRestart kills fenced with SIGKILL 20 times while 16 clients
// acquire and release, restarting it on the same data dir each time. It
// checks invariants 1 and 4: tokens acknowledged before a crash are lower
// than every token granted after it, no token is issued twice for a scope,
// and no acknowledged grant is forgotten. It runs on each Raft log store.
func TestCrashRestart(t *testing.T) {
	for _, log := range []string{"bolt", "wal"} {
		t.Run(log, func(t *testing.T) { crashRestart(t, "--raft-log", log) })
	}
}

func crashRestart(t *testing.T, args ...string) {
	const (
		clients = 16
		scopes  = 4
	)
	crashes := 20
	if os.Getenv("FENCE_LONG") != "" {
		crashes = 100 // make test-long
	}
	dir, addr := t.TempDir(), freeAddr(t)
	p := startFenced(t, dir, addr, args...)

	var (
		epoch atomic.Int64
		mu    sync.Mutex
		acks  []ack
		stop  = make(chan struct{})
		wg    sync.WaitGroup
	)
	for i := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := client.New(addr, client.WithRetryTimeout(time.Minute), client.WithHolder(fmt.Sprintf("worker-%d", i)))
			if err != nil {
				t.Error(err)
				return
			}
			defer c.Close()
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				scope := fmt.Sprintf("crash/%d", rand.IntN(scopes))
				opts := []client.AcquireOption{client.WithTTL(2 * time.Second)}
				if i%2 == 0 {
					opts = append(opts, client.WithWait())
				}
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				before := epoch.Load()
				l, err := c.Grant(ctx, scope, opts...)
				after := epoch.Load()
				cancel()
				switch {
				case errors.Is(err, fence.ErrHeld), errors.Is(err, fence.ErrLeaseLost):
					// Held by another worker, or the grant of this very
					// request ID already ended (it was granted, then expired
					// during a crash): both are correct answers.
					continue
				case errors.Is(err, context.DeadlineExceeded):
					continue // a wait that outlasted its deadline
				case err != nil:
					t.Errorf("worker %d: %v", i, err)
					return
				}
				e := int(before)
				if before != after {
					e = -1
				}
				mu.Lock()
				acks = append(acks, ack{scope: scope, token: l.Token, epoch: e})
				mu.Unlock()
				// A release delayed by crashes may find the lease expired
				// and superseded: lost, or unknown by now.
				_, err = c.Release(context.Background(), scope, l.ID)
				if err != nil && !errors.Is(err, fence.ErrLeaseLost) && !errors.Is(err, fence.ErrNotHolder) {
					t.Errorf("worker %d: %v", i, err)
					return
				}
			}
		}()
	}

	// One long lease per epoch, never released: after every restart it must
	// still be held with the same token.
	kept := map[string]fence.Lease{}
	admin, err := client.New(addr, client.WithRetryTimeout(20*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for k := range crashes {
		scope := fmt.Sprintf("kept/%d", k)
		l, err := admin.Grant(context.Background(), scope, client.WithTTL(5*time.Minute))
		if err != nil {
			t.Fatalf("crash %d: grant %s: %v", k, scope, err)
		}
		kept[scope] = l
		time.Sleep(time.Duration(200+rand.IntN(600)) * time.Millisecond)
		p.kill(t)
		epoch.Add(1)
		p = startFenced(t, dir, addr, args...)
		for scope, want := range kept {
			st, err := admin.Get(context.Background(), scope)
			if err != nil {
				t.Fatalf("after crash %d: get %s: %v", k, scope, err)
			}
			if st.Lease == nil || st.Lease.Token != want.Token {
				t.Fatalf("after crash %d: acknowledged grant %s token %d forgotten: now %+v", k, scope, want.Token, st)
			}
		}
	}
	time.Sleep(300 * time.Millisecond)
	close(stop)
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	if len(acks) < crashes*clients {
		t.Fatalf("only %d grants acknowledged over %d crashes; the workload did not run", len(acks), crashes)
	}
	checkAcks(t, acks)

	// Every acknowledged token is at or below the counter the service has
	// now: nothing acknowledged was rolled back.
	highest := map[string]uint64{}
	for _, a := range acks {
		highest[a.scope] = max(highest[a.scope], a.token)
	}
	for scope, h := range highest {
		st, err := admin.Get(context.Background(), scope)
		if err != nil {
			t.Fatal(err)
		}
		if st.LastToken < h {
			t.Errorf("%s: last token %d is below acknowledged token %d", scope, st.LastToken, h)
		}
	}
	t.Logf("%d grants acknowledged across %d kill -9 restarts", len(acks), crashes)
}

// checkAcks checks that no token repeats per scope and that, per scope,
// every token of an earlier process is below every token of a later one.
func checkAcks(t *testing.T, acks []ack) {
	t.Helper()
	seen := map[ack]bool{}
	type span struct{ lo, hi uint64 }
	spans := map[string]map[int]*span{}
	for _, a := range acks {
		key := ack{scope: a.scope, token: a.token}
		if seen[key] {
			t.Errorf("token %d of %s was granted twice", a.token, a.scope)
		}
		seen[key] = true
		if a.epoch < 0 {
			continue
		}
		if spans[a.scope] == nil {
			spans[a.scope] = map[int]*span{}
		}
		s := spans[a.scope][a.epoch]
		if s == nil {
			s = &span{lo: a.token, hi: a.token}
			spans[a.scope][a.epoch] = s
		}
		s.lo, s.hi = min(s.lo, a.token), max(s.hi, a.token)
	}
	for scope, byEpoch := range spans {
		for e, s := range byEpoch {
			for later, l := range byEpoch {
				if later > e && l.lo <= s.hi {
					t.Errorf("%s: process %d granted token %d after process %d had acknowledged %d", scope, later, l.lo, e, s.hi)
				}
			}
		}
	}
}

// TestRestartGrace checks invariant 5: a lease granted with a TTL of 5s
// just before a kill -9 is not granted to anyone else until at least 5s
// after the restart, because the restarted service gives every held lease a
// full TTL before expiring anything.
func TestRestartGrace(t *testing.T) {
	const ttl = 5 * time.Second
	dir, addr := t.TempDir(), freeAddr(t)
	p := startFenced(t, dir, addr)
	c, err := client.New(addr, client.WithRetryTimeout(20*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	first, err := c.Grant(context.Background(), "grace", client.WithTTL(ttl), client.WithHolder("first"))
	if err != nil {
		t.Fatal(err)
	}
	p.kill(t)
	restarted := time.Now()
	startFenced(t, dir, addr)

	var second fence.Lease
	for {
		second, err = c.Grant(context.Background(), "grace", client.WithTTL(ttl), client.WithHolder("second"))
		if err == nil {
			break
		}
		var held *fence.HeldError
		if !errors.As(err, &held) {
			t.Fatal(err)
		}
		if held.Token != first.Token || held.Holder != "first" {
			t.Fatalf("held by %q token %d, want first's token %d", held.Holder, held.Token, first.Token)
		}
		if time.Since(restarted) > 3*ttl {
			t.Fatalf("the lease was never expired after the restart: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if got := time.Since(restarted); got < ttl {
		t.Fatalf("second holder got the scope %v after the restart, before the first lease's full TTL %v", got, ttl)
	}
	if second.Token <= first.Token {
		t.Fatalf("second token %d is not above first token %d", second.Token, first.Token)
	}
}
