package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// op is one timed operation of one simulated client (a worker).
type op func(ctx context.Context) error

// cellResult is what a client process reports for one cell.
type cellResult struct {
	Ops        int64         `json:"ops"`
	PerCall    int64         `json:"per_call"` // operations per call: latencies are per call
	Errors     int64         `json:"errors"`
	FirstError string        `json:"first_error,omitempty"`
	Elapsed    time.Duration `json:"elapsed_ns"`
	P50        time.Duration `json:"p50_ns"`
	P99        time.Duration `json:"p99_ns"`
	P999       time.Duration `json:"p999_ns"`
	Setup      time.Duration `json:"setup_ns"`
	Flushes    int64         `json:"disk_flushes"`  // the disk's, during the measured time
	ServerCPU  time.Duration `json:"server_cpu_ns"` // the servers' processes, during the measured time
	ClientCPU  time.Duration `json:"client_cpu_ns"` // this client process, during the measured time
	// The fewest and the most operations one worker completed: how evenly
	// the workers were served (in the contended workload, hand-offs).
	WorkerMin int64 `json:"worker_ops_min"`
	WorkerMax int64 `json:"worker_ops_max"`
}

// clientArgs is what the coordinator tells a client process.
type clientArgs struct {
	system, workload string
	clients          int
	duration         time.Duration
	maxOps           int64
	leases           int
	redisRetry       time.Duration
	etcdWindow       int
	addr             addrs
	// granted, when set (only in the coordinator's own failover load),
	// is called after each grant of the lock cycle with what tells a new
	// leader's grants from the old one's: fence's token (a new leader's
	// are above its wall clock in microseconds when it took office,
	// docs/design.md "The token floor"), the Raft term etcd answered in.
	granted func(marker uint64)
}

// addrs are the servers of one cell; empty for those not started. A
// cluster's fence and etcd are every member's address, comma-separated.
type addrs struct {
	fence, etcd, redis, resource string
}

func (a clientArgs) flags() []string {
	return []string{
		"-system", a.system, "-workload", a.workload,
		"-clients", fmt.Sprint(a.clients), "-time", a.duration.String(),
		"-max-ops", fmt.Sprint(a.maxOps), "-leases", fmt.Sprint(a.leases),
		"-redis-retry", a.redisRetry.String(), "-etcd-window", fmt.Sprint(a.etcdWindow),
		"-fence", a.addr.fence, "-etcd", a.addr.etcd, "-redis", a.addr.redis,
		"-resource", a.addr.resource,
	}
}

// clientMain is the client process: it prepares the workers of one cell
// (untimed), runs them for the duration or until max-ops operations, and
// prints a cellResult as JSON on stdout.
func clientMain(args []string) error {
	var a clientArgs
	fs := flag.NewFlagSet(roleClient, flag.ContinueOnError)
	fs.StringVar(&a.system, "system", "", "system")
	fs.StringVar(&a.workload, "workload", "", "workload")
	fs.IntVar(&a.clients, "clients", 1, "concurrent clients")
	fs.DurationVar(&a.duration, "time", 10*time.Second, "measured time")
	fs.Int64Var(&a.maxOps, "max-ops", 5_000_000, "most operations")
	fs.IntVar(&a.leases, "leases", 10_000, "live leases of the renew workload")
	fs.DurationVar(&a.redisRetry, "redis-retry", 10*time.Millisecond, "mean sleep between tries of a held Redis lock")
	fs.IntVar(&a.etcdWindow, "etcd-window", renewBatch, "keep-alives in flight per etcd stream")
	fs.StringVar(&a.addr.fence, "fence", "", "fenced address")
	fs.StringVar(&a.addr.etcd, "etcd", "", "etcd client address")
	fs.StringVar(&a.addr.redis, "redis", "", "Redis address")
	fs.StringVar(&a.addr.resource, "resource", "", "guarded-write resource base URL")
	disk := fs.String("disk", "", "block device whose flush requests to count")
	pids := fs.String("pids", "", "comma-separated server processes whose CPU time to count")
	if err := fs.Parse(args); err != nil {
		return err
	}
	// Setup and the run both end, whatever happens: the coordinator also
	// kills a client process that outlives its own bound.
	ctx, cancel := context.WithTimeout(context.Background(), a.duration+setupBound)
	defer cancel()
	start := time.Now()
	ops, cleanup, err := setup(ctx, a)
	if err != nil {
		return fmt.Errorf("%s %s setup: %w", a.system, a.workload, err)
	}
	defer cleanup()
	servers := splitList(*pids)
	flushes, serverCPU, clientCPU := diskFlushes(*disk), cpuTime(servers), selfCPU()
	res := drive(ctx, ops, a.duration, a.maxOps)
	// Latencies stay per call; counts and rates are per renewal.
	res.PerCall = renewalsPerOp(a)
	res.Ops *= res.PerCall
	res.WorkerMin *= res.PerCall
	res.WorkerMax *= res.PerCall
	res.Flushes = diskFlushes(*disk) - flushes
	res.ServerCPU, res.ClientCPU = cpuTime(servers)-serverCPU, selfCPU()-clientCPU
	res.Setup = time.Since(start) - res.Elapsed
	return json.NewEncoder(os.Stdout).Encode(res)
}

// setupBound bounds a client process's setup (connecting, granting the
// renew workload's leases, taking the guarded write's locks) and the
// operations still running when the measured time ends.
const setupBound = 90 * time.Second

// setup prepares one op per client for a system and workload, and a func
// that releases what setup took.
func setup(ctx context.Context, a clientArgs) ([]op, func(), error) {
	switch a.system {
	case sysFence, sysFenceUnsigned, sysFenceBolt, sysFenceSingle, sysFenceFollowed, sysFenced, sysPlain:
		return fenceSetup(ctx, a)
	case sysEtcd:
		return etcdSetup(ctx, a)
	case sysRedisAlways, sysRedisDefault:
		return redisSetup(ctx, a)
	}
	return nil, nil, fmt.Errorf("unknown system %q", a.system)
}

// undo collects what a setup took, to give it back in reverse order.
type undo []func()

func (u *undo) add(f func()) { *u = append(*u, f) }

func (u undo) run() {
	for _, f := range slices.Backward(u) {
		f()
	}
}

// fail gives everything back and returns setup's error.
func (u undo) fail(err error) ([]op, func(), error) {
	u.run()
	return nil, nil, err
}

// lockKey is the scope, prefix or key the lock workloads' worker i locks:
// its own in the lock cycle, one for all when contended.
func lockKey(workload string, i int) string {
	if workload == wlContended {
		return "contended"
	}
	return fmt.Sprintf("lock/%d", i)
}

// drive runs every op in its own goroutine, back to back, until d has
// passed or maxOps operations were started, and reports throughput,
// latency percentiles and the spread of operations over the workers. Operations in flight at the deadline finish and
// count; the elapsed time runs until the last one has.
func drive(ctx context.Context, ops []op, d time.Duration, maxOps int64) cellResult {
	var (
		started, errs atomic.Int64
		firstErr      atomic.Pointer[string]
		wg            sync.WaitGroup
		lat           = make([][]time.Duration, len(ops))
	)
	start := time.Now()
	deadline := start.Add(d)
	for i, o := range ops {
		wg.Add(1)
		go func() {
			defer wg.Done()
			mine := make([]time.Duration, 0, 4096)
			failed := 0
			for time.Now().Before(deadline) && started.Add(1) <= maxOps && ctx.Err() == nil {
				t0 := time.Now()
				err := o(ctx)
				if err != nil {
					errs.Add(1)
					msg := err.Error()
					firstErr.CompareAndSwap(nil, &msg)
					// A broken server or setup would otherwise spin
					// through the whole run: a few errors end this worker.
					if failed++; failed >= 10 {
						break
					}
					continue
				}
				mine = append(mine, time.Since(t0))
			}
			lat[i] = mine
		}()
	}
	wg.Wait()
	all := slices.Concat(lat...)
	slices.Sort(all)
	r := cellResult{Ops: int64(len(all)), Errors: errs.Load(), Elapsed: time.Since(start)}
	for i, l := range lat {
		n := int64(len(l))
		if i == 0 || n < r.WorkerMin {
			r.WorkerMin = n
		}
		r.WorkerMax = max(r.WorkerMax, n)
	}
	if p := firstErr.Load(); p != nil {
		r.FirstError = *p
	}
	r.P50, r.P99, r.P999 = percentile(all, 0.50), percentile(all, 0.99), percentile(all, 0.999)
	return r
}

// percentile returns the q-quantile of sorted (nearest rank); 0 if empty.
func percentile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted))+0.5) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// parallel runs f(i) for i in [0, n) on up to width goroutines and returns
// the first error.
func parallel(n, width int, f func(i int) error) error {
	var (
		next atomic.Int64
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	for range min(width, n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if err := f(i); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	switch len(errs) {
	case 0:
		return nil
	case 1:
		return errs[0]
	}
	return fmt.Errorf("%w (and %d more errors)", errs[0], len(errs)-1)
}
