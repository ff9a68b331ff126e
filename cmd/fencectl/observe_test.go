//go:build unix

package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/fence-dev/fence"
	fencev1 "github.com/fence-dev/fence/api/fence/v1"
	"github.com/fence-dev/fence/client"
	"github.com/fence-dev/fence/guard"
	"github.com/fence-dev/fence/guard/guardreport"
	"github.com/fence-dev/fence/internal/browsertest"
)

// TestObservability drives a real fenced through grants, a release, an
// expiry and a stale write refused by a guard, then checks that each shows
// with its scope and token in a "fencectl watch" stream, in /metrics and on
// the status page in a real browser. With FENCE_STATUS_SCREENSHOT=PATH it
// also saves the page's screenshot there (docs/status-page.png is one).
func TestObservability(t *testing.T) {
	t.Parallel()
	b := browsertest.Start(t)
	s := startFenced(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// A scope's first, second and third tokens, counted from the floor
	// fenced took office with: alice's, bob's and carol's in orders; the
	// end of each lease closes its token with the next value.
	floor := s.floor(t)
	t1, t2, t3 := floor+1, floor+3, floor+5

	var alice leaseOutput
	s.wantJSON(t, 0, &alice, "acquire", "orders", "--holder", "alice", "--ttl", "30s")
	w := s.watch(t, "orders", "--held", "-o", "json", "--count", "6")
	if e := w.event(t); e.Kind != fencev1.EventKind_EVENT_KIND_HELD || e.Token != t1 {
		t.Fatalf("first line = %+v, want orders held with token %d", e, t1)
	}

	// alice releases; bob's lease expires; carol holds token t3.
	s.want(t, 0, "release", "orders", "--lease", alice.LeaseID)
	s.want(t, 0, "acquire", "orders", "--holder", "bob", "--ttl", "100ms")
	c, err := client.New(s.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for {
		st, err := c.Get(ctx, "orders")
		if err != nil {
			t.Fatal(err)
		}
		if st.Lease == nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	var carol leaseOutput
	s.wantJSON(t, 0, &carol, "acquire", "orders", "--holder", "carol", "--ttl", "50s")

	// Bob, paused through his expiry, writes with token t2 after carol
	// wrote with t3: the guard refuses him and reports it.
	rep := guardreport.New(c, "orders-db", guardreport.WithInterval(time.Hour))
	g := guard.New(guard.NewMemoryStore(), guard.WithObserver(rep), guard.WithLogger(slog.New(slog.DiscardHandler)))
	write := func(token uint64) error {
		return g.Fence(ctx, "orders", guard.Write{Token: fence.Token{Scope: "orders", Value: token}}, func(context.Context) error { return nil })
	}
	if err := write(carol.Token); err != nil {
		t.Fatal(err)
	}
	if err := write(t2); !errors.Is(err, fence.ErrStale) {
		t.Fatalf("bob's late write = %v, want stale", err)
	}
	if err := rep.Close(ctx); err != nil {
		t.Fatal(err)
	}

	// The watch stream.
	for i, want := range []struct {
		kind    fencev1.EventKind
		token   uint64
		holder  string
		current uint64
		closing uint64
	}{
		{fencev1.EventKind_EVENT_KIND_RELEASED, t1, "alice", 0, t1 + 1},
		{fencev1.EventKind_EVENT_KIND_GRANTED, t2, "bob", 0, 0},
		{fencev1.EventKind_EVENT_KIND_EXPIRED, t2, "bob", 0, t2 + 1},
		{fencev1.EventKind_EVENT_KIND_GRANTED, t3, "carol", 0, 0},
		{fencev1.EventKind_EVENT_KIND_REJECTED, t2, "bob", t3, 0}, // reported by the guard
	} {
		e := w.event(t)
		if e.Kind != want.kind || e.Scope != "orders" || e.Token != want.token || e.Holder != want.holder || e.CurrentToken != want.current || e.ClosingToken != want.closing {
			t.Fatalf("watch line %d = %+v, want orders %s with token %d by %s (current %d, closing %d)", i+2, e, want.kind, want.token, want.holder, want.current, want.closing)
		}
	}
	if err := w.wait(); err != nil {
		t.Fatal(err)
	}
	// /metrics.
	resp, err := http.Get("http://" + s.addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]float64{
		"fence_lease_grants_total":              3,
		"fence_lease_releases_total":            1,
		"fence_lease_expirations_total":         1,
		"fence_stale_rejections_reported_total": 1,
		"fence_leases_held":                     1,
	} {
		f := fams[name]
		var got float64
		if f != nil && len(f.Metric) == 1 {
			if m := f.Metric[0]; m.Counter != nil {
				got = m.Counter.GetValue()
			} else if m.Gauge != nil {
				got = m.Gauge.GetValue()
			}
		}
		if got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	if f := fams["fence_stale_token_gap"]; f == nil || f.Metric[0].Histogram.GetSampleSum() != 2 {
		t.Errorf("fence_stale_token_gap = %v, want one gap of 2 (token %d refused after %d)", f, t2, t3)
	}

	// The status page, in a browser, with two more leases beside.
	s.want(t, 0, "acquire", "billing/invoices", "--holder", "biller-7@host-2", "--ttl", "40s")
	s.want(t, 0, "acquire", "reports/nightly", "--holder", "reporter@host-1", "--ttl", "20s")
	b.Navigate(ctx, "http://"+s.addr+"/")
	b.WaitText(ctx,
		fmt.Sprintf("orders\tcarol\t%d", t3), fmt.Sprintf("billing/invoices\tbiller-7@host-2\t%d", t1), // held now
		fmt.Sprintf("released #%d alice", t1), fmt.Sprintf("granted #%d bob", t2), fmt.Sprintf("expired #%d bob", t2),
		fmt.Sprintf("granted #%d carol", t3), fmt.Sprintf("rejected #%d bob (highest #%d)", t2, t3),
		fmt.Sprintf("orders-db refused orders token %d (held by bob); it had accepted token %d", t2, t3))
	shot := filepath.Join(t.TempDir(), "status-page.png")
	b.Screenshot(ctx, shot)
	t.Logf("status page screenshot: %s", shot)
	if dst := os.Getenv("FENCE_STATUS_SCREENSHOT"); dst != "" {
		png, err := os.ReadFile(shot)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dst, png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
