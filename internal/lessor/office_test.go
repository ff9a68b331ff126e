package lessor

import (
	"testing"
	"time"
)

// TestDeposedNodeNotReady deposes a new leader at the last moment of taking
// office, and deposes and re-elects it there: a deposed office must never
// make the node ready, nor make it ready before the next office has taken
// office itself. The test hook runs where a real loss of leadership can
// arrive: between the last step of taking office and serving.
func TestDeposedNodeNotReady(t *testing.T) {
	l, _ := startLessor(t)
	hook := make(chan func(), 1)
	l.beforeReady = func() {
		select {
		case f := <-hook:
			f()
		default:
		}
	}
	awaitReady := func(want bool, within time.Duration) {
		t.Helper()
		for end := time.Now().Add(within); l.Ready() != want; time.Sleep(time.Millisecond) {
			if time.Now().After(end) {
				t.Fatalf("Ready() = %v for %v, want %v", !want, within, want)
			}
		}
	}
	for i := range 20 {
		// Deposed: the node must stay not ready.
		l.Lead(false)
		hook <- func() { l.Lead(false) }
		l.Lead(true)
		for len(hook) > 0 {
			time.Sleep(time.Millisecond)
		}
		for end := time.Now().Add(50 * time.Millisecond); time.Now().Before(end); time.Sleep(time.Millisecond) {
			if l.Ready() {
				t.Fatalf("round %d: a node deposed while taking office is ready", i)
			}
		}
		// Deposed and elected again: only the new office makes it ready.
		hook <- func() {
			hook <- func() {
				if l.Ready() {
					t.Errorf("round %d: ready before the new office took office", i)
				}
			}
			l.Lead(false)
			l.Lead(true)
		}
		l.Lead(true)
		awaitReady(true, 20*time.Second)
	}
}
