package fsm

import (
	"errors"
	"testing"
)

func TestMaxWaitersBoundsTheLine(t *testing.T) {
	s := New()
	s.Apply(acquire("a", 1))
	for n := byte(2); n <= 3; n++ {
		c := acquire("a", n)
		c.Wait, c.MaxWaiters = true, 2
		if r := s.Apply(c); r.Outcome != Queued {
			t.Fatalf("waiter %d: %v, want queued", n-1, r.Outcome)
		}
	}
	c := acquire("a", 4)
	c.Wait, c.MaxWaiters = true, 2
	r := s.Apply(c)
	if r.Outcome != Held || !errors.Is(r.Err, ErrLineFull) || r.Lease.Token != 1 {
		t.Fatalf("a third waiter with a limit of 2: %v %v (token %d); want held, line full, by token 1", r.Outcome, r.Err, r.Lease.Token)
	}
	if got := s.Get("a").Waiters; got != 2 {
		t.Fatalf("%d waiters after a refused one; want 2", got)
	}
	c.MaxWaiters = 0
	if r := s.Apply(c); r.Outcome != Queued {
		t.Fatalf("without a limit: %v, want queued", r.Outcome)
	}
	c = acquire("a", 5)
	c.MaxWaiters = -1
	if r := s.Apply(c); r.Outcome != Invalid {
		t.Fatalf("a negative limit: %v, want invalid", r.Outcome)
	}
}
