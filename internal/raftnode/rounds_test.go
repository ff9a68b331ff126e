package raftnode

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

type startedAs int64

func (s startedAs) Error() string { return "round" }

// TestRoundsStartAfterJoin: a confirmation is answered by a round that
// started after it came, never by the one already running (whose Barrier
// may have been committed by answers sent before it came), and callers that
// wait at once share rounds.
func TestRoundsStartAfterJoin(t *testing.T) {
	var (
		started atomic.Int64
		wg      sync.WaitGroup
		calls   atomic.Int64
	)
	rs := rounds{run: func() error {
		n := started.Add(1)
		time.Sleep(200 * time.Microsecond) // a Barrier's round trip
		return startedAs(n)
	}}
	for range 64 {
		wg.Go(func() {
			for range 50 {
				before := started.Load()
				r := rs.join()
				<-r.done
				var n startedAs
				if !errors.As(r.err, &n) || int64(n) <= before {
					t.Errorf("answered by round %d, which started before the call (after %d rounds)", n, before)
					return
				}
				calls.Add(1)
			}
		})
	}
	wg.Wait()
	if calls.Load() != 64*50 {
		t.Fatalf("%d confirmations answered, want %d", calls.Load(), 64*50)
	}
	if n := started.Load(); n >= calls.Load()/2 {
		t.Errorf("%d rounds for %d confirmations: waiting callers do not share them", n, calls.Load())
	}
	t.Logf("%d rounds for %d confirmations", started.Load(), calls.Load())
	// The last round's goroutine ends once no one joined it meanwhile.
	idle := func() bool {
		rs.mu.Lock()
		defer rs.mu.Unlock()
		return !rs.running && rs.next == nil
	}
	for deadline := time.Now().Add(10 * time.Second); !idle(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("rounds still running 10s after the last confirmation")
		}
	}
}
