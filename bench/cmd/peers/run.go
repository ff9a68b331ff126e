package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"time"
)

// The workloads, as named in the ratio lines. The guarded write is one
// workload per store: guarded-write-bbolt and so on.
const (
	wlLockCycle    = "lock-cycle"
	wlContended    = "contended"
	wlRenew        = "renew"
	wlGuardedWrite = "guarded-write"
)

// guardedWrite names the guarded-write workload on store.
func guardedWrite(store string) string { return wlGuardedWrite + "-" + store }

// storeOf returns the store of a guarded-write workload, "" for any other.
func storeOf(workload string) string {
	s, ok := strings.CutPrefix(workload, wlGuardedWrite+"-")
	if !ok {
		return ""
	}
	return s
}

// The systems. fence is fenced with its defaults; fence-unsigned,
// fence-bolt, fence-single and fence-followed change one thing each and
// are never a goal's side of a ratio. fenced and plain are the
// guarded-write resource with and without its guard.
const (
	sysFence         = "fence"
	sysFenceUnsigned = "fence-unsigned" // --sign-tokens=false
	sysFenceBolt     = "fence-bolt"     // --raft-log bolt: raft-boltdb, two fdatasyncs per append
	sysFenceSingle   = "fence-single"   // renew: one lease per Renew call
	sysFenceFollowed = "fence-followed" // fenced's defaults, a guard/follow Follower attached (followerMain)
	sysEtcd          = "etcd"
	sysRedisAlways   = "redis-always"
	sysRedisDefault  = "redis-default"
	sysFenced        = "fenced"
	sysPlain         = "plain"
)

// fencedFlags are the flags each fence system gives fenced beyond its
// defaults.
var fencedFlags = map[string][]string{
	sysFence:         nil,
	sysFenceSingle:   nil,
	sysFenceFollowed: nil,
	sysFenceUnsigned: {"--sign-tokens=false"},
	sysFenceBolt:     {"--raft-log", "bolt"},
}

// cell is one workload at one concurrency, measured on each of its systems.
type cell struct {
	workload string
	clients  int
	systems  []string
}

func allCells() []cell {
	locks := []string{sysFence, sysEtcd, sysRedisAlways, sysRedisDefault, sysFenceUnsigned, sysFenceBolt, sysFenceFollowed}
	gw := []string{sysFenced, sysPlain}
	return []cell{
		{wlLockCycle, 1, locks},
		{wlLockCycle, 16, locks},
		{wlLockCycle, 64, locks},
		{wlContended, 64, []string{sysFence, sysEtcd, sysRedisAlways, sysRedisDefault, sysFenceBolt, sysFenceFollowed}},
		{wlRenew, 64, []string{sysFence, sysEtcd, sysFenceSingle}},
		{guardedWrite(storeBolt), 64, gw},
		{guardedWrite(storeSQLite), 64, gw},
		{guardedWrite(storePostgres), 64, gw},
		{guardedWrite(storePostgresRow), 64, gw},
		{guardedWrite(storeRedis), 64, gw},
		{guardedWrite(storeS3), 64, gw},
	}
}

// clusterCells are the cluster subcommand's: fence and etcd, each on
// three nodes.
func clusterCells() []cell {
	both := []string{sysFence, sysEtcd}
	return []cell{
		{wlLockCycle, 1, both},
		{wlLockCycle, 16, both},
		{wlLockCycle, 64, both},
		{wlContended, 64, both},
		{wlRenew, 64, both},
		{wlFailover, 16, both},
	}
}

// config is the coordinator's.
type config struct {
	fenced, fencedRev, redisServer, postgres, redis, s3 string
	data, out                                           string
	runs, leases, etcdWindow                            int
	duration, redisRetry                                time.Duration
	maxOps                                              int64
	only, systems                                       []string
	deadline                                            time.Duration
	// cluster runs fence and etcd on three nodes each (clusterCells);
	// kills is how many times a failover cell kills the leader, and
	// electionTimeout is both systems' (their heartbeat a tenth of it).
	cluster         bool
	kills           int
	electionTimeout time.Duration
}

// measurement is one cell's result on one system in one run.
type measurement struct {
	Run      int    `json:"run"`
	Workload string `json:"workload"`
	Clients  int    `json:"clients"`
	System   string `json:"system"`
	cellResult
	// Follower is what the follower of a fence-followed cell did.
	Follower *followerStats `json:"follower,omitempty"`
}

// fsyncProbe is the disk's own rate: 4 KiB written in place, then
// fdatasync, one at a time.
type fsyncProbe struct {
	Run     int           `json:"run"`
	Ops     int64         `json:"ops"`
	Elapsed time.Duration `json:"elapsed_ns"`
	P50     time.Duration `json:"p50_ns"`
	Flushes int64         `json:"disk_flushes"`
}

// report is everything a run of the harness measured, written as JSON.
type report struct {
	Started      time.Time         `json:"started"`
	Command      string            `json:"command"`
	Machine      map[string]string `json:"machine"`
	Versions     map[string]string `json:"versions"`
	Settings     map[string]string `json:"settings"`
	Load         []string          `json:"load"` // /proc/loadavg before each run and at the end
	Probes       []fsyncProbe      `json:"fsync_probes"`
	Measurements []measurement     `json:"measurements"`
	Failovers    []failover        `json:"failovers,omitempty"`
}

// runMain runs the comparison on single nodes, or with cluster on
// three-node clusters (the cluster subcommand).
func runMain(args []string, cluster bool) error {
	cfg := config{cluster: cluster}
	cells, name := allCells(), "peers"
	if cluster {
		cells, name = clusterCells(), roleCluster
	}
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.StringVar(&cfg.fenced, "fenced", "bin/fenced", "the fenced binary to measure (go build -o bin/fenced ./cmd/fenced)")
	fs.StringVar(&cfg.fencedRev, "fenced-rev", "", "the fence commit fenced was built from, for the results (default: git describe of this checkout)")
	fs.StringVar(&cfg.redisServer, "redis-server", "redis-server", "the redis-server binary")
	fs.StringVar(&cfg.postgres, "postgres", cmp.Or(os.Getenv("FENCE_TEST_POSTGRES"), "postgres://fence:fence@127.0.0.1:54329/fence?sslmode=disable"),
		"PostgreSQL DSN for guarded-write-postgres (make services starts one); empty skips it")
	fs.StringVar(&cfg.redis, "redis", cmp.Or(os.Getenv("FENCE_TEST_REDIS"), "redis://127.0.0.1:63799/0"),
		"Redis URL for guarded-write-redis (make services starts one); empty skips it")
	fs.StringVar(&cfg.s3, "s3", cmp.Or(os.Getenv("FENCE_TEST_S3"), "http://fence:fence-secret@127.0.0.1:18339/fence-test"),
		"S3 server and bucket for guarded-write-s3, http://KEY:SECRET@HOST:PORT/BUCKET (make services starts SeaweedFS); empty skips it")
	fs.StringVar(&cfg.data, "data", os.TempDir(), "directory for the servers' data (each cell gets a fresh one, removed after)")
	fs.StringVar(&cfg.out, "out", "results", "directory for the JSON results and the plot")
	fs.IntVar(&cfg.runs, "runs", 3, "runs; the table shows the median")
	fs.IntVar(&cfg.leases, "leases", 10_000, "live leases in the renew workload")
	benchTime := cmp.Or(os.Getenv("BENCH_TIME"), "10s")
	fs.Func("time", "measured time per cell (default $BENCH_TIME, else 10s)", func(s string) error {
		benchTime = s
		return nil
	})
	fs.IntVar(&cfg.etcdWindow, "etcd-window", renewBatch, "keep-alives in flight on each etcd stream in the renew workload (1 to 100)")
	fs.Int64Var(&cfg.maxOps, "max-ops", 2_000_000, "most operations per cell")
	fs.DurationVar(&cfg.redisRetry, "redis-retry", 10*time.Millisecond, "mean sleep before retrying a held Redis lock")
	fs.DurationVar(&cfg.deadline, "deadline", 90*time.Minute, "give up after this long")
	if cluster {
		fs.IntVar(&cfg.kills, "kills", 3, "kills of the leader in each run's failover cell, for each system")
		fs.DurationVar(&cfg.electionTimeout, "election-timeout", time.Second,
			"both systems' election timeout (etcd's default: 1s, heartbeats a tenth of it apart; fenced's go a twentieth to a tenth of it apart); a whole number of 10ms")
	}
	workloads := "lock-cycle, contended, renew, guarded-write (every store) or guarded-write-STORE for STORE bbolt, sqlite, postgres, postgres-row, redis, s3"
	systemNames := "fence, etcd, redis-always, redis-default, fence-unsigned, fence-bolt, fence-single, fence-followed, fenced, plain"
	if cluster {
		workloads, systemNames = "lock-cycle, contended, renew, failover", "fence, etcd"
	}
	only := fs.String("only", "", "comma-separated workloads to run: "+workloads+" (default all)")
	systems := fs.String("systems", "", "comma-separated systems to run: "+systemNames+" (default all)")
	again := fs.String("report", "", "measure nothing: print the table of this results file again and redraw its plot")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *again != "" {
		return reprint(*again)
	}
	var err error
	if cfg.duration, err = time.ParseDuration(benchTime); err != nil || cfg.duration <= 0 {
		return fmt.Errorf("BENCH_TIME %q: want a positive duration such as 10s", benchTime)
	}
	if cluster && (cfg.kills < 1 || cfg.electionTimeout <= 0 || cfg.electionTimeout%(10*time.Millisecond) != 0) {
		return fmt.Errorf("-kills %d, -election-timeout %s: want at least one kill and a positive whole number of 10ms", cfg.kills, cfg.electionTimeout)
	}
	cfg.only, cfg.systems = splitList(*only), splitList(*systems)
	var knownW, knownS []string
	for _, c := range cells {
		knownW = append(knownW, c.workload)
		knownS = append(knownS, c.systems...)
	}
	if !cluster {
		knownW = append(knownW, wlGuardedWrite)
	}
	for _, w := range cfg.only {
		if !slices.Contains(knownW, w) {
			return fmt.Errorf("-only: no workload %q", w)
		}
	}
	for _, sys := range cfg.systems {
		if !slices.Contains(knownS, sys) {
			return fmt.Errorf("-systems: no system %q", sys)
		}
	}
	if cfg.fenced, err = filepath.Abs(cfg.fenced); err != nil {
		return err
	}
	if _, err := os.Stat(cfg.fenced); err != nil {
		return fmt.Errorf("fenced binary: %w (build it with: go build -o bin/fenced ./cmd/fenced)", err)
	}
	if rs, err := exec.LookPath(cfg.redisServer); err == nil {
		cfg.redisServer = rs
	} else if !cluster {
		return fmt.Errorf("redis-server: %w (make services installs it)", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), cfg.deadline)
	defer cancel()

	rep := report{
		Started:  time.Now().UTC(),
		Command:  strings.Join(os.Args, " "),
		Machine:  machineFacts(),
		Versions: versions(cfg),
		Settings: map[string]string{
			"time": cfg.duration.String(), "runs": fmt.Sprint(cfg.runs), "max_ops": fmt.Sprint(cfg.maxOps),
			"leases": fmt.Sprint(cfg.leases), "redis_retry": cfg.redisRetry.String(), "data": cfg.data,
			"renew_batch": fmt.Sprint(renewBatch), "etcd_window": fmt.Sprint(cfg.etcdWindow),
		},
	}
	if cluster {
		rep.Settings["nodes"] = fmt.Sprint(clusterSize)
		rep.Settings["kills"] = fmt.Sprint(cfg.kills)
		rep.Settings["election_timeout"] = cfg.electionTimeout.String()
	}
	disk := diskOf(cfg.data)
	rep.Machine["disk"] = disk
	for run := 1; run <= cfg.runs; run++ {
		rep.Load = append(rep.Load, loadavg())
		p, err := probeFsync(cfg.data, disk, 2*time.Second)
		if err != nil {
			return fmt.Errorf("fsync probe: %w", err)
		}
		p.Run = run
		rep.Probes = append(rep.Probes, p)
		logf("run %d/%d: disk %s: %.0f fdatasyncs/s, p50 %s, %.2f flushes each",
			run, cfg.runs, disk, rate(p.Ops, p.Elapsed), p.P50, float64(p.Flushes)/float64(max(p.Ops, 1)))
		for _, c := range cells {
			if len(cfg.only) > 0 && !slices.Contains(cfg.only, c.workload) &&
				(storeOf(c.workload) == "" || !slices.Contains(cfg.only, wlGuardedWrite)) {
				continue
			}
			for _, sys := range c.systems {
				if len(cfg.systems) > 0 && !slices.Contains(cfg.systems, sys) {
					continue
				}
				if (storeOf(c.workload) == storePostgres || storeOf(c.workload) == storePostgresRow) && cfg.postgres == "" || storeOf(c.workload) == storeRedis && cfg.redis == "" ||
					storeOf(c.workload) == storeS3 && cfg.s3 == "" {
					continue
				}
				if err := ctx.Err(); err != nil {
					return fmt.Errorf("deadline of %s passed: %w", cfg.deadline, err)
				}
				if c.workload == wlFailover {
					fs, err := runFailover(ctx, cfg, c, sys)
					if err != nil {
						return fmt.Errorf("run %d, %s at %d clients on %s: %w", run, c.workload, c.clients, sys, err)
					}
					for _, f := range fs {
						f.Run = run
						rep.Failovers = append(rep.Failovers, f)
						logf("run %d: %-22s %2d clients %-14s kill %d of %s: a new leader agreed on %s after the kill, its first grant %s after; whole again %s after the restart; %d errors%s",
							run, c.workload, c.clients, sys, f.Kill, f.Leader, round(f.Elected), round(f.Took), round(f.Rejoined), f.Errors, firstNote(f.FirstError))
					}
					continue
				}
				m, err := runCell(ctx, cfg, disk, c, sys)
				if err != nil {
					return fmt.Errorf("run %d, %s at %d clients on %s: %w", run, c.workload, c.clients, sys, err)
				}
				m.Run = run
				rep.Measurements = append(rep.Measurements, m)
				n := time.Duration(max(m.Ops, 1))
				logf("run %d: %-22s %2d clients %-14s %9.0f ops/s  p50 %-8s p99 %-8s p99.9 %-8s flushes/op %.2f  CPU/op %s + %s  per worker %d-%d %s%s",
					run, c.workload, c.clients, sys, rate(m.Ops, m.Elapsed), round(m.P50), round(m.P99), round(m.P999),
					float64(m.Flushes)/float64(n), round(m.ServerCPU/n), round(m.ClientCPU/n), m.WorkerMin, m.WorkerMax, errNote(m), followerNote(m))
			}
		}
	}
	rep.Load = append(rep.Load, loadavg())
	if err := os.MkdirAll(cfg.out, 0o755); err != nil {
		return err
	}
	stamp := rep.Started.Format("2006-01-02T150405")
	b, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	jsonPath := filepath.Join(cfg.out, name+"-"+stamp+".json")
	if err := os.WriteFile(jsonPath, b, 0o644); err != nil {
		return err
	}
	return finish(rep, jsonPath)
}

// finish draws the plot beside the results file and prints the table.
func finish(rep report, jsonPath string) error {
	pngPath := strings.TrimSuffix(jsonPath, ".json") + ".png"
	title := "Lock cycle (acquire + release) on distinct keys, medians"
	if n := rep.Settings["nodes"]; n != "" {
		title = "Lock cycle on distinct keys, clusters of " + n + " nodes, medians"
	}
	if err := plotLockCycle(summarise(rep), title, pngPath); err != nil {
		return fmt.Errorf("plot: %w", err)
	}
	logf("wrote %s and %s", jsonPath, pngPath)
	printReport(os.Stdout, rep)
	return nil
}

// reprint reads a results file and finishes it again.
func reprint(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var rep report
	if err := json.Unmarshal(b, &rep); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return finish(rep, path)
}

// runCell starts the servers system needs for c, each on a fresh data
// directory, runs c's client process against them, and stops them. Every
// process it starts counts as the server's in the CPU column: for
// fence-followed, fenced and the follower together.
func runCell(ctx context.Context, cfg config, disk string, c cell, sys string) (measurement, error) {
	dir, err := os.MkdirTemp(cfg.data, fmt.Sprintf("peers-%s-%d-%s-", c.workload, c.clients, sys))
	if err != nil {
		return measurement{}, err
	}
	var procs []*proc
	var pids []string // the server processes whose CPU counts
	defer func() {
		for _, p := range slices.Backward(procs) {
			p.stop()
		}
		os.RemoveAll(dir)
	}()
	a := clientArgs{
		system: sys, workload: c.workload, clients: c.clients, duration: cfg.duration,
		maxOps: cfg.maxOps, leases: cfg.leases, redisRetry: cfg.redisRetry, etcdWindow: cfg.etcdWindow,
	}
	sub := func(name string) string {
		d := filepath.Join(dir, name)
		_ = os.Mkdir(d, 0o700)
		return d
	}
	var p, follower *proc
	var followerStatsPath string
	switch {
	case cfg.cluster:
		var cl *cluster
		if cl, err = startCluster(dir, sys, cfg.fenced, cfg.electionTimeout); err != nil {
			return measurement{}, err
		}
		// Stopped all at once, before the directory goes.
		defer cl.stop()
		for _, m := range cl.members {
			pids = append(pids, fmt.Sprint(m.p.cmd.Process.Pid))
		}
		a.addr.fence, a.addr.etcd = cl.addrs(), cl.addrs()
	case sys == sysFence, sys == sysFenceUnsigned, sys == sysFenceBolt, sys == sysFenceSingle:
		p, a.addr.fence, err = startFenced(cfg.fenced, sub("fenced"), "", fencedFlags[sys]...)
	case sys == sysFenceFollowed:
		// The follower is attached before the load starts and stays until
		// it ends; it is stopped first.
		p, a.addr.fence, err = startFenced(cfg.fenced, sub("fenced"), "", fencedFlags[sys]...)
		if err == nil {
			procs = append(procs, p)
			followerStatsPath = filepath.Join(sub("follower"), "stats.json")
			follower, err = startFollower(filepath.Dir(followerStatsPath), a.addr.fence, followerStatsPath)
			p = follower
		}
	case sys == sysFenced, sys == sysPlain:
		// The workers take their leases from fenced either way, and send
		// their tokens either way: only the resource's guard differs.
		p, a.addr.fence, err = startFenced(cfg.fenced, sub("fenced"), "")
		if err == nil {
			procs = append(procs, p)
			p, a.addr.resource, err = startResource(sub("resource"), storeOf(c.workload), sys == sysFenced, a.addr.fence,
				sharedServers{postgres: cfg.postgres, redis: cfg.redis, s3: cfg.s3})
		}
	case sys == sysEtcd:
		p, a.addr.etcd, err = startEtcd(sub("etcd"))
	case sys == sysRedisAlways:
		p, a.addr.redis, err = startRedis(cfg.redisServer, sub("redis"), map[string]string{"appendonly": "yes", "appendfsync": "always"})
	case sys == sysRedisDefault:
		p, a.addr.redis, err = startRedis(cfg.redisServer, sub("redis"), nil)
	}
	if p != nil {
		procs = append(procs, p)
	}
	if err != nil {
		return measurement{}, err
	}
	cctx, cancel := context.WithTimeout(ctx, cfg.duration+setupBound+30*time.Second)
	defer cancel()
	for _, p := range procs {
		pids = append(pids, fmt.Sprint(p.cmd.Process.Pid))
	}
	cmd, err := reexec(roleClient, append([]string{"-disk", disk, "-pids", strings.Join(pids, ",")}, a.flags()...)...)
	if err != nil {
		return measurement{}, err
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		return measurement{}, err
	}
	// Killed if it outlives its bound.
	stop := context.AfterFunc(cctx, func() { _ = cmd.Process.Kill() })
	defer stop()
	if err := cmd.Wait(); err != nil {
		return measurement{}, fmt.Errorf("client process: %w\n%s", err, strings.TrimSpace(stderr.String()))
	}
	var m measurement
	if err := json.Unmarshal(stdout.Bytes(), &m); err != nil {
		return measurement{}, fmt.Errorf("client process output %q: %w", stdout.String(), err)
	}
	m.Workload, m.Clients, m.System = c.workload, c.clients, sys
	if follower != nil {
		follower.stop()
		b, err := os.ReadFile(followerStatsPath)
		if err != nil {
			return m, fmt.Errorf("follower: %w%s", err, tail(follower.log))
		}
		m.Follower = new(followerStats)
		if err := json.Unmarshal(b, m.Follower); err != nil {
			return m, fmt.Errorf("follower's figures %q: %w", b, err)
		}
	}
	if m.Ops == 0 {
		return m, fmt.Errorf("no operation succeeded: %s", m.FirstError)
	}
	return m, nil
}

func machineFacts() map[string]string {
	f := map[string]string{"cores": fmt.Sprint(runtime.NumCPU()), "goos": runtime.GOOS + "/" + runtime.GOARCH}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for line := range strings.Lines(string(b)) {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				f["cpu"] = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		f["kernel"] = strings.TrimSpace(string(b))
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		line, _, _ := strings.Cut(string(b), "\n")
		f["memory"] = strings.Join(strings.Fields(line)[1:], " ")
	}
	return f
}

func versions(cfg config) map[string]string {
	v := map[string]string{"go": runtime.Version()}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			switch d.Path {
			case "go.etcd.io/etcd/server/v3", "go.etcd.io/etcd/client/v3", "github.com/redis/go-redis/v9",
				"go.etcd.io/bbolt", "github.com/jackc/pgx/v5", "modernc.org/sqlite", "github.com/aws/aws-sdk-go-v2/service/s3":
				v[d.Path] = d.Version
			}
		}
	}
	if out, err := exec.Command(cfg.redisServer, "--version").Output(); err == nil {
		v["redis-server"] = strings.TrimSpace(string(out))
	}
	v["fenced"] = cfg.fencedRev
	if out, err := exec.Command("git", "-C", filepath.Dir(cfg.fenced), "describe", "--always", "--dirty").Output(); err == nil && cfg.fencedRev == "" {
		v["fenced"] = "built from " + strings.TrimSpace(string(out))
	}
	return v
}

func loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	return time.Now().UTC().Format(time.TimeOnly) + " " + strings.TrimSpace(string(b))
}

func splitList(s string) []string {
	var out []string
	for f := range strings.SplitSeq(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func rate(ops int64, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(ops) / d.Seconds()
}

// followerNote sums up what a fence-followed cell's follower did.
func followerNote(m measurement) string {
	if m.Follower == nil {
		return ""
	}
	return fmt.Sprintf("follower: %d marks, lag at most %s, %d resyncs, CPU %s/op", m.Follower.Advanced, round(m.Follower.MaxLag), m.Follower.Resyncs,
		round(m.Follower.CPU/time.Duration(max(m.Ops, 1))))
}

// firstNote is the first error of a failover, if any.
func firstNote(first string) string {
	if first == "" {
		return ""
	}
	return ", first: " + first
}

func errNote(m measurement) string {
	if m.Errors == 0 {
		return ""
	}
	return fmt.Sprintf("%d errors, first: %s", m.Errors, m.FirstError)
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, time.Now().Format("15:04:05 ")+format+"\n", args...)
}
