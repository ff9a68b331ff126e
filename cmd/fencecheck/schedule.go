package main

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"
)

// The fault kinds.
const (
	faultPause         = "pause"          // SIGSTOP a worker longer than its TTL, then SIGCONT
	faultDelay         = "delay"          // hold a worker's next resource request back, then deliver it
	faultCrash         = "crash"          // kill -9 fenced (the leader, in a cluster) and restart it
	faultStop          = "stop"           // SIGTERM fenced (the leader, which hands off, in a cluster) and restart it
	faultPartition     = "partition"      // cut a worker off from fenced
	faultNodePartition = "node-partition" // cut a fenced node off from the others (cluster only)
	faultDrift         = "drift"          // a worker whose clock runs slow or fast, for the whole run
	faultResourceCrash = "resource-crash" // kill -9 the resource and restart it on the same data

	// The storage faults: a node's disk loses or damages what fenced
	// wrote, or fills (storage.go).
	faultCorrupt  = "corrupt"  // kill -9 a node, flip a byte in its newest raft-wal segment, restart it
	faultTruncate = "truncate" // kill -9 a node, cut its newest raft-wal segment short, restart it
	faultRestore  = "restore"  // copy a node's data directory cold; later kill -9 it, put the copy back, restart it
	faultFill     = "fill"     // fill a node's disk (a tmpfs of its own), then free it
)

var allFaults = []string{faultPause, faultDelay, faultCrash, faultStop, faultPartition, faultNodePartition, faultDrift, faultResourceCrash,
	faultCorrupt, faultTruncate, faultRestore, faultFill}

var storageFaults = []string{faultCorrupt, faultTruncate, faultRestore, faultFill}

// fault is one entry of the schedule: at At after the start, do Kind to
// worker (or node) Target for For.
type fault struct {
	At     time.Duration
	Kind   string
	Target int
	For    time.Duration
	// AtRequest: a pause starts as the worker sends its next request to
	// the resource (a process stopped in the middle of its work), not at
	// At itself.
	AtRequest bool
	// Where: corrupt and truncate damage the newest segment at this
	// fraction (0 to 1) of its written bytes.
	Where float64
	// Full: fill leaves no byte free, so that fenced's next write fails
	// and it stops; otherwise it leaves half of --min-free-space, below
	// which a leader refuses grants.
	Full bool
}

func (f fault) String() string {
	at := ""
	switch {
	case f.AtRequest:
		at = " at its next request"
	case f.Kind == faultCorrupt || f.Kind == faultTruncate:
		at = fmt.Sprintf(" at %.1f%% of the newest segment's written bytes", 100*f.Where)
	case f.Kind == faultFill && f.Full:
		at = ", no byte left"
	case f.Kind == faultFill:
		at = ", half of --min-free-space left"
	}
	return fmt.Sprintf("%6.2fs %-14s target %d for %v%s", f.At.Seconds(), f.Kind, f.Target, f.For.Round(time.Millisecond), at)
}

// schedule is the fault plan of a run, derived from its seed alone: the
// same seed and parameters give the same plan.
type schedule struct {
	faults []fault
	rates  []float64 // each worker's clock rate
}

// plan derives the schedule. Faults start from one second in until two
// seconds before the end (so that in-flight requests resolve before the
// final reads), one every 0.6 to 1.8 seconds; crashes and stops of
// fenced, and crashes of the resource, are at least four seconds apart.
// Whether fenced is killed or stopped is drawn from a stream of its own,
// so that the stop fault left the rest of a seed's schedule as it was.
func plan(seed uint64, d time.Duration, workers, nodes int, ttl time.Duration, kinds []string) schedule {
	rng := rand.New(rand.NewPCG(seed, 0x66656e6365636b)) // "fencechk"
	stops := rand.New(rand.NewPCG(seed, 0x73746f70))     // "stop"
	on := func(k string) bool { return slices.Contains(kinds, k) }
	s := schedule{rates: make([]float64, workers)}
	for i := range s.rates {
		s.rates[i] = 1
	}
	if on(faultDrift) {
		perm := rng.Perm(workers)
		s.rates[perm[0]] = 0.3 + 0.2*rng.Float64() // slow: renews late, writes past expiry
		if workers > 1 {
			s.rates[perm[1]] = 1.5 + rng.Float64() // fast: gives up early
		}
	}
	type weighted struct {
		kind string
		w    int
	}
	var menu []weighted
	total := 0
	// faultCrash stands for taking fenced down, by kill -9 or by SIGTERM.
	takeDown := func() string {
		switch {
		case !on(faultStop):
			return faultCrash
		case !on(faultCrash), stops.IntN(2) == 0:
			return faultStop
		}
		return faultCrash
	}
	for _, k := range []weighted{{faultPause, 3}, {faultDelay, 3}, {faultCrash, 1}, {faultPartition, 2}, {faultNodePartition, 1}, {faultResourceCrash, 1}} {
		if (on(k.kind) || k.kind == faultCrash && on(faultStop)) && (k.kind != faultNodePartition || nodes > 1) {
			menu = append(menu, k)
			total += k.w
		}
	}
	between := func(lo, hi float64) time.Duration {
		return time.Duration((lo + (hi-lo)*rng.Float64()) * float64(time.Second))
	}
	scaled := func(lo, hi float64) time.Duration { return time.Duration((lo + (hi-lo)*rng.Float64()) * float64(ttl)) }
	lastCrash := map[string]time.Duration{faultCrash: -time.Hour, faultResourceCrash: -time.Hour}
	for t := time.Second; total > 0 && t < d-2*time.Second && len(s.faults) < 10000; t += between(0.6, 1.8) {
		pick := rng.IntN(total)
		var k string
		for _, m := range menu {
			if pick < m.w {
				k = m.kind
				break
			}
			pick -= m.w
		}
		f := fault{At: t, Kind: k, Target: rng.IntN(workers)}
		switch k {
		case faultPause:
			f.For = scaled(1.5, 3)
			f.AtRequest = rng.IntN(3) > 0
		case faultDelay:
			f.For = scaled(2, 3.5)
		case faultPartition:
			f.For = scaled(1.5, 3)
		case faultCrash, faultResourceCrash:
			if t-lastCrash[k] < 4*time.Second {
				continue
			}
			lastCrash[k] = t
			f.Target = 0 // the leader, or the resource
			f.For = between(0.2, 1.5)
			if k == faultCrash {
				f.Kind = takeDown()
			}
		case faultNodePartition:
			f.Target = rng.IntN(nodes + 1) // nodes: the leader
			f.For = between(2, 4)
		}
		s.faults = append(s.faults, f)
	}
	if st := planStorage(seed, d, nodes, kinds); len(st) > 0 {
		s.faults = append(s.faults, st...)
		slices.SortStableFunc(s.faults, func(a, b fault) int { return cmp.Compare(a.At, b.At) })
	}
	return s
}

// planStorage plans the storage faults, from a stream and a timeline of
// their own, so that a seed plans every other fault as it did before they
// existed. They come one at a time, from two seconds in: each begins 2 to
// 5 seconds after the one before has healed (a damaged or restored node
// takes a moment to start and catch up), and heals two seconds before the
// end. Target is a node, or len(nodes) for the leader at the time.
func planStorage(seed uint64, d time.Duration, nodes int, kinds []string) []fault {
	rng := rand.New(rand.NewPCG(seed, 0x73746f72616765)) // "storage"
	var menu []string
	for _, k := range storageFaults {
		if slices.Contains(kinds, k) {
			menu = append(menu, k)
		}
	}
	if len(menu) == 0 {
		return nil
	}
	between := func(lo, hi float64) time.Duration {
		return time.Duration((lo + (hi-lo)*rng.Float64()) * float64(time.Second))
	}
	var faults []fault
	for t := 2 * time.Second; len(faults) < 10000; {
		f := fault{At: t, Kind: menu[rng.IntN(len(menu))], Target: rng.IntN(nodes + 1)}
		switch f.Kind {
		case faultCorrupt, faultTruncate:
			f.For = between(0.2, 1.5) // down, as after a crash
			f.Where = rng.Float64()
		case faultRestore:
			f.For = between(3, 8) // from the copy to putting it back
		case faultFill:
			f.For = between(2, 4)
			f.Full = rng.IntN(2) == 0
		}
		if t+f.For > d-2*time.Second {
			break
		}
		faults = append(faults, f)
		t += f.For + between(2, 5)
	}
	return faults
}

// counts returns the number of planned faults of each kind.
func (s schedule) counts() map[string]int {
	m := map[string]int{}
	for _, f := range s.faults {
		m[f.Kind]++
	}
	for _, r := range s.rates {
		if r != 1 {
			m[faultDrift]++
		}
	}
	return m
}

// parseFaults reads --faults: a comma-separated list of kinds, "all" or
// "none".
func parseFaults(s string) ([]string, error) {
	switch s {
	case "all":
		return allFaults, nil
	case "none", "":
		return nil, nil
	}
	var kinds []string
	for k := range strings.SplitSeq(s, ",") {
		k = strings.TrimSpace(k)
		if !slices.Contains(allFaults, k) {
			return nil, fmt.Errorf("--faults: unknown fault %q; want some of %s, or all or none", k, strings.Join(allFaults, ","))
		}
		kinds = append(kinds, k)
	}
	return kinds, nil
}
