package guardmetrics_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/guard"
	"github.com/fence-dev/fence/guard/guardmetrics"
)

func TestCounts(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := guardmetrics.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	g := guard.New(guard.NewMemoryStore(), guard.WithObserver(m.Observer("http")), guard.WithLogger(slog.New(slog.DiscardHandler)))
	for _, v := range []uint64{41, 42, 41, 40, 42} {
		err := g.Fence(context.Background(), "orders", guard.Write{Token: fence.Token{Scope: "orders", Value: v}}, func(context.Context) error { return nil })
		if err != nil && !errors.Is(err, fence.ErrStale) {
			t.Fatal(err)
		}
	}
	if _, err := guardmetrics.New(reg); err != nil {
		t.Fatalf("registering twice: %v", err)
	}
	want := `
# HELP fence_guard_accepts_total Writes a guard accepted: their token was not older than the highest accepted for their scope.
# TYPE fence_guard_accepts_total counter
fence_guard_accepts_total{adapter="http"} 3
# HELP fence_guard_rejections_total Writes a guard rejected as stale: a newer token had been accepted for their scope.
# TYPE fence_guard_rejections_total counter
fence_guard_rejections_total{adapter="http"} 2
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Fatal(err)
	}
}
