package main

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	fencev1 "github.com/fence-dev/fence/api/fence/v1"
	"github.com/fence-dev/fence/api/fence/v1/fencev1connect"
	"github.com/fence-dev/fence/client"
)

// TestRefusedCallsCostLittle: with auth on, a call without credentials
// costs fenced about the CPU of an accepted Get (at most twice, measured
// in the same run), however large its body inflates, and many of them
// leave its memory where it was. Each refused call is an AcquireBatch of 524,280 empty
// items: 1 MiB of protobuf in 1 KB of gzip. fenced once inflated and
// decoded such a call before refusing it, at 150 ms of CPU and 50 MB
// each: 160 of them, 16 at a time, cost 77 s of CPU and took its resident
// memory to 644 MB.
func TestRefusedCallsCostLittle(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads fenced's CPU time and memory from /proc")
	}
	dir := t.TempDir()
	sum := sha256.Sum256([]byte("cost-secret"))
	authFile := filepath.Join(dir, "auth.json")
	if err := os.WriteFile(authFile, fmt.Appendf(nil, `{"tokens": [{"identity": "svc", "sha256": %q}],
		"rules": [{"identity": "svc", "prefix": "", "allow": ["get"]}]}`, hex.EncodeToString(sum[:])), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	c, err := client.New(addr, client.WithRetryTimeout(0), client.WithBearerToken("cost-secret"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	p := startUntil(t, filepath.Join(dir, "data"), addr, func(ctx context.Context) error {
		_, err := c.Get(ctx, "probe")
		return err
	}, "--auth-file", authFile)
	pid := p.cmd.Process.Pid

	get, err := proto.Marshal(&fencev1.GetRequest{Scope: "probe"})
	if err != nil {
		t.Fatal(err)
	}
	empty, err := proto.Marshal(&fencev1.AcquireBatchRequest{Acquires: make([]*fencev1.AcquireRequest, 524280)})
	if err != nil {
		t.Fatal(err)
	}
	var gz bytes.Buffer
	w := gzip.NewWriter(&gz)
	w.Write(empty)
	w.Close()
	bomb := gz.Bytes()

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// call sends n calls, 16 at a time, and returns fenced's CPU time per
	// call; each must be answered want.
	call := func(n int, path string, body []byte, gzipped, authorized bool, want int) time.Duration {
		t.Helper()
		before := cpuTime(t, pid)
		var wg sync.WaitGroup
		var mu sync.Mutex
		var failed error
		next := make(chan struct{}, n)
		for range n {
			next <- struct{}{}
		}
		close(next)
		for range 16 {
			wg.Go(func() {
				for range next {
					req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+path, bytes.NewReader(body))
					if err != nil {
						panic(err)
					}
					req.Header.Set("Content-Type", "application/proto")
					if gzipped {
						req.Header.Set("Content-Encoding", "gzip")
					}
					if authorized {
						req.Header.Set("Authorization", "Bearer cost-secret")
					}
					resp, err := h2cClient.Do(req)
					if err == nil {
						b, _ := io.ReadAll(resp.Body)
						resp.Body.Close()
						if resp.StatusCode != want {
							err = fmt.Errorf("%s: %.200s", resp.Status, b)
						}
					}
					if err != nil {
						mu.Lock()
						failed = err
						mu.Unlock()
					}
				}
			})
		}
		wg.Wait()
		if failed != nil {
			t.Fatalf("%s: %v; want %d", path, failed, want)
		}
		return (cpuTime(t, pid) - before) / time.Duration(n)
	}
	accept := func(n int) time.Duration {
		return call(n, fencev1connect.LeaseServiceGetProcedure, get, false, true, http.StatusOK)
	}
	refuse := func(n int) time.Duration {
		return call(n, fencev1connect.LeaseServiceAcquireBatchProcedure, bomb, true, false, http.StatusUnauthorized)
	}
	accept(100) // connections, pools and code paths warm
	rssBefore := memory(t, pid, "VmRSS")
	refuse(16)

	// Rounds of each in turn, compared by their medians: fenced's other
	// work (a garbage collection, a timer) and a busy machine's effects
	// (threads spinning for work, caches lost) fall into a round or two
	// of one kind, not into the whole of it, as they could into one long
	// measurement of each.
	const rounds, accepts, refusals = 5, 160, 32
	var accepted, refused []time.Duration
	for range rounds {
		accepted = append(accepted, accept(accepts))
		refused = append(refused, refuse(refusals))
	}
	t.Logf("fenced's CPU per call, by round: %v for an accepted Get, %v for a refused AcquireBatch of %d bytes inflating to %d", accepted, refused, len(bomb), len(empty))
	// Both are mostly HTTP/2 and system calls; the margin is for noise.
	// Inflated and decoded, a refused call cost a thousand Gets.
	if a, r := median(accepted), median(refused); float64(r)/float64(a) > 2 {
		t.Errorf("a call refused for want of credentials cost fenced %v of CPU (median of %d rounds), an accepted Get %v: %.1f times as much; want at most twice", r, rounds, a, float64(r)/float64(a))
	}
	peak, after := memory(t, pid, "VmHWM"), memory(t, pid, "VmRSS")
	t.Logf("fenced's resident memory: %d MiB before the refused calls, %d MiB after, peak %d MiB", rssBefore>>20, after>>20, peak>>20)
	if grew := peak - rssBefore; grew > 64<<20 {
		t.Errorf("%d refused calls, 16 at a time, took fenced's resident memory from %d MiB to a peak of %d MiB; want it to grow by less than 64 MiB", 16+rounds*refusals, rssBefore>>20, peak>>20)
	}
}

// median returns the middle of ds, which it sorts.
func median(ds []time.Duration) time.Duration {
	slices.Sort(ds)
	return ds[len(ds)/2]
}

// cpuTime is the CPU time process pid has used, to the nanosecond: the sum
// of its threads' time on a CPU in /proc/PID/task/*/schedstat. (The times
// in /proc/PID/stat count whole clock ticks, 10 ms.)
func cpuTime(t *testing.T, pid int) time.Duration {
	t.Helper()
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", pid))
	if err != nil || len(tasks) == 0 {
		t.Fatalf("the threads of pid %d: %v", pid, err)
	}
	var total time.Duration
	for _, task := range tasks {
		b, err := os.ReadFile(task)
		if err != nil {
			continue // a thread that just ended
		}
		ns, err := strconv.ParseInt(strings.Fields(string(b))[0], 10, 64)
		if err != nil {
			t.Fatalf("%s: %q: %v", task, b, err)
		}
		total += time.Duration(ns)
	}
	return total
}

// memory reads one of process pid's memory sizes (VmRSS, VmHWM) from
// /proc/PID/status, in bytes.
func memory(t *testing.T, pid int, field string) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				t.Fatalf("%s: %q: %v", field, line, err)
			}
			return kb << 10
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}
