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
	checkReport(t, rep, []string{
		"ratio lock-cycle 64 fence/etcd=5.45", // median 6000 over median 1100
		"ratio guarded-write-bbolt 64 fenced/plain=0.95",
	}, []string{
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
	})
}

// checkReport prints rep's report and checks its ratio lines, which
// scripts read and which come last, and that it contains each of has.
func checkReport(t *testing.T, rep report, ratios, has []string) {
	t.Helper()
	var b bytes.Buffer
	printReport(&b, rep)
	out := b.String()
	var got []string
	for line := range strings.Lines(out) {
		if strings.HasPrefix(line, "ratio ") {
			got = append(got, strings.TrimSpace(line))
		}
	}
	if !slices.Equal(got, ratios) {
		t.Errorf("ratio lines %q, want %q\n%s", got, ratios, out)
	}
	if !strings.HasSuffix(strings.TrimSpace(out), ratios[len(ratios)-1]) {
		t.Errorf("the ratio lines are not last:\n%s", out)
	}
	for _, s := range has {
		if !strings.Contains(out, s) {
			t.Errorf("no %q in:\n%s", s, out)
		}
	}
}

// TestReportFailover checks the failover table and its ratio line, which
// comes last: etcd's median time over fence's, above 1 when fence
// recovers faster.
func TestReportFailover(t *testing.T) {
	rep := report{Settings: map[string]string{"nodes": "3", "election_timeout": "1s", "time": "10s"}}
	for i, ms := range []int64{1500, 1900, 1700} {
		rep.Measurements = append(rep.Measurements,
			measurement{Run: i + 1, Workload: wlLockCycle, Clients: 1, System: sysFence, cellResult: cellResult{Ops: 1200, Elapsed: time.Second, WorkerMin: 1, WorkerMax: 1}},
			measurement{Run: i + 1, Workload: wlLockCycle, Clients: 1, System: sysEtcd, cellResult: cellResult{Ops: 1000, Elapsed: time.Second, WorkerMin: 1, WorkerMax: 1}})
		for k, took := range []time.Duration{time.Duration(ms) * time.Millisecond, time.Duration(ms+200) * time.Millisecond} {
			rep.Failovers = append(rep.Failovers,
				failover{Run: i + 1, System: sysEtcd, Clients: 16, Kill: k + 1, Took: 2 * took, Elected: took, Rejoined: time.Second, Errors: 1},
				failover{Run: i + 1, System: sysFence, Clients: 16, Kill: k + 1, Took: took, Elected: took / 2, Rejoined: 300 * time.Millisecond})
		}
	}
	// fence's kills took 1.5, 1.7, 1.7, 1.9, 1.9 and 2.1 s: the lower
	// middle is 1.7 s; etcd's twice as long.
	checkReport(t, rep, []string{"ratio lock-cycle 1 fence/etcd=1.20", "ratio failover 16 etcd/fence=2.00"}, []string{
		"Medians of 3 runs of 10s per cell",
		"Each system a cluster of 3 nodes on loopback",
		"election timeout 1s",
		"| fence | 16 | 6 | 1.7s | 1.5s | 2.1s | 850ms | 300ms | 0 |\n| etcd | 16 | 6 | 3.4s | 3s | 4.2s | 1.7s | 1s | 6 |",
	})
}

// TestNewLeaderGrant checks that only a grant above the armed marker, seen
// after arming, counts as the new leader's, and only the first.
func TestNewLeaderGrant(t *testing.T) {
	var g newLeaderGrant
	t0 := time.Unix(1000, 0)
	g.granted(9, t0) // not armed: counted, not taken
	found := g.arm(5)
	g.granted(5, t0.Add(1*time.Second)) // the old leader's
	g.granted(3, t0.Add(2*time.Second))
	select {
	case <-found:
		t.Fatal("a grant at or below the armed marker was taken for the new leader's")
	default:
	}
	g.granted(6, t0.Add(3*time.Second))
	g.granted(7, t0.Add(4*time.Second))
	select {
	case <-found:
	default:
		t.Fatal("a grant above the armed marker was not taken for the new leader's")
	}
	if got, want := g.firstAt(), t0.Add(3*time.Second); !got.Equal(want) {
		t.Errorf("first grant of the new leader at %v, want %v (the first above the marker)", got, want)
	}
	if n := g.grants.Load(); n != 5 {
		t.Errorf("%d grants counted, want 5", n)
	}
	// Armed again, it waits for a new one.
	found = g.arm(7)
	if !g.firstAt().IsZero() {
		t.Error("arming again kept the last kill's first grant")
	}
	g.granted(8, t0.Add(5*time.Second))
	<-found
	if got, want := g.firstAt(), t0.Add(5*time.Second); !got.Equal(want) {
		t.Errorf("second kill: first grant at %v, want %v", got, want)
	}
}

// TestClusterFlags checks that the cluster subcommand refuses a bad kill
// count or election timeout before it starts anything.
func TestClusterFlags(t *testing.T) {
	for _, args := range [][]string{
		{"-kills", "0"},
		{"-election-timeout", "0s"},
		{"-election-timeout", "1005ms"},
	} {
		err := runMain(append([]string{"-out", t.TempDir(), "-fenced", "/nonexistent"}, args...), true)
		if err == nil || !strings.Contains(err.Error(), "want at least one kill and a positive whole number of 10ms") {
			t.Errorf("cluster %q: %v, want the error naming what is allowed", args, err)
		}
	}
}
