// Package scrape reads a running fenced's /metrics with Prometheus' own
// text parser, for tests that watch the service from outside, as an
// operator would.
package scrape

import (
	"net/http"
	"slices"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Families reads the metric families of the fenced at addr (host:port,
// plain HTTP). It tries to connect again for up to 5 s: a test that has
// just closed its connections may find the server still counting them
// against its limits.
func Families(t testing.TB, addr string) map[string]*dto.MetricFamily {
	t.Helper()
	var (
		resp *http.Response
		err  error
	)
	for range 50 {
		if resp, err = http.Get("http://" + addr + "/metrics"); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %s", resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	return fams
}

// Find returns the value of the series of name whose labels include the
// given name=value pairs: a counter's or gauge's value, a histogram's
// count. ok is false when there is no such series.
func Find(fams map[string]*dto.MetricFamily, name string, labels ...string) (v float64, ok bool) {
	f := fams[name]
	if f == nil {
		return 0, false
	}
next:
	for _, m := range f.Metric {
		for i := 0; i+1 < len(labels); i += 2 {
			if !slices.ContainsFunc(m.Label, func(l *dto.LabelPair) bool { return l.GetName() == labels[i] && l.GetValue() == labels[i+1] }) {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue(), true
		case m.Gauge != nil:
			return m.Gauge.GetValue(), true
		case m.Histogram != nil:
			return float64(m.Histogram.GetSampleCount()), true
		}
	}
	return 0, false
}

// Value reads the series of name with the given label pairs from the
// fenced at addr, failing the test if it has none.
func Value(t testing.TB, addr, name string, labels ...string) float64 {
	t.Helper()
	v, ok := Find(Families(t, addr), name, labels...)
	if !ok {
		t.Fatalf("/metrics has no %s %v", name, labels)
	}
	return v
}
