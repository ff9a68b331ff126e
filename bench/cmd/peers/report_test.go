package main

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

func TestPercentile(t *testing.T) {
	var xs []time.Duration
	for i := 1; i <= 1000; i++ {
		xs = append(xs, time.Duration(i))
	}
	for _, tc := range []struct {
		q    float64
		want time.Duration
	}{{0.5, 500}, {0.99, 990}, {0.999, 999}, {1, 1000}, {0, 1}} {
		if got := percentile(xs, tc.q); got != tc.want {
			t.Errorf("percentile(1..1000, %v) = %v, want %v", tc.q, got, tc.want)
		}
	}
	if got := percentile(nil, 0.5); got != 0 {
		t.Errorf("percentile(nil) = %v, want 0", got)
	}
}

func TestMedian(t *testing.T) {
	if got := median([]float64{3, 1, 2}); got != 2 {
		t.Errorf("median(3, 1, 2) = %v, want 2", got)
	}
	if got := median([]int64{4, 1, 3, 2}); got != 2 {
		t.Errorf("median(4, 1, 3, 2) = %v, want the lower middle, 2", got)
	}
}

func TestThousands(t *testing.T) {
	for x, want := range map[float64]string{0: "0", 999: "999", 1000: "1,000", 1234567.4: "1,234,567"} {
		if got := thousands(x); got != want {
			t.Errorf("thousands(%v) = %q, want %q", x, got, want)
		}
	}
}

// TestReportRatios checks the medians and the ratio lines that end the
// report, which scripts read.
func TestReportRatios(t *testing.T) {
	var rep report
	add := func(run int, w string, clients int, sys string, ops int64) {
		rep.Measurements = append(rep.Measurements, measurement{Run: run, Workload: w, Clients: clients, System: sys,
			cellResult: cellResult{Ops: ops, Elapsed: time.Second}})
	}
	for run, f := range []int64{5000, 6000, 7000} {
		add(run+1, wlLockCycle, 64, sysFence, f)
		add(run+1, wlLockCycle, 64, sysEtcd, 1000+int64(run)*100)
		add(run+1, wlLockCycle, 64, sysRedisAlways, 3000)
	}
	var b bytes.Buffer
	printReport(&b, rep)
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if got, want := lines[len(lines)-1], "ratio lock-cycle 64 fence/etcd=5.45"; got != want {
		t.Errorf("last line %q, want %q (median 6000 over median 1100)\n%s", got, want, b.String())
	}
	if !strings.Contains(b.String(), "| lock-cycle | 64 | redis-always | 3,000 |") {
		t.Errorf("no redis-always row:\n%s", b.String())
	}
}
