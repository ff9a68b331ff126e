package main

import (
	"strings"
	"testing"
)

// TestDemo runs `fencectl demo`: with the guard on both stale writes are
// rejected and B's value stays; with it off both stories end in a lost
// update, which shows the guard is what makes the difference.
func TestDemo(t *testing.T) {
	r := (&fenced{}).want(t, exitOK, "demo")
	if n := strings.Count(r.stdout, "rejected as stale"); n != 2 {
		t.Errorf("%d stale rejections, want 2 (the guarded stories)\n%s", n, r.stdout)
	}
	if n := strings.Count(r.stdout, "LOST UPDATE"); n != 2 {
		t.Errorf("%d lost updates, want 2 (the unguarded stories)\n%s", n, r.stdout)
	}
	if !strings.Contains(r.stdout, "every stale write was rejected") {
		t.Errorf("no verdict line\n%s", r.stdout)
	}
}
