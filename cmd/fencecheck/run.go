package main

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/client"
	"github.com/fence-dev/fence/internal/history"
)

// config is what run was asked to do.
type config struct {
	d         time.Duration
	seed      uint64
	workers   int
	scopes    int // per store
	nodes     int
	ttl       time.Duration
	faults    []string
	noFence   bool
	postgres  string
	s3        string   // S3 server and bucket of the s3/ scopes
	stores    []string // whose scopes the workers use: bolt, pg, s3
	dir       string
	fencedBin string
	keep      bool
	timeout   time.Duration // linearizability search
	follow    bool          // a follower advances the odd scopes' marks
	lateBound time.Duration // check 5's bound; 0: the windows are measured only
}

func runCmd(args []string) (int, error) {
	var cfg config
	fs := flag.NewFlagSet("fencecheck run", flag.ContinueOnError)
	fs.DurationVar(&cfg.d, "time", 20*time.Second, "how long the workers run and faults are injected")
	fs.Uint64Var(&cfg.seed, "seed", 0, "seed of the fault schedule and the workers' choices (0: pick one and print it)")
	fs.IntVar(&cfg.workers, "workers", 4, "number of worker processes")
	fs.IntVar(&cfg.scopes, "scopes", 2, "scopes per store: fewer scopes, more contention")
	fs.IntVar(&cfg.nodes, "nodes", 1, "fenced nodes: 1, or 3 or 5 for a Raft cluster")
	fs.DurationVar(&cfg.ttl, "ttl", time.Second, "the workers' lease TTL")
	faults := fs.String("faults", "all", "faults to inject, comma-separated: "+strings.Join(allFaults, ",")+"; or all, or none")
	fs.BoolVar(&cfg.noFence, "no-fence", false, "UNSAFE: the resource applies writes without checking tokens; the checks must then find anomalies")
	fs.StringVar(&cfg.postgres, "postgres", os.Getenv("FENCE_TEST_POSTGRES"), "PostgreSQL DSN for the pg/ scopes, fenced by sqlguard (default $FENCE_TEST_POSTGRES; empty: bbolt only)")
	fs.StringVar(&cfg.s3, "s3", "", "S3 server and bucket for the s3/ scopes, fenced by s3guard: http://KEY:SECRET@HOST:PORT/BUCKET, such as $FENCE_TEST_S3 (empty: none)")
	stores := fs.String("stores", "", "the stores whose scopes the workers use, comma-separated: bolt, pg, s3 (default bolt, with pg and s3 when --postgres and --s3 name their servers)")
	fs.StringVar(&cfg.dir, "dir", "", "directory for the history, logs and data, kept (default: a new temporary directory, removed after a run that passes)")
	fs.StringVar(&cfg.fencedBin, "fenced", "", "the fenced binary (default: fenced beside this binary, else built with go build)")
	fs.BoolVar(&cfg.keep, "keep-tables", false, "keep the run's PostgreSQL tables and S3 objects")
	fs.DurationVar(&cfg.timeout, "check-timeout", 2*time.Minute, "bound on the linearizability search of each scope")
	fs.BoolVar(&cfg.follow, "follow", true, "a follower in the resource advances the marks of every other scope (STORE/f1, STORE/f3, ...) at each grant and end of a lease; the run measures the window with and without it")
	fs.DurationVar(&cfg.lateBound, "late-bound", 0, "fail the run if a followed scope accepts a write longer than this after the service ended its lease (0: measure only)")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "Usage: fencecheck run [flags]\n\nFlags:")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return 0, usageError{err}
	}
	var err error
	if cfg.faults, err = parseFaults(*faults); err != nil {
		return 0, usageError{err}
	}
	switch {
	case fs.NArg() > 0:
		return 0, usageError{fmt.Errorf("unexpected argument %q", fs.Arg(0))}
	case cfg.d < 5*time.Second || cfg.d > 24*time.Hour:
		return 0, usageError{fmt.Errorf("--time %v: want 5s to 24h", cfg.d)}
	case cfg.workers < 1 || cfg.workers > 64:
		return 0, usageError{fmt.Errorf("--workers %d: want 1 to 64", cfg.workers)}
	case cfg.scopes < 1 || cfg.scopes > 64:
		return 0, usageError{fmt.Errorf("--scopes %d: want 1 to 64", cfg.scopes)}
	case cfg.nodes != 1 && cfg.nodes != 3 && cfg.nodes != 5:
		return 0, usageError{fmt.Errorf("--nodes %d: want 1, 3 or 5", cfg.nodes)}
	case cfg.ttl < 200*time.Millisecond || cfg.ttl > time.Minute:
		return 0, usageError{fmt.Errorf("--ttl %v: want 200ms to 1m", cfg.ttl)}
	case cfg.lateBound < 0 || cfg.lateBound > 0 && !cfg.follow:
		return 0, usageError{fmt.Errorf("--late-bound %v: want a positive duration, with --follow", cfg.lateBound)}
	}
	if cfg.stores, err = parseStores(*stores, &cfg); err != nil {
		return 0, usageError{err}
	}
	if cfg.seed == 0 {
		cfg.seed = uint64(time.Now().UnixNano()%1_000_000) + 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	r := &runner{cfg: cfg, out: os.Stdout, ended: make(chan struct{})}
	rep, err := r.run(ctx)
	r.cleanUp(err == nil && rep.Count() == 0)
	if err != nil {
		return 0, err
	}
	if rep.Count() > 0 {
		return exitAnomalies, nil
	}
	return exitOK, nil
}

// parseStores returns the stores of --stores, each with its server, and
// forgets the servers of the stores it leaves out.
func parseStores(list string, cfg *config) ([]string, error) {
	if list == "" {
		stores := []string{"bolt"}
		if cfg.postgres != "" {
			stores = append(stores, "pg")
		}
		if cfg.s3 != "" {
			stores = append(stores, "s3")
		}
		return stores, nil
	}
	var stores []string
	for st := range strings.SplitSeq(list, ",") {
		switch {
		case st != "bolt" && st != "pg" && st != "s3":
			return nil, fmt.Errorf("--stores: no store %q; want bolt, pg or s3", st)
		case slices.Contains(stores, st):
			return nil, fmt.Errorf("--stores: %s twice", st)
		case st == "pg" && cfg.postgres == "":
			return nil, errors.New("--stores: pg needs --postgres (or $FENCE_TEST_POSTGRES)")
		case st == "s3" && cfg.s3 == "":
			return nil, errors.New("--stores: s3 needs --s3")
		}
		stores = append(stores, st)
	}
	if !slices.Contains(stores, "pg") {
		cfg.postgres = ""
	}
	if !slices.Contains(stores, "s3") {
		cfg.s3 = ""
	}
	return stores, nil
}

// cleanUp removes the temporary directory of a run that passed, and says
// where a failed one's files are. A directory given with --dir stays.
func (r *runner) cleanUp(passed bool) {
	switch {
	case r.cfg.dir != "" || r.dir == "":
	case passed:
		if err := os.RemoveAll(r.dir); err != nil {
			fmt.Fprintf(os.Stderr, "fencecheck: remove %s: %v\n", r.dir, err)
			return
		}
		r.printf("removed %s: the run passed (give --dir to keep a run's files)\n", r.dir)
	default:
		r.printf("kept %s: the history, schedule and every process's log\n", r.dir)
	}
}

func checkCmd(args []string) (int, error) {
	fs := flag.NewFlagSet("fencecheck check", flag.ContinueOnError)
	timeout := fs.Duration("check-timeout", 2*time.Minute, "bound on the linearizability search of each scope")
	lateBound := fs.Duration("late-bound", 0, "fail if a followed scope accepted a write longer than this after the service ended its lease (0: measure only)")
	if err := fs.Parse(args); err != nil {
		return 0, usageError{err}
	}
	if fs.NArg() != 1 {
		return 0, usageError{errors.New("check: give one history file")}
	}
	evs, err := history.ReadFile(fs.Arg(0))
	if err != nil {
		return 0, err
	}
	rep := history.Check(evs, history.Options{LinearizabilityTimeout: *timeout, VisualizeDir: filepath.Dir(fs.Arg(0)), LateBound: *lateBound})
	rep.Write(os.Stdout)
	if rep.Count() > 0 {
		return exitAnomalies, nil
	}
	return exitOK, nil
}

// runner carries out one run.
type runner struct {
	cfg       config
	out       io.Writer
	dir       string
	self      string
	fencedBin string
	prefix    string // of the PostgreSQL tables and, with a '/' after it, of the S3 objects
	sched     schedule
	nodes     []*node
	admin     *client.Client // to every node directly
	resource  *proc
	resAddr   string
	workers   []*workerProc
	nemesis   *history.Writer
	service   *history.Writer // the ends of leases, as the service records them
	wg        sync.WaitGroup  // injections in progress
	ended     chan struct{}   // closed when the run's time is up

	mu       sync.Mutex
	missed   map[string]map[string]int // planned faults not injected: kind → why → count
	outcomes map[string]map[string]int // how storage faults ended: kind → what → count
}

// workerProc is a worker and the proxies between it and the others.
type workerProc struct {
	name   string
	p      *proc
	res    *proxy   // to the resource
	fenced []*proxy // to each fenced node
	rate   float64
}

// scopes returns the scopes of the run. With --follow the odd ones are
// named STORE/fN, the prefix the resource's follower advances.
func (r *runner) scopes() []string {
	var s []string
	for _, store := range r.cfg.stores {
		for i := range r.cfg.scopes {
			f := ""
			if r.cfg.follow && i%2 == 1 {
				f = "f"
			}
			s = append(s, fmt.Sprintf("%s/%s%d", store, f, i))
		}
	}
	return s
}

// followed returns the scopes of the run the follower advances.
func (r *runner) followed() []string {
	var s []string
	for _, scope := range r.scopes() {
		if strings.Contains(scope, "/f") {
			s = append(s, scope)
		}
	}
	return s
}

func (r *runner) printf(format string, args ...any) { fmt.Fprintf(r.out, format, args...) }

func (r *runner) run(ctx context.Context) (*history.Report, error) {
	cfg := r.cfg
	var err error
	if r.dir = cfg.dir; r.dir == "" {
		if r.dir, err = os.MkdirTemp("", "fencecheck-"); err != nil {
			return nil, err
		}
	} else if err = os.MkdirAll(r.dir, 0o755); err != nil {
		return nil, err
	} else if ents, _ := os.ReadDir(r.dir); len(ents) > 0 {
		return nil, usageError{fmt.Errorf("--dir %s is not empty: a run needs fresh data directories", r.dir)}
	}
	if r.self, err = os.Executable(); err != nil {
		return nil, err
	}
	if r.fencedBin, err = r.findFenced(); err != nil {
		return nil, err
	}
	r.sched = plan(cfg.seed, cfg.d, cfg.workers, cfg.nodes, cfg.ttl, cfg.faults)
	r.prefix = fmt.Sprintf("fencecheck_%d_%d", cfg.seed, time.Now().UnixNano()%1e9)
	var names []string
	for _, st := range cfg.stores {
		names = append(names, map[string]string{"bolt": "bbolt (boltguard)", "pg": "PostgreSQL (sqlguard)", "s3": "an S3 bucket (s3guard)"}[st])
	}
	stores := strings.Join(names, ", ")
	fenceState := "ON"
	if cfg.noFence {
		fenceState = "OFF (--no-fence: writes are applied unchecked)"
	}
	r.printf("fencecheck: seed %d, %v, fenced %d node(s), %d workers on %d scopes, TTL %v, resource in %s, fence %s\n",
		cfg.seed, cfg.d, cfg.nodes, cfg.workers, len(r.scopes()), cfg.ttl, stores, fenceState)
	planned := r.sched.counts()
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(planned)) {
		parts = append(parts, fmt.Sprintf("%s %d", k, planned[k]))
	}
	r.printf("schedule: %s\n", strings.Join(parts, ", "))
	var plan strings.Builder
	for i, rate := range r.sched.rates {
		fmt.Fprintf(&plan, "w%d clock rate %.3f\n", i+1, rate)
	}
	for _, f := range r.sched.faults {
		fmt.Fprintln(&plan, f)
	}
	if err := os.WriteFile(filepath.Join(r.dir, "schedule.txt"), []byte(plan.String()), 0o644); err != nil {
		return nil, err
	}
	r.printf("directory: %s\n", r.dir)

	if r.nemesis, err = history.Create(filepath.Join(r.dir, "nemesis.jsonl")); err != nil {
		return nil, err
	}
	defer r.nemesis.Close()
	meta, _ := json.Marshal(map[string]any{
		"seed": cfg.seed, "time": cfg.d.String(), "workers": cfg.workers, "scopes": r.scopes(), "nodes": cfg.nodes,
		"ttl": cfg.ttl.String(), "faults": cfg.faults, "no_fence": cfg.noFence, "rates": r.sched.rates, "followed": r.followed(),
	})
	r.nemesis.Add(history.Event{Type: history.Meta, Proc: "fencecheck", Detail: string(meta)})

	defer r.teardown()
	if err := r.startNodes(ctx); err != nil {
		return nil, err
	}
	if r.service, err = history.Create(filepath.Join(r.dir, "service.jsonl")); err != nil {
		return nil, err
	}
	defer r.service.Close()
	wctx, stopWatch := context.WithCancel(ctx)
	watched := make(chan struct{})
	go func() { defer close(watched); r.watchEnds(wctx) }()
	defer func() { stopWatch(); <-watched }()
	if err := r.startResource(ctx); err != nil {
		return nil, err
	}
	if err := r.startWorkers(); err != nil {
		return nil, err
	}
	r.inject(ctx)
	r.printf("faults done; stopping the workers\n")
	finals, applied, err := r.finish(ctx)
	if err != nil {
		return nil, err
	}
	stopWatch()
	<-watched
	for _, w := range r.workers {
		for range w.res.droppedHolds() {
			r.miss(faultDelay, "its request was still held back when the run ended, and was dropped")
		}
	}
	r.printMissed()
	r.printOutcomes()
	path, evs, err := r.merge(finals, applied)
	if err != nil {
		return nil, err
	}
	r.printf("history: %s (%d events)\n", path, len(evs))
	rep := history.Check(evs, history.Options{LinearizabilityTimeout: cfg.timeout, VisualizeDir: r.dir, LateBound: cfg.lateBound})
	rep.Write(r.out)
	if rep.Accepted == 0 {
		return nil, errors.New("the workers got no read or write through: the run proves nothing (see the logs in " + r.dir + ")")
	}
	return rep, nil
}

// findFenced returns the fenced binary: --fenced, or fenced beside this
// binary, or one built now from this module.
func (r *runner) findFenced() (string, error) {
	if r.cfg.fencedBin != "" {
		return r.cfg.fencedBin, nil
	}
	beside := filepath.Join(filepath.Dir(r.self), "fenced")
	if _, err := os.Stat(beside); err == nil {
		return beside, nil
	}
	bin := filepath.Join(r.dir, "fenced")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/fence-dev/fence/cmd/fenced").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("no fenced beside %s and go build failed (give --fenced): %v\n%s", r.self, err, out)
	}
	return bin, nil
}

func (r *runner) startResource(ctx context.Context) error {
	addr, err := freePort("127.0.0.1")
	if err != nil {
		return err
	}
	args := []string{"resource", "--listen", addr, "--bolt", filepath.Join(r.dir, "resource.db")}
	if r.cfg.postgres != "" {
		args = append(args, "--postgres", r.cfg.postgres, "--pg-prefix", r.prefix)
	}
	if r.cfg.s3 != "" {
		args = append(args, "--s3", r.cfg.s3, "--s3-prefix", r.prefix+"/")
	}
	if r.cfg.noFence {
		args = append(args, "--no-fence")
	}
	if r.cfg.follow {
		var addrs []string
		for _, nd := range r.nodes {
			addrs = append(addrs, nd.api)
		}
		args = append(args, "--follow", strings.Join(addrs, ","))
	}
	r.resource = newProc(r.dir, "resource", r.self, args...)
	r.resAddr = addr
	if err := r.resource.start(); err != nil {
		return err
	}
	return waitHTTP(ctx, "http://"+addr+"/healthz", 30*time.Second)
}

func (r *runner) startWorkers() error {
	for i := range r.cfg.workers {
		w := &workerProc{name: fmt.Sprintf("w%d", i+1), rate: r.sched.rates[i]}
		var err error
		if w.res, err = newProxy("127.0.0.1", r.resAddr); err != nil {
			return err
		}
		w.res.setOnHold(func(d time.Duration) {
			r.fault(faultDelay, fmt.Sprintf("%s: a resource request held back for %v, then delivered", w.name, d.Round(time.Millisecond)))
		})
		var addrs []string
		for _, nd := range r.nodes {
			p, err := newProxy("127.0.0.1", nd.api)
			if err != nil {
				return err
			}
			w.fenced = append(w.fenced, p)
			addrs = append(addrs, p.addr())
		}
		w.p = newProc(r.dir, w.name, r.self, "worker", "--name", w.name, "--fenced", strings.Join(addrs, ","),
			"--resource", w.res.addr(), "--history", filepath.Join(r.dir, w.name+".jsonl"),
			"--scopes", strings.Join(r.scopes(), ","), "--ttl", r.cfg.ttl.String(),
			"--clock-rate", fmt.Sprint(w.rate), "--time", r.cfg.d.String(), "--seed", fmt.Sprint(r.cfg.seed))
		r.workers = append(r.workers, w)
	}
	for _, w := range r.workers {
		if err := w.p.start(); err != nil {
			return err
		}
		if w.rate != 1 {
			r.fault(faultDrift, fmt.Sprintf("%s: its clock runs at %.2f times real time", w.name, w.rate))
		}
	}
	return nil
}

// fault records an injected fault in the history.
func (r *runner) fault(kind, detail string) {
	r.nemesis.Add(history.Event{Type: history.Fault, Proc: "nemesis", F: kind, Detail: detail})
}

// finish heals every fault, stops the workers, and reads the final state:
// each register's value and each scope's last token at the service, and
// the resource's log.
func (r *runner) finish(ctx context.Context) ([]history.Event, []history.Event, error) {
	for _, w := range r.workers {
		w.p.resume()
		for _, p := range w.fenced {
			p.setCut(false)
		}
	}
	for _, nd := range r.nodes {
		if nd.raftProxy != nil {
			r.isolate(nd, false)
		}
	}
	var wg sync.WaitGroup
	for _, w := range r.workers {
		wg.Add(1)
		go func() { defer wg.Done(); w.p.stop(20 * time.Second) }()
	}
	wg.Wait()
	for _, w := range r.workers {
		w.res.close() // held requests are dropped undelivered
	}
	for _, nd := range r.nodes {
		if !nd.p.running() {
			if err := nd.p.start(); err != nil {
				return nil, nil, err
			}
		}
	}
	var finals []history.Event
	for _, scope := range r.scopes() {
		var v string
		err := waitFor(ctx, 10*time.Second, "the final value of "+scope, func(ctx context.Context) error {
			var err error
			v, err = httpGet(ctx, "http://"+r.resAddr+"/value/"+scope)
			return err
		})
		if err != nil {
			return nil, nil, err
		}
		e := history.Event{Type: history.Final, Proc: "checker", Scope: scope, Value: v}
		e.Wall, e.Mono = history.Now()
		gctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		st, err := r.admin.Get(gctx, scope)
		cancel()
		if err != nil {
			return nil, nil, fmt.Errorf("final state of %s at fenced: %w", scope, err)
		}
		e.Token = st.LastToken
		finals = append(finals, e)
	}
	body, err := httpGet(ctx, "http://"+r.resAddr+"/log")
	if err != nil {
		return nil, nil, fmt.Errorf("the resource's log: %w", err)
	}
	applied, err := history.Decode(strings.NewReader(body))
	if err != nil {
		return nil, nil, fmt.Errorf("the resource's log: %w", err)
	}
	return finals, applied, nil
}

func httpGet(ctx context.Context, url string) (string, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("%s: %s", resp.Status, b)
	}
	return string(b), err
}

// teardown stops every process and proxy and drops the run's tables and
// objects.
func (r *runner) teardown() {
	for _, w := range r.workers {
		if w.p.running() {
			w.p.kill()
		}
		w.res.close()
		for _, p := range w.fenced {
			p.close()
		}
	}
	if r.resource != nil {
		r.resource.stop(5 * time.Second)
	}
	for _, nd := range r.nodes {
		nd.p.stop(5 * time.Second)
		if nd.raftProxy != nil {
			nd.raftProxy.close()
		}
		r.releaseDisk(nd)
	}
	if r.admin != nil {
		r.admin.Close()
	}
	if r.cfg.postgres != "" && !r.cfg.keep {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := dropPostgres(ctx, r.cfg.postgres, r.prefix); err != nil {
			fmt.Fprintf(os.Stderr, "fencecheck: drop the tables %s_*: %v\n", r.prefix, err)
		}
	}
	if r.cfg.s3 != "" && !r.cfg.keep {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := deleteS3(ctx, r.cfg.s3, r.prefix+"/"); err != nil {
			fmt.Fprintf(os.Stderr, "fencecheck: delete the objects under %s/: %v\n", r.prefix, err)
		}
	}
}

// merge writes every process's events, the resource's log and the final
// state into one history file, in monotonic-time order.
func (r *runner) merge(finals, applied []history.Event) (string, []history.Event, error) {
	var evs []history.Event
	files := []string{filepath.Join(r.dir, "nemesis.jsonl"), filepath.Join(r.dir, "service.jsonl")}
	for _, w := range r.workers {
		files = append(files, filepath.Join(r.dir, w.name+".jsonl"))
	}
	for _, f := range files {
		e, err := history.ReadFile(f)
		if err != nil {
			return "", nil, err
		}
		evs = append(evs, e...)
	}
	evs = append(evs, applied...)
	evs = append(evs, finals...)
	slices.SortStableFunc(evs, func(a, b history.Event) int {
		return cmp.Or(cmp.Compare(rank(a), rank(b)), cmp.Compare(a.Mono, b.Mono))
	})
	path := filepath.Join(r.dir, "history.jsonl")
	f, err := os.Create(path)
	if err != nil {
		return "", nil, err
	}
	bw := bufio.NewWriter(f)
	enc := json.NewEncoder(bw)
	for _, e := range evs {
		enc.Encode(e)
	}
	if err := bw.Flush(); err != nil {
		f.Close()
		return "", nil, err
	}
	return path, evs, f.Close()
}

// watchEnds records the end of every lease the service reports on its
// watch stream, at the time the service recorded it, until ctx ends. A
// broken watch resumes where it was; ends the service no longer holds are
// missing from the record, which only leaves their windows unmeasured.
func (r *runner) watchEnds(ctx context.Context) {
	var pos uint64
	for ctx.Err() == nil {
		var err error
		for e, werr := range r.admin.Watch(ctx, "", pos) {
			if werr != nil {
				err = werr
				break
			}
			pos = e.Position + 1
			if e.Kind != client.EventReleased && e.Kind != client.EventExpired {
				continue
			}
			wall, mono := history.Now()
			r.service.Add(history.Event{Type: history.End, Proc: "fenced", F: string(e.Kind), Scope: e.Scope,
				Token: e.Token, Closing: e.Closing, Wall: e.Time, Mono: mono - int64(wall.Sub(e.Time))})
		}
		if errors.Is(err, fence.ErrMissedEvents) {
			r.note("watch", fmt.Sprintf("the service no longer held the events from position %d; the ends before the watch resumed are not measured", pos))
			pos = 0
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// rank puts the run's parameters first.
func rank(e history.Event) int {
	if e.Type == history.Meta {
		return 0
	}
	return 1
}
