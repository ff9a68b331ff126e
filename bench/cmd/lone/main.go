// Command lone measures a lone client's lock cycle against fenced (one
// node, its defaults: raft-wal, fsync on, signed tokens): Acquire, then
// Release, through the Go client, one after the other, as the lock-cycle
// cell of cmd/peers does at one client. It reports the cycles a second,
// the latency's p50, and what each cycle costs: CPU of fenced and of the
// client, their context switches (voluntary and not), and the disk's flush
// requests (device-wide, /proc/diskstats).
//
// Given several fenced binaries it runs them in turn, run after run, each
// on a fresh data directory, and prints each binary's medians: an A/B
// comparison on a busy machine, where only alternating runs are fair.
//
//	lone -fenced bin/fenced -time 10s
//	lone -fenced bin/fenced-a,bin/fenced-b -runs 5 -time 5s
//	lone -fenced bin/fenced -attach 'perf record -g -o /tmp/fenced.perf -p {pid}'
//	lone -fenced bin/fenced -attach 'strace -f -c -p {pid}'
//	lone -fenced bin/fenced -cpuprofile /tmp/client.pprof
//	perf script -i /tmp/fenced.perf | lone -stages server
//
// -attach runs a command on fenced ({pid} is its process ID, {self} the
// client's) for the
// measured time of the last run, and stops it with SIGINT: perf record
// shows where fenced's CPU goes, the kernel's share included (perf report
// -i FILE), strace -c its system calls. -cpuprofile writes the client's
// CPU profile of the last run. -stages reads perf script's output (of a
// perf record -g of fenced, or of this process, -stages client) and
// prints the share of the samples each part of the path took (stages.go).
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/fence-dev/fence/client"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "lone:", err)
		os.Exit(1)
	}
}

type result struct {
	rate      float64
	p50       time.Duration
	serverCPU time.Duration // a cycle
	clientCPU time.Duration
	serverCS  [2]float64 // voluntary, involuntary, a cycle
	clientCS  [2]float64
	flushes   float64
	cycles    int
	elapsed   time.Duration
}

func run() error {
	fenced := flag.String("fenced", "bin/fenced", "comma-separated fenced binaries, run in turn")
	runs := flag.Int("runs", 1, "runs of each binary")
	d := flag.Duration("time", 10*time.Second, "measured time of a run")
	data := flag.String("data", os.TempDir(), "directory for the data directories (each run a fresh one, removed after)")
	attach := flag.String("attach", "", "a command to run on fenced for the last run's measured time, {pid} its process ID, stopped with SIGINT")
	cpuprofile := flag.String("cpuprofile", "", "write the client's CPU profile of the last run to this file")
	extra := flag.String("args", "", "more fenced flags, space-separated")
	stages := flag.String("stages", "", "measure nothing: read perf script output from stdin and print each stage's share of it, of the server or the client")
	flag.Parse()
	switch *stages {
	case "":
	case "server":
		return printStages(os.Stdin, os.Stdout, serverStages)
	case "client":
		return printStages(os.Stdin, os.Stdout, clientStages)
	default:
		return fmt.Errorf("-stages %q: want server or client", *stages)
	}
	bins := strings.Split(*fenced, ",")
	all := make([][]result, len(bins))
	for r := range *runs {
		for i, bin := range bins {
			last := r == *runs-1 && i == len(bins)-1
			opt := runOpts{bin: bin, d: *d, data: *data, extra: strings.Fields(*extra)}
			if last {
				opt.attach, opt.cpuprofile = *attach, *cpuprofile
			}
			res, err := measure(opt)
			if err != nil {
				return fmt.Errorf("%s: %w", bin, err)
			}
			all[i] = append(all[i], res)
			fmt.Printf("run %d %-28s %s\n", r+1, bin, res)
		}
	}
	if *runs > 1 {
		for i, bin := range bins {
			fmt.Printf("median %-25s %s\n", bin, median(all[i]))
		}
	}
	return nil
}

func (r result) String() string {
	return fmt.Sprintf("%6.0f cycles/s  p50 %-8s CPU/cycle server %4d µs client %4d µs  switches/cycle server %.1f+%.1f client %.1f+%.1f  flushes/cycle %.2f",
		r.rate, r.p50.Round(time.Microsecond), r.serverCPU.Microseconds(), r.clientCPU.Microseconds(),
		r.serverCS[0], r.serverCS[1], r.clientCS[0], r.clientCS[1], r.flushes)
}

// median takes each figure's median over the runs on its own.
func median(rs []result) result {
	f := func(get func(result) float64) float64 {
		v := make([]float64, len(rs))
		for i, r := range rs {
			v[i] = get(r)
		}
		slices.Sort(v)
		return v[len(v)/2]
	}
	return result{
		rate:      f(func(r result) float64 { return r.rate }),
		p50:       time.Duration(f(func(r result) float64 { return float64(r.p50) })),
		serverCPU: time.Duration(f(func(r result) float64 { return float64(r.serverCPU) })),
		clientCPU: time.Duration(f(func(r result) float64 { return float64(r.clientCPU) })),
		serverCS:  [2]float64{f(func(r result) float64 { return r.serverCS[0] }), f(func(r result) float64 { return r.serverCS[1] })},
		clientCS:  [2]float64{f(func(r result) float64 { return r.clientCS[0] }), f(func(r result) float64 { return r.clientCS[1] })},
		flushes:   f(func(r result) float64 { return r.flushes }),
	}
}

type runOpts struct {
	bin                string
	d                  time.Duration
	data               string
	extra              []string
	attach, cpuprofile string
}

func measure(o runOpts) (result, error) {
	dir, err := os.MkdirTemp(o.data, "lone-")
	if err != nil {
		return result{}, err
	}
	defer os.RemoveAll(dir)
	addr, err := freeAddr()
	if err != nil {
		return result{}, err
	}
	logf, err := os.Create(filepath.Join(dir, "fenced.log"))
	if err != nil {
		return result{}, err
	}
	defer logf.Close()
	cmd := exec.Command(o.bin, append([]string{"--data-dir", filepath.Join(dir, "data"), "--listen", addr}, o.extra...)...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return result{}, err
	}
	defer func() {
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
	}()
	if err := ready(addr, 30*time.Second); err != nil {
		log, _ := os.ReadFile(logf.Name())
		return result{}, fmt.Errorf("%w; its log:\n%s", err, log)
	}
	c, err := client.New(addr, client.WithHolder("lone"))
	if err != nil {
		return result{}, err
	}
	defer c.Close()
	ctx := context.Background()
	cycle := func() error {
		l, err := c.Acquire(ctx, "lone/0", client.WithTTL(10*time.Second))
		if err != nil {
			return err
		}
		return l.Release(ctx)
	}
	// Warm up: connections, the scope, the runtime.
	for range 200 {
		if err := cycle(); err != nil {
			return result{}, err
		}
	}
	pid := cmd.Process.Pid
	var rec *exec.Cmd
	if o.attach != "" {
		args := strings.Fields(strings.NewReplacer("{pid}", strconv.Itoa(pid), "{self}", strconv.Itoa(os.Getpid())).Replace(o.attach))
		rec = exec.Command(args[0], args[1:]...)
		rec.Stdout, rec.Stderr = os.Stderr, os.Stderr
		if err := rec.Start(); err != nil {
			return result{}, fmt.Errorf("%s: %w", args[0], err)
		}
		time.Sleep(500 * time.Millisecond)
	}
	if o.cpuprofile != "" {
		f, err := os.Create(o.cpuprofile)
		if err != nil {
			return result{}, err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return result{}, err
		}
	}
	s0, c0, f0 := procCPU(pid), selfUsage(), flushes()
	sv0, si0 := procSwitches(pid)
	start := time.Now()
	var lat []time.Duration
	for time.Since(start) < o.d {
		t := time.Now()
		if err := cycle(); err != nil {
			return result{}, err
		}
		lat = append(lat, time.Since(t))
	}
	elapsed := time.Since(start)
	s1, c1, f1 := procCPU(pid), selfUsage(), flushes()
	sv1, si1 := procSwitches(pid)
	if o.cpuprofile != "" {
		pprof.StopCPUProfile()
	}
	if rec != nil {
		rec.Process.Signal(syscall.SIGINT)
		rec.Wait()
	}
	n := len(lat)
	slices.Sort(lat)
	per := func(v float64) float64 { return v / float64(n) }
	return result{
		rate:      float64(n) / elapsed.Seconds(),
		p50:       lat[n/2],
		serverCPU: (s1 - s0) / time.Duration(n),
		clientCPU: (c1.cpu - c0.cpu) / time.Duration(n),
		serverCS:  [2]float64{per(float64(sv1 - sv0)), per(float64(si1 - si0))},
		clientCS:  [2]float64{per(float64(c1.vol - c0.vol)), per(float64(c1.invol - c0.invol))},
		flushes:   per(float64(f1 - f0)),
		cycles:    n,
		elapsed:   elapsed,
	}, nil
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// ready waits until fenced's leader serves.
func ready(addr string, limit time.Duration) error {
	end := time.Now().Add(limit)
	for time.Now().Before(end) {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return errors.New("fenced not ready after " + limit.String())
}

// procCPU is the process's user and system CPU time.
func procCPU(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// Fields after the command's closing parenthesis; utime and stime
	// are the 14th and 15th of the line.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * time.Second / 100 // USER_HZ
}

// procSwitches sums the context switches of the process's threads.
func procSwitches(pid int) (vol, invol int64) {
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/status", pid))
	for _, t := range tasks {
		f, err := os.Open(t)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			k, v, ok := strings.Cut(sc.Text(), ":")
			if !ok {
				continue
			}
			n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			switch k {
			case "voluntary_ctxt_switches":
				vol += n
			case "nonvoluntary_ctxt_switches":
				invol += n
			}
		}
		f.Close()
	}
	return vol, invol
}

type usage struct {
	cpu        time.Duration
	vol, invol int64
}

func selfUsage() usage {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return usage{
		cpu:   time.Duration(ru.Utime.Nano() + ru.Stime.Nano()),
		vol:   ru.Nvcsw,
		invol: ru.Nivcsw,
	}
}

// flushes counts the flush requests completed by every disk
// (/proc/diskstats field 20, kernel 5.5 and later).
func flushes() int64 {
	b, err := os.ReadFile("/proc/diskstats")
	if err != nil {
		return 0
	}
	var n int64
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 20 || strings.HasPrefix(f[2], "loop") || strings.HasPrefix(f[2], "ram") {
			continue
		}
		// Whole disks only: a partition's flushes are its disk's too.
		if _, err := os.Stat("/sys/block/" + f[2]); err != nil {
			continue
		}
		v, _ := strconv.ParseInt(f[18], 10, 64)
		n += v
	}
	return n
}
