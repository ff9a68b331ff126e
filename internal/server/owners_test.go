package server

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/internal/fsm"
)

// heldBy returns how many leases the owners count for holder h (auth off),
// asking Admit, which refuses at the limit: the count is the one limit it
// refuses and the next it admits.
func heldBy(t *testing.T, s *Server, h string) int {
	t.Helper()
	c := fsm.Command{Op: fsm.OpAcquire, Scope: "probe", Holder: h}
	for n := range 100_000 {
		done, err := s.owners.Admit(c, n+1, 0)
		if err == nil {
			done()
			return n
		}
	}
	t.Fatalf("holder %s counts 100,000 leases or more", h)
	return 0
}

// TestOwnersCountEachLeaseOnce: the leases counted per owner stay those of
// the state when the node takes office while grants and releases are
// applied: no transition counted twice, none missed. Each round leaves and
// takes office again under two writers of batches of fsm.MaxBatch acquires and
// their releases, then compares the count with the state.
func TestOwnersCountEachLeaseOnce(t *testing.T) {
	s := startWith(t, func(c *Config) { c.MaxLeasesPerIdentity = 0 })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const holder = "h"
	for round := range 100 {
		stop := make(chan struct{})
		var wg sync.WaitGroup
		errs := make(chan error, 2)
		for w := range 2 {
			wg.Go(func() {
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					cs := make([]fsm.Command, fsm.MaxBatch)
					for k := range cs {
						cs[k] = fsm.Command{Op: fsm.OpAcquire, Scope: fmt.Sprintf("w%d/%d", w, k), LeaseID: fence.NewLeaseID(), Holder: holder, TTL: time.Minute, At: time.Now().UnixNano()}
					}
					rs, err := s.lessor.Batch(ctx, cs)
					if err != nil {
						errs <- err
						return
					}
					var rel []fsm.Command
					for k, r := range rs {
						if r.Outcome == fsm.Granted {
							rel = append(rel, fsm.Command{Op: fsm.OpRelease, Scope: cs[k].Scope, LeaseID: cs[k].LeaseID, At: time.Now().UnixNano()})
						}
					}
					if len(rel) > 0 {
						if _, err := s.lessor.Batch(ctx, rel); err != nil {
							errs <- err
							return
						}
					}
				}
			})
		}
		s.lessor.Lead(false)
		s.lessor.Lead(true)
		for end := time.Now().Add(20 * time.Second); !s.Ready(); time.Sleep(time.Millisecond) {
			if time.Now().After(end) {
				t.Fatal("not ready again within 20s")
			}
		}
		close(stop)
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		want := 0
		s.node.Read(func(st *fsm.State) {
			for _, l := range st.Leases() {
				if l.Holder == holder {
					want++
				}
			}
		})
		if got := heldBy(t, s, holder); got != want {
			t.Fatalf("round %d: %d leases counted for %s after taking office, the state has %d", round, got, holder, want)
		}
	}
}
