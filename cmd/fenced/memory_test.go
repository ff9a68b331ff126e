package main

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"math"
	"runtime/debug"
	"strings"
	"sync"
	"testing"
	"time"
)

// keepMemoryLimit restores the test process's memory limit after a test
// that sets it.
func keepMemoryLimit(t *testing.T) {
	was := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(was) })
}

func TestMemoryLimitFlag(t *testing.T) {
	keepMemoryLimit(t)
	t.Setenv("GOMEMLIMIT", "")
	for _, tc := range []struct {
		args []string
		want int64
		from string
	}{
		{nil, min(defaultMemoryLimit, cgroupLimitOr(defaultMemoryLimit)), ""},
		{[]string{"--memory-limit", "1GiB"}, 1 << 30, "--memory-limit"},
		{[]string{"--memory-limit", "200MiB"}, 200 << 20, "--memory-limit"},
		{[]string{"--memory-limit", "104857600"}, 100 << 20, "--memory-limit"},
		{[]string{"--memory-limit", "off"}, math.MaxInt64, "--memory-limit"},
	} {
		o, err := parse(tc.args, io.Discard)
		if err != nil {
			t.Fatalf("parse(%q): %v", tc.args, err)
		}
		limit, from := o.memoryLimit.apply()
		if limit != tc.want || (tc.from != "" && from != tc.from) {
			t.Errorf("parse(%q).apply() = %d from %s; want %d from %s", tc.args, limit, from, tc.want, tc.from)
		}
		if got := debug.SetMemoryLimit(-1); got != tc.want {
			t.Errorf("parse(%q).apply(): the runtime's limit is %d, want %d", tc.args, got, tc.want)
		}
	}
}

// cgroupLimitOr returns 90% of the cgroup's memory limit, or def when there
// is none.
func cgroupLimitOr(def int64) int64 {
	if c := cgroupMemoryMax(); c > 0 {
		return c / 10 * 9
	}
	return def
}

func TestMemoryLimitKeepsGOMEMLIMIT(t *testing.T) {
	keepMemoryLimit(t)
	// The runtime read GOMEMLIMIT when the process started; stand in for
	// that by setting the limit it would have set.
	debug.SetMemoryLimit(300 << 20)
	t.Setenv("GOMEMLIMIT", "300MiB")
	o, err := parse(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if limit, from := o.memoryLimit.apply(); limit != 300<<20 || from != "GOMEMLIMIT" {
		t.Errorf("apply() with GOMEMLIMIT set = %d from %s; want the runtime's 300MiB kept", limit, from)
	}
	o, err = parse([]string{"--memory-limit", "1GiB"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if limit, _ := o.memoryLimit.apply(); limit != 1<<30 {
		t.Errorf("--memory-limit 1GiB with GOMEMLIMIT set: limit %d, want the flag's", limit)
	}
}

// syncBuffer is a log sink the watcher's goroutine and the test share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestLiveHeapNearLimitWarns(t *testing.T) {
	var out syncBuffer
	log := slog.New(slog.NewTextHandler(&out, nil))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { watchLiveHeap(ctx, log, 1<<20, time.Millisecond); close(done) }()
	keep := make([]byte, 4<<20) // live past three quarters of 1 MiB
	for end := time.Now().Add(10 * time.Second); !strings.Contains(out.String(), "near the memory limit") && time.Now().Before(end); {
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	<-done
	if !strings.Contains(out.String(), "raise --memory-limit") {
		t.Fatalf("no warning with %d bytes kept live and a 1 MiB limit; log:\n%s", len(keep), out.String())
	}
	if n := strings.Count(out.String(), "near the memory limit"); n != 1 {
		t.Errorf("%d warnings for one stretch above the mark, want 1", n)
	}
}
