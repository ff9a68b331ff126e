package eventlog

import (
	"fmt"
	"testing"
	"time"
)

func TestRejectionLogWindow(t *testing.T) {
	l := NewRejections()
	now := time.Now()
	l.Add(Rejection{Scope: "old", Presented: 1, Highest: 2, At: now.Add(-2 * rejectionWindow)})
	for i := range 3 {
		l.Add(Rejection{Scope: "busy", Presented: uint64(i + 1), Highest: 9, At: now.Add(-time.Duration(i) * time.Minute)})
	}
	l.Add(Rejection{Scope: "once", Presented: 4, Highest: 5, At: now})
	l.AddDropped(7)
	counts, recent, dropped := l.Summary(now)
	if len(counts) != 2 || counts[0].Scope != "busy" || counts[0].Count != 3 || counts[1].Scope != "once" || counts[1].Count != 1 {
		t.Fatalf("counts = %+v, want busy 3 then once 1 (old is outside the window)", counts)
	}
	if counts[0].Last.Presented != 1 {
		t.Errorf("busy's latest example = %+v, want the one at now (token 1)", counts[0].Last)
	}
	if len(recent) != 5 || recent[0].Scope != "once" || recent[4].Scope != "old" || dropped != 7 {
		t.Errorf("recent = %+v, dropped %d; want all five, newest first, and 7", recent, dropped)
	}
}

func TestRejectionLogBounds(t *testing.T) {
	l := NewRejections()
	now := time.Now()
	for i := range maxRejectedScopes + 10 {
		l.Add(Rejection{Scope: fmt.Sprint("s", i), Presented: 1, Highest: 2, At: now.Add(time.Duration(i) * time.Millisecond)})
	}
	counts, recent, _ := l.Summary(now.Add(time.Second))
	if len(counts) != maxRejectedScopes || len(recent) != recentRejections {
		t.Fatalf("%d scopes and %d examples kept, want %d and %d", len(counts), len(recent), maxRejectedScopes, recentRejections)
	}
	for _, c := range counts {
		if c.Scope == "s0" {
			t.Fatal("the scope rejected longest ago was kept")
		}
	}
}
