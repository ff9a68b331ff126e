package server

import (
	"context"
	"testing"
	"time"
)

// TestTokenFloor: a server that starts again on its data directory takes
// office above the wall clock, so its next token is above every token it
// granted before, and above the operator's TokenFloor when that is higher.
func TestTokenFloor(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	grant := func(edit func(*Config)) uint64 {
		t.Helper()
		s := startWith(t, func(c *Config) { c.DataDir = dir; edit(c) })
		c := newClient(t, s)
		l, err := c.Grant(ctx, "orders")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Release(ctx, "orders", l.ID); err != nil {
			t.Fatal(err)
		}
		if err := s.Close(ctx); err != nil {
			t.Fatal(err)
		}
		return l.Token
	}
	start := uint64(time.Now().UnixMicro())
	first := grant(func(*Config) {})
	if first <= start {
		t.Fatalf("first token %d, want above the clock floor %d", first, start)
	}
	restart := uint64(time.Now().UnixMicro())
	if second := grant(func(*Config) {}); second <= restart || second <= first {
		t.Fatalf("token %d after a restart, want above %d (the clock) and %d (the first)", second, restart, first)
	}
	const operator = 1 << 60
	if third := grant(func(c *Config) { c.TokenFloor = operator }); third <= operator {
		t.Fatalf("token %d with --token-floor %d, want above it", third, uint64(operator))
	}
	if fourth := grant(func(c *Config) { c.NoClockFloor = true }); fourth <= operator {
		t.Fatalf("token %d after a start without the clock floor, want above the floor %d raised before", fourth, uint64(operator))
	}
}
