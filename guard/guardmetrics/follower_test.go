package guardmetrics_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/fence-dev/fence/fencetest"
	"github.com/fence-dev/fence/guard"
	"github.com/fence-dev/fence/guard/follow"
	"github.com/fence-dev/fence/guard/guardmetrics"
)

// TestFollowerCollector reads a real follower's progress at each scrape:
// the marks it advanced and its watch position move with a grant and a
// release, and its lag is 0 once it recorded them.
func TestFollowerCollector(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srv := fencetest.NewServer()
	defer srv.Close()
	c := srv.Client()
	defer c.Close()
	store := guard.NewMemoryStore()
	f := follow.New(c, store, "orders/", follow.WithLogger(slog.New(slog.DiscardHandler)))
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- f.Run(rctx) }()
	defer func() {
		stop()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("Run = %v", err)
		}
	}()
	reg := prometheus.NewRegistry()
	reg.MustRegister(guardmetrics.NewFollowerCollector(f))
	value := func(name string) float64 {
		t.Helper()
		fams, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, fam := range fams {
			if fam.GetName() != name {
				continue
			}
			m := fam.GetMetric()[0]
			if l := m.GetLabel(); len(l) != 1 || l[0].GetName() != "prefix" || l[0].GetValue() != "orders/" {
				t.Errorf("%s's labels: %v, want prefix=orders/", name, l)
			}
			if g := m.GetGauge(); g != nil {
				return g.GetValue()
			}
			return m.GetCounter().GetValue()
		}
		t.Fatalf("no %s", name)
		return 0
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 20s", what)
			}
		}
	}
	waitFor("a watch position", func() bool { return value("fence_follow_watch_position") > 0 })
	start := value("fence_follow_watch_position")
	l, err := c.Grant(ctx, "orders/1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Release(ctx, "orders/1", l.ID); err != nil {
		t.Fatal(err)
	}
	waitFor("the closing in the store", func() bool { return store.Highest("orders/1").Token == l.Token+1 })
	waitFor("the position past the grant and the release", func() bool { return value("fence_follow_watch_position") >= start+2 })
	waitFor("no lag", func() bool { return value("fence_follow_lag_seconds") == 0 })
	if n := value("fence_follow_marks_advanced_total"); n < 1 {
		t.Errorf("fence_follow_marks_advanced_total = %v, want at least 1", n)
	}
	if n := value("fence_follow_resyncs_total"); n != 0 {
		t.Errorf("fence_follow_resyncs_total = %v, want 0", n)
	}
	if n, err := testutil.GatherAndCount(reg); err != nil || n != 4 {
		t.Errorf("%d series (%v), want 4", n, err)
	}
	help := `
# HELP fence_follow_resyncs_total Times the follower read the state of the leases it knew held instead of resuming its watch: the service no longer held the events to resume from, or its watch had never started.
# TYPE fence_follow_resyncs_total counter
fence_follow_resyncs_total{prefix="orders/"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(help), "fence_follow_resyncs_total"); err != nil {
		t.Error(err)
	}
}
