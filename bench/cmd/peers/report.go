package main

import (
	"cmp"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// summary is one workload, concurrency and system over all runs: each
// figure is the median of the runs' figures.
type summary struct {
	Workload     string
	Clients      int
	System       string
	Runs         int
	OpsPerSec    float64
	P50          time.Duration
	P99          time.Duration
	P999         time.Duration
	FlushesPerOp float64
	ServerCPU    time.Duration // per operation
	ClientCPU    time.Duration // per operation
	Errors       int64
	// The operations of the least and the most served worker, and the
	// ratio of the two (+Inf when a worker completed none).
	WorkerMin, WorkerMax int64
	Spread               float64
}

// summarise takes the medians over runs, in the order cells were measured.
func summarise(rep report) []summary {
	type key struct {
		w string
		c int
		s string
	}
	var order []key
	byKey := map[key][]measurement{}
	for _, m := range rep.Measurements {
		k := key{m.Workload, m.Clients, m.System}
		if _, ok := byKey[k]; !ok {
			order = append(order, k)
		}
		byKey[k] = append(byKey[k], m)
	}
	var out []summary
	for _, k := range order {
		ms := byKey[k]
		s := summary{Workload: k.w, Clients: k.c, System: k.s, Runs: len(ms)}
		var ops, flushes, spread []float64
		var wmin, wmax []int64
		var p50, p99, p999, scpu, ccpu []time.Duration
		for _, m := range ms {
			n := max(m.Ops, 1)
			ops = append(ops, rate(m.Ops, m.Elapsed))
			flushes = append(flushes, float64(m.Flushes)/float64(n))
			p50, p99, p999 = append(p50, m.P50), append(p99, m.P99), append(p999, m.P999)
			scpu, ccpu = append(scpu, m.ServerCPU/time.Duration(n)), append(ccpu, m.ClientCPU/time.Duration(n))
			s.Errors += m.Errors
			wmin, wmax = append(wmin, m.WorkerMin), append(wmax, m.WorkerMax)
			spread = append(spread, float64(m.WorkerMax)/float64(m.WorkerMin))
		}
		s.WorkerMin, s.WorkerMax, s.Spread = median(wmin), median(wmax), median(spread)
		s.OpsPerSec, s.FlushesPerOp = median(ops), median(flushes)
		s.P50, s.P99, s.P999 = median(p50), median(p99), median(p999)
		s.ServerCPU, s.ClientCPU = median(scpu), median(ccpu)
		out = append(out, s)
	}
	return out
}

// median returns the middle value (the lower middle of an even count).
func median[T int64 | float64 | time.Duration](xs []T) T {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[(len(s)-1)/2]
}

// find returns the summary of one workload, concurrency and system.
func find(sums []summary, w string, clients int, sys string) (summary, bool) {
	i := slices.IndexFunc(sums, func(s summary) bool { return s.Workload == w && s.Clients == clients && s.System == sys })
	if i < 0 {
		return summary{}, false
	}
	return sums[i], true
}

// printReport prints the medians as a Markdown table, then one ratio line
// per workload and concurrency, last.
func printReport(w io.Writer, rep report) {
	sums := summarise(rep)
	runs := 0
	for _, s := range sums {
		runs = max(runs, s.Runs)
	}
	for _, f := range rep.Failovers {
		runs = max(runs, f.Run)
	}
	fmt.Fprintf(w, "\nMedians of %d runs of %s per cell; %s cores (%s); disk %s.\n",
		runs, rep.Settings["time"], rep.Machine["cores"], rep.Machine["cpu"], rep.Machine["disk"])
	if n := rep.Settings["nodes"]; n != "" {
		fmt.Fprintf(w, "Each system a cluster of %s nodes on loopback, clients given every address; election timeout %s on both (heartbeats a tenth of it apart on etcd, a twentieth to a tenth on fence).\n",
			n, rep.Settings["election_timeout"])
	}
	fmt.Fprintln(w)
	for _, p := range rep.Probes {
		fmt.Fprintf(w, "run %d: fdatasync of 4 KiB: %.0f/s, p50 %s\n", p.Run, rate(p.Ops, p.Elapsed), round(p.P50))
	}
	fmt.Fprintln(w, "\n| workload | clients | system | ops/s | p50 | p99 | p99.9 | disk flushes/op | CPU/op server + client | ops per worker, fewest–most (most/fewest) | fence/system, fenced/plain |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|---|")
	for _, s := range sums {
		vs := ""
		if ref, ok := reference(sums, s); ok && s.OpsPerSec > 0 {
			vs = fmt.Sprintf("%.2f", ref.OpsPerSec/s.OpsPerSec)
		}
		sys := s.System
		if s.Errors > 0 {
			sys += fmt.Sprintf(" (%d errors)", s.Errors)
		}
		server := round(s.ServerCPU)
		switch storeOf(s.Workload) {
		case storePostgres, storePostgresRow:
			server += " (not PostgreSQL's)"
		case storeRedis:
			server += " (not Redis's)"
		case storeS3:
			server += " (not the S3 server's)"
		}
		fmt.Fprintf(w, "| %s | %d | %s | %s | %s | %s | %s | %.2f | %s + %s | %s | %s |\n",
			s.Workload, s.Clients, sys, thousands(s.OpsPerSec), round(s.P50), round(s.P99), round(s.P999), s.FlushesPerOp,
			server, round(s.ClientCPU), spread(s), vs)
	}
	for _, m := range rep.Measurements {
		if m.PerCall > 1 {
			fmt.Fprintf(w, "\n%s %s: %d operations per call; its ops/s counts operations, its latencies calls.\n", m.Workload, m.System, m.PerCall)
			break
		}
	}
	printFollowers(w, rep)
	fails := summariseFailovers(rep.Failovers)
	printFailovers(w, fails)
	fmt.Fprintln(w)
	// fence's variants, each against fence and etcd: for the reader, never a
	// goal, so not "ratio" lines.
	for _, s := range sums {
		if !slices.Contains(variants, s.System) {
			continue
		}
		for _, peer := range []string{sysFence, sysEtcd} {
			if p, ok := find(sums, s.Workload, s.Clients, peer); ok && p.OpsPerSec > 0 {
				fmt.Fprintf(w, "%s %d %s/%s=%.2f\n", s.Workload, s.Clients, s.System, peer, s.OpsPerSec/p.OpsPerSec)
			}
		}
	}
	// The goals' ratios, last: fence against etcd, the fenced resource
	// against the plain one.
	for _, s := range sums {
		if s.System != sysEtcd && s.System != sysPlain {
			continue
		}
		ref, ok := reference(sums, s)
		if !ok || ref.OpsPerSec <= 0 || s.OpsPerSec <= 0 {
			continue
		}
		fmt.Fprintf(w, "ratio %s %d %s/%s=%.2f\n", s.Workload, s.Clients, ref.System, s.System, ref.OpsPerSec/s.OpsPerSec)
	}
	// Failover compares times: etcd's over fence's, above 1 when fence
	// recovers faster.
	f, okf := fails[sysFence]
	e, oke := fails[sysEtcd]
	if okf && oke && f.median > 0 {
		fmt.Fprintf(w, "ratio %s %d %s/%s=%.2f\n", wlFailover, f.clients, sysEtcd, sysFence, float64(e.median)/float64(f.median))
	}
}

// failoverSummary is one system's kills over all runs.
type failoverSummary struct {
	system                   string
	clients, kills           int
	median, fastest, slowest time.Duration
	elected, rejoined        time.Duration // medians
	errors                   int64
}

// summariseFailovers takes each system's median, fastest and slowest kill
// over all runs.
func summariseFailovers(fs []failover) map[string]failoverSummary {
	took, elected, rejoined := map[string][]time.Duration{}, map[string][]time.Duration{}, map[string][]time.Duration{}
	out := map[string]failoverSummary{}
	for _, f := range fs {
		took[f.System] = append(took[f.System], f.Took)
		elected[f.System] = append(elected[f.System], f.Elected)
		rejoined[f.System] = append(rejoined[f.System], f.Rejoined)
		s := out[f.System]
		s.system, s.clients, s.errors = f.System, f.Clients, s.errors+f.Errors
		out[f.System] = s
	}
	for sys, ts := range took {
		s := out[sys]
		s.kills, s.median, s.elected, s.rejoined = len(ts), median(ts), median(elected[sys]), median(rejoined[sys])
		s.fastest, s.slowest = slices.Min(ts), slices.Max(ts)
		out[sys] = s
	}
	return out
}

// printFailovers prints the failover table, fence's row first.
func printFailovers(w io.Writer, fails map[string]failoverSummary) {
	if len(fails) == 0 {
		return
	}
	fmt.Fprintln(w, "\nFailover: kill -9 of the leader under the lock cycle; from the kill to the first grant answered by the new leader.")
	fmt.Fprintln(w, "\n| system | clients | kills | median | fastest | slowest | a new leader agreed on (median) | whole again after the restart (median) | client errors meanwhile |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|")
	notFence := func(sys string) int {
		if sys == sysFence {
			return 0
		}
		return 1
	}
	systems := slices.SortedFunc(maps.Keys(fails), func(a, b string) int {
		return cmp.Or(cmp.Compare(notFence(a), notFence(b)), strings.Compare(a, b))
	})
	for _, sys := range systems {
		s := fails[sys]
		fmt.Fprintf(w, "| %s | %d | %d | %s | %s | %s | %s | %s | %d |\n", s.system, s.clients, s.kills,
			round(s.median), round(s.fastest), round(s.slowest), round(s.elected), round(s.rejoined), s.errors)
	}
}

// printFollowers notes what fence-followed's follower did in each cell,
// medians of the runs, and that its CPU is in the server's column.
func printFollowers(w io.Writer, rep report) {
	type key struct {
		w string
		c int
	}
	var order []key
	byKey := map[key][]measurement{}
	for _, m := range rep.Measurements {
		if m.Follower == nil {
			continue
		}
		k := key{m.Workload, m.Clients}
		if _, ok := byKey[k]; !ok {
			order = append(order, k)
		}
		byKey[k] = append(byKey[k], m)
	}
	if len(order) == 0 {
		return
	}
	fmt.Fprintf(w, "\n%s: fenced with its defaults and a guard/follow Follower of every scope over a guard.MemoryStore, in a process of its own; its CPU is counted in the server's.\n", sysFenceFollowed)
	for _, k := range order {
		var perOp []float64
		var maxLag, lag, cpu []time.Duration
		var resyncs uint64
		for _, m := range byKey[k] {
			n := max(m.Ops, 1)
			perOp = append(perOp, float64(m.Follower.Advanced)/float64(n))
			maxLag, lag = append(maxLag, m.Follower.MaxLag), append(lag, m.Follower.Lag)
			cpu = append(cpu, m.Follower.CPU/time.Duration(n))
			resyncs += m.Follower.Resyncs
		}
		fmt.Fprintf(w, "%s %d %s: %.2f marks advanced an operation, lag at most %s (at the end %s), %d resyncs; the follower's own CPU %s an operation\n",
			k.w, k.c, sysFenceFollowed, median(perOp), round(median(maxLag)), round(median(lag)), resyncs, round(median(cpu)))
	}
}

// variants are the fence systems that change one thing of fence's, shown
// beside fence and etcd but never a goal's side of a ratio: the one for
// which the like-for-like comparison is fence's defaults.
var variants = []string{sysFenceUnsigned, sysFenceBolt, sysFenceSingle, sysFenceFollowed}

// reference returns the system a row is compared with in the table's last
// column: fence, for a peer's row (etcd's, Redis's), and the fenced
// resource for the plain one. Only fence/etcd and fenced/plain are goal
// ratios; the table also shows fence against Redis.
func reference(sums []summary, s summary) (summary, bool) {
	switch s.System {
	case sysEtcd, sysRedisAlways, sysRedisDefault:
		return find(sums, s.Workload, s.Clients, sysFence)
	case sysPlain:
		return find(sums, s.Workload, s.Clients, sysFenced)
	}
	return summary{}, false
}

// spread formats how evenly a cell's workers were served.
func spread(s summary) string {
	switch {
	case s.WorkerMax == 0: // results from before the harness counted them
		return ""
	case math.IsInf(s.Spread, 1):
		return fmt.Sprintf("%d–%d (a worker got none)", s.WorkerMin, s.WorkerMax)
	}
	return fmt.Sprintf("%d–%d (%.2f)", s.WorkerMin, s.WorkerMax, s.Spread)
}

// round shortens a latency for the table.
func round(d time.Duration) string {
	switch {
	case d >= 10*time.Millisecond:
		return d.Round(time.Millisecond).String()
	case d >= time.Millisecond:
		return d.Round(10 * time.Microsecond).String()
	}
	return d.Round(time.Microsecond).String()
}

// thousands formats a rate with thousands separators.
func thousands(x float64) string {
	s := fmt.Sprintf("%.0f", x)
	var b strings.Builder
	for i, r := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// plotLockCycle draws lock cycles per second against concurrency, one line
// per system, both axes logarithmic.
func plotLockCycle(sums []summary, title, path string) error {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "concurrent clients"
	p.Y.Label.Text = "cycles per second"
	p.X.Scale, p.Y.Scale = plot.LogScale{}, plot.LogScale{}
	p.X.Tick.Marker = plot.ConstantTicks([]plot.Tick{{Value: 1, Label: "1"}, {Value: 16, Label: "16"}, {Value: 64, Label: "64"}})
	p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	var lines []any
	lowest := 0.0
	for _, sys := range []string{sysFence, sysEtcd, sysRedisAlways, sysRedisDefault, sysFenceUnsigned, sysFenceBolt, sysFenceFollowed} {
		var xys plotter.XYs
		for _, s := range sums {
			if s.Workload == wlLockCycle && s.System == sys && s.OpsPerSec > 0 {
				xys = append(xys, plotter.XY{X: float64(s.Clients), Y: s.OpsPerSec})
				if lowest == 0 || s.OpsPerSec < lowest {
					lowest = s.OpsPerSec
				}
			}
		}
		if len(xys) > 0 {
			label := sys
			switch sys {
			case sysRedisAlways:
				label = "redis, appendfsync always"
			case sysRedisDefault:
				label = "redis, defaults (not durable)"
			case sysFenceUnsigned:
				label = "fence, unsigned tokens"
			case sysFenceBolt:
				label = "fence, raft-boltdb log"
			case sysFenceFollowed:
				label = "fence, a follower attached"
			}
			lines = append(lines, label, xys)
		}
	}
	if len(lines) == 0 {
		return nil
	}
	if err := plotutil.AddLinePoints(p, lines...); err != nil {
		return err
	}
	// Room below the lowest point for the legend, bottom right.
	p.Y.Min = lowest / 4
	p.Legend.Top, p.Legend.Left = false, false
	return p.Save(16*vg.Centimeter, 11*vg.Centimeter, path)
}
