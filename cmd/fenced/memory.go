package main

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"os"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"strings"
	"time"
)

// defaultMemoryLimit is the Go runtime's soft memory limit fenced sets
// unless told otherwise. A held lease costs about 340 bytes of live heap,
// and Go's collector lets the heap grow to twice what is live before it
// collects: without a limit, a node that takes in a million leases grows
// to 800 MiB and keeps most of it. With this limit it collects earlier
// instead, and its RSS (the limit, plus some 15 MiB of the binary's pages)
// stays under 512 MiB up to a million leases (BENCHMARKS.md, "One node holding many leases"). A
// node holding more needs a higher --memory-limit: past it, collections
// come ever more often and take up to half the CPU, so fenced warns when
// the live heap nears the limit.
const defaultMemoryLimit = 448 << 20

// memoryLimit is the --memory-limit flag: bytes, with an optional unit as
// GOMEMLIMIT takes them (B, KiB, MiB, GiB, TiB), or "off".
type memoryLimit struct {
	bytes int64 // math.MaxInt64 when off
	set   bool  // given as a flag or FENCED_MEMORY_LIMIT
}

func (m *memoryLimit) String() string {
	switch {
	case m == nil || m.bytes == 0:
		return ""
	case m.bytes == math.MaxInt64:
		return "off"
	case m.bytes%(1<<30) == 0:
		return strconv.FormatInt(m.bytes>>30, 10) + "GiB"
	case m.bytes%(1<<20) == 0:
		return strconv.FormatInt(m.bytes>>20, 10) + "MiB"
	}
	return strconv.FormatInt(m.bytes, 10)
}

func (m *memoryLimit) Set(s string) error {
	if s == "off" {
		m.bytes, m.set = math.MaxInt64, true
		return nil
	}
	num, mult := s, int64(1)
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40}, {"B", 1}} {
		if strings.HasSuffix(s, u.suffix) {
			num, mult = strings.TrimSuffix(s, u.suffix), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n < 0 || n > math.MaxInt64/mult {
		return fmt.Errorf("want a size such as 448MiB or 2GiB (units B, KiB, MiB, GiB, TiB), or off")
	}
	if n*mult < 64<<20 {
		return fmt.Errorf("%s is below 64MiB, too little for the service to run in; use off for no limit", s)
	}
	m.bytes, m.set = n*mult, true
	return nil
}

// apply sets the runtime's soft memory limit and returns it (MaxInt64:
// none) and where it came from. A limit given to fenced wins; without one,
// a GOMEMLIMIT in the environment, which the runtime applied at start, is
// kept; otherwise the default applies, lowered to 90% of the cgroup's
// memory limit when that is smaller, so that collecting harder comes
// before being killed.
func (m memoryLimit) apply() (int64, string) {
	switch {
	case m.set:
		debug.SetMemoryLimit(m.bytes)
		return m.bytes, "--memory-limit"
	case os.Getenv("GOMEMLIMIT") != "":
		return debug.SetMemoryLimit(-1), "GOMEMLIMIT"
	}
	limit, from := int64(defaultMemoryLimit), "default"
	if c := cgroupMemoryMax(); c > 0 && c/10*9 < limit {
		limit, from = c/10*9, "cgroup memory.max"
	}
	debug.SetMemoryLimit(limit)
	return limit, from
}

// cgroupMemoryMax returns the memory limit of the cgroup (v2) fenced runs
// in, 0 when there is none or it cannot be read.
func cgroupMemoryMax() int64 {
	b, err := os.ReadFile("/sys/fs/cgroup/memory.max")
	if err != nil {
		return 0
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil { // "max": no limit
		return 0
	}
	return n
}

// watchLiveHeap warns, once each time it happens, when the heap live after
// a collection passes three quarters of limit: the collector then runs
// ever more often, and the remedy, a higher --memory-limit, is the
// operator's to take.
func watchLiveHeap(ctx context.Context, log *slog.Logger, limit int64, every time.Duration) {
	if limit == math.MaxInt64 {
		return
	}
	sample := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	warned := false
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		metrics.Read(sample)
		live := int64(sample[0].Value.Uint64())
		switch high := live > limit/4*3; {
		case high && !warned:
			log.Warn("the live heap is near the memory limit: collections come more often and cost more CPU; raise --memory-limit",
				"live_mib", live>>20, "limit_mib", limit>>20)
			warned = true
		case !high && live < limit/2:
			warned = false
		}
	}
}
