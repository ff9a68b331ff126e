package main

import (
	"strings"
	"testing"
)

// TestDemo runs `fencectl demo` with each register store: with the guard
// on both stale writes are rejected and B's value stays; with it off both
// stories end in a lost update, which shows the guard is what makes the
// difference.
func TestDemo(t *testing.T) {
	for _, tc := range []struct {
		args  []string
		store string
	}{
		{[]string{"demo"}, "SQLite via sqlguard"}, // the default
		{[]string{"demo", "--store", "bolt"}, "bbolt via boltguard"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			r := (&fenced{}).want(t, exitOK, tc.args...)
			if n := strings.Count(r.stdout, "rejected as stale"); n != 2 {
				t.Errorf("%d stale rejections, want 2 (the guarded stories)\n%s", n, r.stdout)
			}
			if n := strings.Count(r.stdout, "LOST UPDATE"); n != 2 {
				t.Errorf("%d lost updates, want 2 (the unguarded stories)\n%s", n, r.stdout)
			}
			if n := strings.Count(r.stdout, "register in "+tc.store); n != 4 {
				t.Errorf("%d stories name the store %q, want 4\n%s", n, tc.store, r.stdout)
			}
			if !strings.Contains(r.stdout, "every stale write was rejected") {
				t.Errorf("no verdict line\n%s", r.stdout)
			}
		})
	}
}

func TestDemoUnknownStore(t *testing.T) {
	r := (&fenced{}).want(t, exitUsage, "demo", "--store", "redis")
	if !strings.Contains(r.stderr, "want sqlite or bolt") {
		t.Errorf("stderr does not say which stores exist: %s", r.stderr)
	}
}
