package main

import (
	"bufio"
	"cmp"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"
)

// A stage is a part of a lock cycle's path, known by the functions on
// the call stack of a sample taken while it ran.
type stage struct {
	name   string
	frames []string // any frame containing one of these, looked for from the stack's root down
}

// serverStages name the parts of fenced's path; the first that matches a
// sample's stack, in this order, takes the sample.
var serverStages = []stage{
	{"Go's sysmon thread", []string{"runtime.sysmon"}},
	{"garbage collection", []string{"runtime.gcBgMarkWorker", "runtime.bgsweep", "runtime.bgscavenge", "gcAssist", "runtime.gcStart", "runtime.markroot"}},
	{"event lines (formatting)", []string{"eventLines).run"}},
	{"log writer (stderr)", []string{"logWriter).run"}},
	{"signing ahead (Ed25519)", []string{"presigner).run"}},
	{"raft-wal: append and fsync", []string{"raft-wal"}},
	{"FSM apply, lessor.Applied, events", []string{"runFSM"}},
	{"hashicorp/raft's loops (the rest)", []string{"hashicorp/raft"}},
	{"lessor and raftnode: propose, wait", []string{"internal/lessor", "raftnode.(*Node).Apply"}},
	{"signing a grant", []string{"internal/signing", "ed25519", "curve25519"}},
	{"Connect: read and decode the request", []string{"Receive", "Unmarshal"}},
	{"Connect: encode and write the answer", []string{"connect.(*connectUnaryHandlerConn).Send", "Marshal", "finishRequest", "bufio.(*Writer).Flush", "(*response).Write", "chunkWriter"}},
	{"HTTP/1.1: read and parse the request", []string{"readRequest", "(*conn).Read", "connReader"}},
	{"HTTP and Connect: the rest", []string{"net/http.", "connectrpc"}},
	{"scheduler: park, steal, wake", []string{"runtime.mcall", "runtime.park_m", "runtime.schedule", "runtime.findRunnable", "runtime.mstart", "runtime.goexit0", "wakep", "startm", "stopm"}},
}

// clientStages name the parts of the Go client's path.
var clientStages = []stage{
	{"Go's sysmon thread", []string{"runtime.sysmon"}},
	{"garbage collection", []string{"runtime.gcBgMarkWorker", "runtime.bgsweep", "runtime.bgscavenge", "gcAssist"}},
	{"HTTP Transport's write loop (send)", []string{"persistConn).writeLoop"}},
	{"HTTP Transport's read loop (receive)", []string{"persistConn).readLoop"}},
	{"lease keep-alive", []string{"keepAlive", "Lease).renew"}},
	{"caller: encode, call, decode", []string{"client.(*Client)", "client.(*Lease)", "client.retry", "client.attempt", "connectrpc"}},
	{"scheduler: park, steal, wake", []string{"runtime.mcall", "runtime.park_m", "runtime.schedule", "runtime.findRunnable", "runtime.mstart", "runtime.goexit0", "wakep", "startm", "stopm"}},
	{"the benchmark's loop", []string{"main."}},
}

var offset = regexp.MustCompile(`\+0x[0-9a-f]+$`)

// printStages reads `perf script` output with call stacks (perf record
// -g) and prints each stage's share of the samples.
func printStages(r io.Reader, w io.Writer, stages []stage) error {
	counts := make(map[string]int)
	total := 0
	var stack []string
	flush := func() {
		if len(stack) == 0 {
			return
		}
		total++
		name := "other"
	find:
		for _, s := range stages {
			for i := len(stack) - 1; i >= 0; i-- { // from the root
				for _, f := range s.frames {
					if strings.Contains(stack[i], f) {
						name = s.name
						break find
					}
				}
			}
		}
		counts[name]++
		stack = stack[:0]
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.TrimSpace(line) == "":
			flush()
		case line[0] == ' ' || line[0] == '\t':
			// "\t    addr symbol+0x1f (dso)"
			_, sym, ok := strings.Cut(strings.TrimSpace(line), " ")
			if ok {
				sym, _, _ = strings.Cut(sym, " (")
				stack = append(stack, offset.ReplaceAllString(sym, ""))
			}
		default:
			flush()
		}
	}
	flush()
	if err := sc.Err(); err != nil {
		return err
	}
	if total == 0 {
		return fmt.Errorf("no samples with call stacks: record with perf record -g")
	}
	names := make([]string, 0, len(counts))
	for n := range counts {
		names = append(names, n)
	}
	slices.SortFunc(names, func(a, b string) int { return cmp.Or(cmp.Compare(counts[b], counts[a]), strings.Compare(a, b)) })
	for _, n := range names {
		fmt.Fprintf(w, "%-40s %5.1f%%\n", n, 100*float64(counts[n])/float64(total))
	}
	fmt.Fprintf(w, "(%d samples)\n", total)
	return nil
}
