package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/fence-dev/fence/client"
)

// roleScale measures one fenced node holding many leases.
const roleScale = "scale"

// heldResult is what one fenced node holding n leases costs.
type heldResult struct {
	Leases     int           `json:"leases"`
	GrantRate  float64       `json:"grants_per_s"` // while filling it, 64 clients
	AcquireP50 time.Duration `json:"acquire_p50_ns"`
	AcquireP99 time.Duration `json:"acquire_p99_ns"`
	Snapshot   int64         `json:"snapshot_bytes"`
	Restore    time.Duration `json:"restore_ns"` // kill -9, restart, until it answers
	// Where the memory is: once filled, once a snapshot covers every
	// grant and fenced has been left alone a while, and after the restart.
	Filled   memory `json:"filled"`
	Settled  memory `json:"settled"`
	Restored memory `json:"restored"`
}

// memory is a reading of a fenced process's memory. The resident set is
// the anonymous pages (mostly Go's heap) and the file pages mapped in (the
// Raft log's bbolt file); Heap is what the Go heap holds, live or not yet
// collected, and Live what the last collection left.
type memory struct {
	RSS  int64 `json:"rss_bytes"`
	Anon int64 `json:"rss_anon_bytes"`
	File int64 `json:"rss_file_bytes"`
	Heap int64 `json:"go_heap_alloc_bytes"`
	Live int64 `json:"go_heap_live_bytes"`
}

func (m memory) String() string {
	return fmt.Sprintf("RSS %s (anonymous %s, file %s; Go heap %s, %s live)",
		mib(m.RSS), mib(m.Anon), mib(m.File), mib(m.Heap), mib(m.Live))
}

// expiryResult is how fenced expires many leases whose deadlines are the
// same instant.
type expiryResult struct {
	Leases int           `json:"leases"`
	TTL    time.Duration `json:"ttl_ns"`
	First  time.Duration `json:"first_ns"` // from the deadline to the first expiry seen
	All    time.Duration `json:"all_ns"`   // from the deadline to the last expiry seen
}

// scaleMain fills one fenced node (its real binary, default durable
// settings) with each number of leases in turn, and reports its RSS, the
// latency of further acquires, its snapshot's size and the time it takes to
// come back from kill -9. Then it measures how fast it expires many leases
// that end at the same instant: it grants them, kills fenced and restarts
// it, and a restarted leader gives every held lease one full TTL from the
// same moment.
func scaleMain(args []string) error {
	fs := flag.NewFlagSet(roleScale, flag.ContinueOnError)
	bin := fs.String("fenced", "bin/fenced", "the fenced binary to measure")
	sizes := fs.String("leases", "100000,1000000", "comma-separated numbers of live leases to fill fenced with")
	expire := fs.Int("expire", 100_000, "leases to expire at one instant (0 skips)")
	data := fs.String("data", os.TempDir(), "directory for fenced's data (removed after)")
	out := fs.String("out", "results", "directory for the JSON results")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var res struct {
		Machine map[string]string `json:"machine"`
		Held    []heldResult      `json:"held"`
		Expiry  *expiryResult     `json:"expiry,omitempty"`
	}
	res.Machine = machineFacts()
	for _, s := range splitList(*sizes) {
		n, err := strconv.Atoi(s)
		if err != nil || n <= 0 {
			return fmt.Errorf("-leases: %q is not a positive number", s)
		}
		r, err := measureHeld(*bin, *data, n)
		if err != nil {
			return fmt.Errorf("%d leases: %w", n, err)
		}
		fmt.Printf("%9d leases: RSS %s (restored: %s); grants %.0f/s while filling; acquire p50 %s p99 %s; snapshot %s; restore after kill -9 %s\n",
			n, mib(r.Filled.RSS), mib(r.Restored.RSS), r.GrantRate, round(r.AcquireP50), round(r.AcquireP99), mib(r.Snapshot), round(r.Restore))
		fmt.Printf("%9s filled:   %s\n%9s settled:  %s\n%9s restored: %s\n", "", r.Filled, "", r.Settled, "", r.Restored)
		res.Held = append(res.Held, r)
	}
	if *expire > 0 {
		r, err := measureExpiry(*bin, *data, *expire)
		if err != nil {
			return fmt.Errorf("expiry of %d leases: %w", *expire, err)
		}
		fmt.Printf("%9d leases ending at one instant: all expired within %s of the first (which came %s after the deadline as seen from outside)\n", r.Leases, round(r.All-r.First), round(r.First))
		res.Expiry = &r
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		return err
	}
	path := filepath.Join(*out, "scale-"+time.Now().UTC().Format("20060102T150405Z")+".json")
	b, _ := json.MarshalIndent(res, "", "  ")
	fmt.Println("results:", path)
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// scaleFlags let leases live for the whole measurement without renewals,
// and snapshot soon after the filling ends: the 2,000 acquires after it
// pass the threshold, so a snapshot comes that covers every grant. (With
// the default threshold of 8,192 it came only if the last one taken while
// filling happened to be far enough back.) One holder takes them all: a
// million leases of one holder is what --max-leases-per-identity
// (100,000 by default, per holder with auth off) is there to refuse.
var scaleFlags = []string{"--max-ttl", "24h", "--snapshot-interval", "5s", "--snapshot-threshold", "1024", "--max-leases-per-identity", "0"}

// filled is a fenced of its own, in a fresh directory, holding n leases
// that one client granted, 64 at a time.
type filled struct {
	dir, addr string
	p         *proc
	c         *client.Client
	took      time.Duration // to grant them all
}

func fill(bin, data, prefix string, n int, ttl time.Duration) (*filled, error) {
	dir, err := os.MkdirTemp(data, "fence-"+prefix+"-")
	if err != nil {
		return nil, err
	}
	f := &filled{dir: dir}
	if f.p, f.addr, err = startFenced(bin, dir, "", scaleFlags...); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if f.c, err = client.New(f.addr, client.WithHolder("scale")); err != nil {
		f.close()
		return nil, err
	}
	start := time.Now()
	err = parallel(n, 64, func(i int) error {
		_, err := f.c.Grant(context.Background(), fmt.Sprintf("%s/%07d", prefix, i), client.WithTTL(ttl))
		return err
	})
	if err != nil {
		f.close()
		return nil, err
	}
	f.took = time.Since(start)
	return f, nil
}

// restart kill -9s fenced and starts it again on its data, and returns
// how long it took to answer again.
func (f *filled) restart(bin string) (time.Duration, error) {
	_ = syscall.Kill(-f.p.cmd.Process.Pid, syscall.SIGKILL)
	<-f.p.done
	start := time.Now()
	p, _, err := startFenced(bin, f.dir, f.addr, scaleFlags...)
	if err != nil {
		return 0, err
	}
	f.p = p
	return time.Since(start), nil
}

func (f *filled) close() {
	if f.c != nil {
		f.c.Close()
	}
	f.p.stop()
	os.RemoveAll(f.dir)
}

func measureHeld(bin, data string, n int) (heldResult, error) {
	r := heldResult{Leases: n}
	f, err := fill(bin, data, "scale", n, 12*time.Hour)
	if err != nil {
		return r, err
	}
	defer f.close()
	r.GrantRate = float64(n) / f.took.Seconds()
	r.Filled = f.memory()
	// The client batches concurrent grants into one log entry, so the
	// snapshot to wait for is the one covering the index applied now, not
	// index n.
	m, err := scrape("http://" + f.addr + "/metrics")
	if err != nil {
		return r, err
	}
	applied := uint64(m["fence_raft_applied_index"])

	// Further acquires, one at a time, as a program taking a lock would.
	ctx := context.Background()
	lat := make([]time.Duration, 2000)
	for i := range lat {
		t0 := time.Now()
		if _, err := f.c.Grant(ctx, fmt.Sprintf("probe/%d", i), client.WithTTL(12*time.Hour)); err != nil {
			return r, err
		}
		lat[i] = time.Since(t0)
	}
	slices.Sort(lat)
	r.AcquireP50, r.AcquireP99 = percentile(lat, 0.50), percentile(lat, 0.99)

	if r.Snapshot, err = awaitSnapshot(filepath.Join(f.dir, "data", "snapshots"), applied); err != nil {
		return r, err
	}
	time.Sleep(settle)
	r.Settled = f.memory()
	if r.Restore, err = f.restart(bin); err != nil {
		return r, err
	}
	r.Restored = f.memory()
	st, err := f.c.Get(ctx, fmt.Sprintf("scale/%07d", n-1))
	if err != nil || st.Lease == nil {
		return r, fmt.Errorf("after the restart, the last lease granted: %+v, %v; want it held", st, err)
	}
	return r, nil
}

// awaitSnapshot waits for a snapshot that covers at least index and returns
// the size of its state.
func awaitSnapshot(dir string, index uint64) (int64, error) {
	deadline := time.Now().Add(10 * time.Minute)
	for time.Now().Before(deadline) {
		metas, _ := filepath.Glob(filepath.Join(dir, "*", "meta.json"))
		for _, m := range metas {
			if strings.HasSuffix(filepath.Dir(m), ".tmp") {
				continue // still being written: raft renames it when done
			}
			var meta struct{ Index, Size uint64 }
			b, err := os.ReadFile(m)
			if err == nil && json.Unmarshal(b, &meta) == nil && meta.Index >= index {
				fi, err := os.Stat(filepath.Join(filepath.Dir(m), "state.bin"))
				if err == nil && uint64(fi.Size()) == meta.Size {
					return fi.Size(), nil
				}
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	return 0, fmt.Errorf("no snapshot of index %d in %s after 10 minutes", index, dir)
}

func measureExpiry(bin, data string, n int) (expiryResult, error) {
	const ttl = time.Minute
	r := expiryResult{Leases: n, TTL: ttl}
	f, err := fill(bin, data, "expire", n, ttl)
	if err != nil {
		return r, err
	}
	defer f.close()
	if f.took > ttl/2 {
		return r, fmt.Errorf("granting took %s, too long for leases of %s", round(f.took), ttl)
	}
	// The restarted leader gives every lease a full TTL from when it takes
	// office, just before it answers: the deadline is at most ttl after
	// the moment it is seen ready.
	if _, err := f.restart(bin); err != nil {
		return r, err
	}
	deadline := time.Now().Add(ttl)
	for end := deadline.Add(5 * time.Minute); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		m, err := scrape("http://" + f.addr + "/metrics")
		if err != nil {
			return r, err
		}
		if r.First == 0 && m["fence_lease_expirations_total"] > 0 {
			r.First = time.Since(deadline)
		}
		if m["fence_lease_expirations_total"] >= float64(n) && m["fence_leases_held"] == 0 {
			r.All = time.Since(deadline)
			return r, nil
		}
	}
	return r, fmt.Errorf("not all %d leases expired 5 minutes after their deadline", n)
}

// scrape reads the unlabelled samples of a Prometheus text exposition.
func scrape(url string) (map[string]float64, error) {
	resp, err := http.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(io.LimitReader(resp.Body, 16<<20))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), " ")
		if !ok || strings.HasPrefix(name, "#") || strings.Contains(name, "{") {
			continue
		}
		if v, err := strconv.ParseFloat(value, 64); err == nil {
			out[name] = v
		}
	}
	return out, sc.Err()
}

// settle is how long fenced is left alone before the settled reading: the
// runtime forces a collection every two minutes, and returns the pages
// freed by it to the system in the background.
const settle = 150 * time.Second

// memory reads fenced's memory: the process's from /proc, the Go heap's
// from its metrics. A field it cannot read is 0.
func (f *filled) memory() memory {
	var m memory
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", f.p.cmd.Process.Pid)); err == nil {
		for line := range strings.SplitSeq(string(b), "\n") {
			name, v, _ := strings.Cut(line, ":")
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			switch name {
			case "VmRSS":
				m.RSS = kb << 10
			case "RssAnon":
				m.Anon = kb << 10
			case "RssFile":
				m.File = kb << 10
			}
		}
	}
	if s, err := scrape("http://" + f.addr + "/metrics"); err == nil {
		m.Heap = int64(s["go_memstats_heap_alloc_bytes"])
		// The collector aims the next collection at twice what the last
		// left live (GOGC 100).
		m.Live = int64(s["go_memstats_next_gc_bytes"] / 2)
	}
	return m
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }
