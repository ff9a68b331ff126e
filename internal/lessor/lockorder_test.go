package lessor

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/internal/fsm"
)

// TestRenewWhileTakingOffice renews leases from many goroutines while the
// node takes office again and again and acquires and releases are applied:
// renewals, taking office and the state machine's writer all take the
// deadlines lock and the state lock, and must not wait on each other in a
// cycle. A hang is reported with every goroutine's stack.
func TestRenewWhileTakingOffice(t *testing.T) {
	l, node := startLessor(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const held = 2000
	ids := make([]fence.LeaseID, held)
	for i := range ids {
		ids[i] = fence.NewLeaseID()
		c := fsm.Command{Op: fsm.OpAcquire, Scope: fmt.Sprintf("s%d", i), LeaseID: ids[i], Holder: "h", TTL: time.Minute, At: time.Now().UnixNano()}
		if _, err := node.Apply(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := g; ; i = (i + 8) % held {
				select {
				case <-stop:
					return
				default:
				}
				l.RenewBatch(ctx, []Renewal{{Scope: fmt.Sprintf("s%d", i), ID: ids[i]}}, make([]Renewed, 1))
			}
		})
	}
	for g := range 2 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				scope, id := fmt.Sprintf("churn%d-%d", g, i%16), fence.NewLeaseID()
				node.Apply(ctx, fsm.Command{Op: fsm.OpAcquire, Scope: scope, LeaseID: id, Holder: "h", TTL: time.Minute, At: time.Now().UnixNano()})
				node.Apply(ctx, fsm.Command{Op: fsm.OpRelease, Scope: scope, LeaseID: id, At: time.Now().UnixNano()})
			}
		})
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 50 {
			l.Lead(false)
			l.Lead(true)
			for !l.Ready() {
				time.Sleep(time.Millisecond)
			}
		}
		close(stop)
		wg.Wait()
	}()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		// The deadlocked goroutines cannot be stopped, nor the server
		// closed: the cleanups would hang too. Say so and stop here.
		buf := make([]byte, 8<<20)
		buf = buf[:runtime.Stack(buf, true)]
		fmt.Fprintf(os.Stderr, "%s\n--- FAIL: %s: renewals, taking office and applies stuck for 60s: deadlock\n", buf, t.Name())
		os.Exit(1)
	}
}
