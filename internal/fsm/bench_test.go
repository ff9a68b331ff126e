package fsm

import (
	"fmt"
	"testing"
	"time"

	"github.com/fence-dev/fence"
)

// BenchmarkHeldPage lists a page of 100 held scopes from the middle of a
// state holding 100,000: what a List call or a refresh of the status page
// costs the state's lock.
func BenchmarkHeldPage(b *testing.B) {
	s := New()
	const n = 100_000
	for i := range n {
		r := s.Apply(Command{Op: OpAcquire, Scope: fmt.Sprintf("scope/%06d", i), LeaseID: fence.NewLeaseID(), TTL: time.Minute})
		if r.Outcome != Granted {
			b.Fatal(r.Outcome)
		}
	}
	after := fmt.Sprintf("scope/%06d", n/2)
	for b.Loop() {
		if page := s.Held("scope/", after, 100); len(page) != 100 {
			b.Fatalf("%d scopes", len(page))
		}
	}
}
