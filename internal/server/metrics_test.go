package server_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/client"
	"github.com/fence-dev/fence/fencetest"
	"github.com/fence-dev/fence/internal/scrape"
	"github.com/fence-dev/fence/internal/version"
)

// awaitExpiry polls until scope is free: its lease expired (bounded by the
// test's context, not by a timing threshold).
func awaitExpiry(ctx context.Context, t testing.TB, c *client.Client, scope string) {
	t.Helper()
	for {
		st, err := c.Get(ctx, scope)
		if err != nil {
			t.Fatalf("get %q: %v", scope, err)
		}
		if st.Lease == nil {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%q never expired: %v", scope, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// TestMetrics drives a real server through grants, a renewal, a release, a
// wait, a change of holder, an expiry and a renewal answered lost, then
// reads each from /metrics.
func TestMetrics(t *testing.T) {
	ctx := testContext(t)
	srv := fencetest.NewServer()
	defer srv.Close()
	c := srv.Client(client.WithHolder("alice"), client.WithTTL(10*time.Second))
	defer c.Close()

	// Grant, renew, release "orders" as alice; then bob gets it: a
	// transition.
	a, err := c.Grant(ctx, "orders")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Renew(ctx, "orders", a.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Release(ctx, "orders", a.ID); err != nil {
		t.Fatal(err)
	}
	b, err := c.Grant(ctx, "orders", client.WithHolder("bob"))
	if err != nil {
		t.Fatal(err)
	}
	// carol waits for bob's lease and is granted it when he releases.
	type result struct {
		l   fence.Lease
		err error
	}
	waited := make(chan result, 1)
	go func() {
		l, err := c.Grant(ctx, "orders", client.WithHolder("carol"), client.WithWait())
		waited <- result{l, err}
	}()
	for {
		st, err := c.Get(ctx, "orders")
		if err != nil {
			t.Fatal(err)
		}
		if st.Waiters == 1 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("carol never queued: %v", ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
	if _, err := c.Release(ctx, "orders", b.ID); err != nil {
		t.Fatal(err)
	}
	r := <-waited
	// Tokens 1 (alice) and 3 (bob), each closed by the next value.
	if r.err != nil || r.l.Token != 5 {
		t.Fatalf("waiting grant = %+v, %v; want token 5", r.l, r.err)
	}
	// "jobs" is granted for the minimum TTL and never renewed: it expires,
	// and renewing it afterwards is answered lost.
	j, err := c.Grant(ctx, "jobs", client.WithTTL(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	awaitExpiry(ctx, t, c, "jobs")
	if _, err := c.Renew(ctx, "jobs", j.ID); !errors.Is(err, fence.ErrLeaseLost) {
		t.Fatalf("renewing an expired lease: %v, want lost", err)
	}

	fams := scrape.Families(t, srv.Addr)
	want := []struct {
		name   string
		labels []string
		value  float64
	}{
		{"fence_lease_grants_total", nil, 4}, // alice, bob, carol, jobs
		{"fence_lease_renewals_total", nil, 1},
		{"fence_lease_releases_total", nil, 2},
		{"fence_lease_expirations_total", nil, 1},
		{"fence_lease_losses_total", nil, 1},
		{"fence_lease_transitions_total", nil, 2}, // alice → bob → carol
		{"fence_leases_held", nil, 1},             // carol's
		{"fence_acquire_waits_total", nil, 1},
		{"fence_acquire_waiting", nil, 0},
		{"fence_acquire_wait_seconds", []string{"outcome", "granted"}, 1},
		{"fence_rpc_duration_seconds", []string{"procedure", "/fence.v1.LeaseService/Acquire", "code", "ok"}, 4},
		{"fence_rpc_duration_seconds", []string{"procedure", "/fence.v1.LeaseService/Renew", "code", "ok"}, 1},
		{"fence_rpc_duration_seconds", []string{"procedure", "/fence.v1.LeaseService/Renew", "code", "failed_precondition"}, 1},
		{"fence_rpc_duration_seconds", []string{"procedure", "/fence.v1.LeaseService/Release", "code", "ok"}, 2},
		{"fence_raft_leader", nil, 1},
		{"fence_raft_has_leader", nil, 1},
		{"fence_ready", nil, 1},
		{"fence_build_info", []string{"version", version.Get().Short(), "revision", version.Get().Revision, "goversion", runtime.Version()}, 1},
	}
	for _, w := range want {
		got, ok := scrape.Find(fams, w.name, w.labels...)
		if !ok || got != w.value {
			t.Errorf("%s%v = %v (present %v), want %v", w.name, w.labels, got, ok, w.value)
		}
	}
	// Raft's indexes and the process defaults are there; their values are
	// the server's business.
	term, _ := scrape.Find(fams, "fence_raft_term")
	commit, _ := scrape.Find(fams, "fence_raft_commit_index")
	applied, _ := scrape.Find(fams, "fence_raft_applied_index")
	if term < 1 || commit < 1 || applied < 1 {
		t.Errorf("raft term %v, commit %v, applied %v; want each at least 1", term, commit, applied)
	}
	for _, name := range []string{"go_goroutines", "process_cpu_seconds_total", "process_resident_memory_bytes"} {
		if _, ok := scrape.Find(fams, name); !ok {
			t.Errorf("%s missing", name)
		}
	}
	if t.Failed() {
		var names []string
		for n := range fams {
			if strings.HasPrefix(n, "fence_") {
				names = append(names, fmt.Sprint(n))
			}
		}
		slices.Sort(names)
		t.Logf("fence metrics: %v", names)
	}
}

// TestMetricsPerServer: two servers in one process count separately.
func TestMetricsPerServer(t *testing.T) {
	ctx := testContext(t)
	one, two := fencetest.NewServer(), fencetest.NewServer()
	defer one.Close()
	defer two.Close()
	c := one.Client()
	defer c.Close()
	if _, err := c.Grant(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if got, _ := scrape.Find(scrape.Families(t, one.Addr), "fence_lease_grants_total"); got != 1 {
		t.Errorf("first server's grants = %v, want 1", got)
	}
	if got, _ := scrape.Find(scrape.Families(t, two.Addr), "fence_lease_grants_total"); got != 0 {
		t.Errorf("second server's grants = %v, want 0", got)
	}
}
