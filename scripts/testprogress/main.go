// Command testprogress turns `go test -json` into one line per package as
// it finishes, so a long run shows it is moving, while failures stay
// whole: a failed package prints everything go test itself would print
// without -v (the failed tests' output, the package's own output, panics,
// build errors).
//
//	go test -json ./... | go run ./scripts/testprogress [-trim PREFIX]
//
// -trim drops PREFIX from the front of package names.
// It exits 1 if any package or build failed, or if the input holds no
// results at all. While packages run and nothing was printed for a
// minute, it names the ones still running. The last lines are a summary
// with the slowest packages.
package main

import (
	"bufio"
	"cmp"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"time"
)

// event is one line of `go test -json` (see `go doc test2json`).
type event struct {
	Action     string
	Package    string
	ImportPath string // build-output and build-fail
	Test       string
	Output     string
	Elapsed    float64
}

// pkg is what is known of one package's run.
type pkg struct {
	started time.Time
	output  []event // in order; printed only if the package fails
	failed  map[string]bool
	open    map[string]bool // tests that started and have not ended
	skipped int
}

type progress struct {
	mu      sync.Mutex
	w       io.Writer
	start   time.Time
	lastOut time.Time
	running map[string]*pkg
	done    map[string]float64 // seconds, as go test reports them
	failed  []string
	noTests int
	built   bool   // a build failed
	trim    string // dropped from the front of package names
}

func main() {
	trim := flag.String("trim", "", "drop this prefix from package names")
	flag.Parse()
	p := newProgress(os.Stdout)
	p.trim = *trim
	stop := make(chan struct{})
	go p.heartbeat(time.Minute, stop)
	ok := p.read(os.Stdin)
	close(stop)
	if !ok {
		os.Exit(1)
	}
}

func newProgress(w io.Writer) *progress {
	now := time.Now()
	return &progress{w: w, start: now, lastOut: now, running: map[string]*pkg{}, done: map[string]float64{}}
}

// read consumes the stream and prints the summary; it reports whether
// everything passed.
func (p *progress) read(r io.Reader) bool {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &e) != nil {
			// Not from test2json (go vet, the go command): pass it on.
			p.printf("%s\n", line)
			continue
		}
		p.handle(e)
	}
	if err := sc.Err(); err != nil {
		p.printf("testprogress: reading go test's output: %v\n", err)
		return false
	}
	return p.summary()
}

func (p *progress) printf(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.w, format, args...)
	p.lastOut = time.Now()
}

func (p *progress) handle(e event) {
	switch e.Action {
	case "build-output":
		p.printf("%s", e.Output)
		return
	case "build-fail":
		p.mu.Lock()
		p.built = true
		p.mu.Unlock()
		return
	}
	e.Package = strings.TrimPrefix(e.Package, p.trim)
	p.mu.Lock()
	k := p.running[e.Package]
	if k == nil {
		k = &pkg{started: time.Now(), failed: map[string]bool{}, open: map[string]bool{}}
		p.running[e.Package] = k
	}
	p.mu.Unlock()
	if e.Test != "" {
		switch e.Action {
		case "run":
			k.open[e.Test] = true
		case "pass", "fail", "skip":
			delete(k.open, e.Test)
		}
	}
	switch {
	case e.Action == "output":
		k.output = append(k.output, e)
	case e.Action == "fail" && e.Test != "":
		k.failed[e.Test] = true
	case e.Action == "skip" && e.Test != "":
		k.skipped++
	case e.Test == "" && (e.Action == "pass" || e.Action == "fail" || e.Action == "skip"):
		p.finish(e, k)
	}
}

// finish prints a package's line, and on failure what go test would.
func (p *progress) finish(e event, k *pkg) {
	var b strings.Builder
	switch e.Action {
	case "fail":
		for _, o := range k.output {
			if o.Test == "" || k.relevant(o.Test) && !chatter(o.Output) {
				b.WriteString(o.Output)
			}
		}
		fmt.Fprintf(&b, "FAIL %-36s %6.1fs", e.Package, e.Elapsed)
	case "skip":
		fmt.Fprintf(&b, "-    %-36s  (no tests)", e.Package)
	default:
		fmt.Fprintf(&b, "ok   %-36s %6.1fs", e.Package, e.Elapsed)
	}
	if k.skipped > 0 {
		fmt.Fprintf(&b, "  (%d skipped)", k.skipped)
	}
	p.mu.Lock()
	delete(p.running, e.Package)
	switch e.Action {
	case "fail":
		p.failed = append(p.failed, e.Package)
	case "skip":
		p.noTests++
	}
	p.done[e.Package] = e.Elapsed
	elapsed := time.Since(p.start).Round(time.Second)
	p.mu.Unlock()
	p.printf("%s  [%s]\n", b.String(), elapsed)
}

// relevant reports whether test's output belongs in a failure report: it
// failed, or a test that contains it or that it contains failed, or it
// never ended. A test binary that dies inside a test (a panic, -timeout,
// SIGQUIT) leaves that test without a fail event, and its output (the
// goroutines' stacks) is what says why.
func (k *pkg) relevant(test string) bool {
	if k.open[test] {
		return true
	}
	for f := range k.failed {
		if f == test || strings.HasPrefix(f, test+"/") || strings.HasPrefix(test, f+"/") {
			return true
		}
	}
	return false
}

// chatter is -v's bookkeeping, which go test without -v does not print.
func chatter(line string) bool {
	l := strings.TrimLeft(line, " ")
	for _, p := range []string{"=== RUN", "=== PAUSE", "=== CONT", "=== NAME", "--- PASS", "--- SKIP"} {
		if strings.HasPrefix(l, p) {
			return true
		}
	}
	return false
}

// heartbeat names the packages still running when nothing was printed
// for every.
func (p *progress) heartbeat(every time.Duration, stop <-chan struct{}) {
	t := time.NewTicker(every / 4)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case now := <-t.C:
			p.mu.Lock()
			quiet := now.Sub(p.lastOut) >= every
			var names []string
			for name, k := range p.running {
				names = append(names, fmt.Sprintf("%s (%s)", name, now.Sub(k.started).Round(time.Second)))
			}
			p.mu.Unlock()
			if quiet && len(names) > 0 {
				slices.Sort(names)
				p.printf("...  still running: %s  [%s]\n", strings.Join(names, ", "), now.Sub(p.start).Round(time.Second))
			}
		}
	}
}

// summary prints the totals and the slowest packages.
func (p *progress) summary() bool {
	p.mu.Lock()
	type timed struct {
		name string
		secs float64
	}
	var all []timed
	for name, s := range p.done {
		all = append(all, timed{name, s})
	}
	slices.SortFunc(all, func(a, b timed) int {
		return cmp.Or(cmp.Compare(b.secs, a.secs), strings.Compare(a.name, b.name))
	})
	var slow []string
	for _, t := range all[:min(len(all), 5)] {
		if t.secs >= 1 {
			slow = append(slow, fmt.Sprintf("%s %.0fs", t.name, t.secs))
		}
	}
	failed, built, n, noTests := slices.Clone(p.failed), p.built, len(p.done), p.noTests
	unfinished := len(p.running)
	elapsed := time.Since(p.start).Round(time.Second)
	p.mu.Unlock()

	if len(slow) > 0 {
		p.printf("slowest: %s\n", strings.Join(slow, ", "))
	}
	switch {
	case len(failed) > 0 || built:
		p.printf("FAIL: %d of %d packages failed%s in %s: %s\n", len(failed), n, buildNote(built), elapsed, strings.Join(failed, " "))
	case n == 0:
		p.printf("FAIL: no test results (did go test start?)\n")
	case unfinished > 0:
		p.printf("FAIL: %d packages started but reported no result\n", unfinished)
	default:
		p.printf("PASS: %d packages (%d without tests) in %s\n", n, noTests, elapsed)
		return true
	}
	return false
}

func buildNote(built bool) string {
	if built {
		return ", a build failed"
	}
	return ""
}
