package server_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/client"
	"github.com/fence-dev/fence/fencetest"
	"github.com/fence-dev/fence/internal/scrape"
)

// TestReportRejections: reported rejections are counted, with the token
// gap and what guards dropped; malformed reports are refused whole.
func TestReportRejections(t *testing.T) {
	ctx := testContext(t)
	srv := fencetest.NewServer()
	defer srv.Close()
	c := srv.Client()
	defer c.Close()
	for _, bad := range []struct {
		guard string
		rs    []client.Rejection
		field string
	}{
		{"", nil, "guard"},
		{strings.Repeat("g", 129), nil, "guard"},
		{"db", []client.Rejection{{Scope: "a", Presented: 3, Highest: 2}}, "rejections[0]"},
		{"db", []client.Rejection{{Scope: "a", Presented: 0, Highest: 2}}, "rejections[0]"},
		{"db", make([]client.Rejection, client.MaxReport+1), "rejections"},
	} {
		err := c.ReportRejections(ctx, bad.guard, bad.rs, 0)
		var inv *fence.InvalidError
		if !errors.As(err, &inv) || inv.Field != bad.field {
			t.Errorf("report %q with %d rejections = %v, want invalid %s", bad.guard, len(bad.rs), err, bad.field)
		}
	}
	if err := c.ReportRejections(ctx, "db", []client.Rejection{{Scope: "", Presented: 1, Highest: 2}}, 0); !errors.Is(err, fence.ErrInvalid) {
		t.Errorf("report with an empty scope = %v, want invalid", err)
	}
	rs := []client.Rejection{{Scope: "a", Presented: 1, Highest: 2}, {Scope: "b", Presented: 4, Highest: 7}}
	if err := c.ReportRejections(ctx, "db", rs, 5); err != nil {
		t.Fatal(err)
	}
	fams := scrape.Families(t, srv.Addr)
	for name, want := range map[string]float64{
		"fence_stale_rejections_reported_total": 2,
		"fence_stale_rejections_dropped_total":  5,
		"fence_stale_token_gap":                 2, // observations
	} {
		if got, _ := scrape.Find(fams, name); got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	if sum := fams["fence_stale_token_gap"].Metric[0].Histogram.GetSampleSum(); sum != 4 {
		t.Errorf("token gaps sum to %v, want 1+3", sum)
	}
}
