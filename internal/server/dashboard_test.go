package server

import (
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestDashboardMetrics: every fence_ metric the Grafana dashboard in docs/
// queries is one that fenced exports, so a renamed metric cannot leave a
// panel silently empty.
func TestDashboardMetrics(t *testing.T) {
	b, err := os.ReadFile("../../docs/grafana-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("docs/grafana-dashboard.json: %v", err)
	}

	s := startWith(t, func(*Config) {})
	// Give the labelled histograms a series each, so that they are
	// gathered.
	s.metrics.queued()(true)
	s.metrics.rpcSeconds.WithLabelValues("/p", "ok").Observe(0)
	fams, err := s.metrics.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	exported := make(map[string]bool)
	for _, f := range fams {
		exported[f.GetName()] = true
	}
	// The Raft metrics that only some nodes have at some times.
	for _, d := range raftCollectorMetrics {
		exported[regexp.MustCompile(`fqName: "([^"]+)"`).FindStringSubmatch(d.String())[1]] = true
	}
	name := regexp.MustCompile(`\bfence_[a-z_]+`)
	queried := 0
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			for _, m := range name.FindAllString(tg.Expr, -1) {
				queried++
				base := m
				for _, suffix := range []string{"_bucket", "_count", "_sum"} {
					if b, ok := strings.CutSuffix(m, suffix); ok && exported[b] {
						base = b
					}
				}
				if !exported[base] {
					t.Errorf("panel %q queries %s, which fenced does not export", p.Title, m)
				}
			}
		}
	}
	if queried < 20 {
		t.Errorf("only %d metric references found in the dashboard", queried)
	}
}
