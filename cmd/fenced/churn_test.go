package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fence-dev/fence/client"
	"github.com/fence-dev/fence/internal/scrape"
)

// TestScopeChurnStaysBounded acquires and releases many distinct scopes,
// each once, as a service that locks one scope per order or job does. The
// node must keep a bounded number of scope records (fence_scope_records),
// so its memory stays flat. make test-long runs a million scopes and logs
// the resident set at every tenth; make test runs 20,000, enough to see
// the records bound (4,096 idle ones are kept) and fast.
func TestScopeChurnStaysBounded(t *testing.T) {
	n := 20_000
	if os.Getenv("FENCE_LONG") != "" {
		n = 1_000_000
	}
	const workers = 32
	dir, addr := t.TempDir(), freeAddr(t)
	p := startFenced(t, dir, addr)
	c := newClient(t, addr, client.WithRetryTimeout(30*time.Second))
	ctx := context.Background()

	var next atomic.Int64
	checkpoint := func(done int) {
		t.Helper()
		records := scrape.Value(t, addr, "fence_scope_records")
		if records > 4096+workers {
			t.Fatalf("after %d scopes: %v scope records, want at most the 4,096 idle ones kept plus %d held", done, records, workers)
		}
		t.Logf("%8d scopes: %6.0f records, RSS %4d MiB", done, records, rss(t, p.cmd.Process.Pid)>>20)
	}
	for part := 1; part <= 10; part++ {
		end := int64(n * part / 10)
		var wg sync.WaitGroup
		for range workers {
			wg.Go(func() {
				for i := next.Add(1); i <= end; i = next.Add(1) {
					scope := fmt.Sprintf("orders/%d", i)
					l, err := c.Grant(ctx, scope, client.WithTTL(time.Minute))
					if err != nil {
						t.Errorf("grant %s: %v", scope, err)
						return
					}
					if _, err := c.Release(ctx, scope, l.ID); err != nil {
						t.Errorf("release %s: %v", scope, err)
						return
					}
				}
			})
		}
		wg.Wait()
		if t.Failed() {
			return
		}
		next.Store(end)
		checkpoint(int(end))
	}
	// A scope used before, and surely dropped by now, is granted above
	// every token it had.
	l, err := c.Grant(ctx, "orders/1")
	if err != nil {
		t.Fatal(err)
	}
	if l.Token <= 1 {
		t.Fatalf("orders/1 granted again with token %d, not above its first grant's 1", l.Token)
	}
}

// rss returns a process's resident set in bytes, from /proc.
func rss(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				t.Fatalf("VmRSS %q: %v", v, err)
			}
			return kb << 10
		}
	}
	t.Fatal("no VmRSS in /proc status")
	return 0
}
