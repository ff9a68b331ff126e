package main

import (
	"bytes"
	"slices"
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
// report, which scripts read: fence/etcd and fenced/plain only, never a
// variant of fence's.
func TestReportRatios(t *testing.T) {
	var rep report
	add := func(run int, w string, clients int, sys string, ops, wmin, wmax int64) {
		rep.Measurements = append(rep.Measurements, measurement{Run: run, Workload: w, Clients: clients, System: sys,
			cellResult: cellResult{Ops: ops, Elapsed: time.Second, WorkerMin: wmin, WorkerMax: wmax}})
	}
	for run, f := range []int64{5000, 6000, 7000} {
		add(run+1, wlLockCycle, 64, sysFence, f, 90, 100)
		add(run+1, wlLockCycle, 64, sysEtcd, 1000+int64(run)*100, 10, 20)
		add(run+1, wlLockCycle, 64, sysRedisAlways, 3000, 40, 50)
		add(run+1, wlLockCycle, 64, sysFenceUnsigned, 9000, 140, 150)
		add(run+1, wlLockCycle, 64, sysFenceFollowed, 5400, 80, 90)
		m := &rep.Measurements[len(rep.Measurements)-1]
		m.Follower = &followerStats{Advanced: uint64(10_000 + run*800), MaxLag: time.Duration(run+1) * time.Millisecond, CPU: 54 * time.Millisecond}
		add(run+1, wlContended, 64, sysRedisAlways, 2000, int64(run), 100)
		add(run+1, guardedWrite(storeBolt), 64, sysFenced, 1900, 30, 30)
		add(run+1, guardedWrite(storeBolt), 64, sysPlain, 2000, 30, 31)
	}
	var b bytes.Buffer
	printReport(&b, rep)
	out := b.String()
	var ratios []string
	for line := range strings.Lines(out) {
		if strings.HasPrefix(line, "ratio ") {
			ratios = append(ratios, strings.TrimSpace(line))
		}
	}
	want := []string{
		"ratio lock-cycle 64 fence/etcd=5.45", // median 6000 over median 1100
		"ratio guarded-write-bbolt 64 fenced/plain=0.95",
	}
	if !slices.Equal(ratios, want) {
		t.Errorf("ratio lines %q, want %q\n%s", ratios, want, out)
	}
	if !strings.HasSuffix(strings.TrimSpace(out), want[len(want)-1]) {
		t.Errorf("the ratio lines are not last:\n%s", out)
	}
	for _, s := range []string{
		"| lock-cycle | 64 | redis-always | 3,000 |",
		"lock-cycle 64 fence-unsigned/fence=1.50\n",
		"lock-cycle 64 fence-followed/fence=0.90\n",
		// 10,000, 10,800 and 11,600 marks over 5,400 operations each.
		"lock-cycle 64 fence-followed: 2.00 marks advanced an operation, lag at most 2ms (at the end 0s), 0 resyncs; the follower's own CPU 10µs an operation\n",
		"| 90–100 (1.11) |",
		// Runs 1 to 3 had 0, 1 and 2 for the least served worker: the
		// median spread is 100/1.
		"| contended | 64 | redis-always | 2,000 |",
		"| 1–100 (100.00) |",
	} {
		if !strings.Contains(out, s) {
			t.Errorf("no %q in:\n%s", s, out)
		}
	}
}
