package main

import (
	"io"
	"net"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestPlanIsDerivedFromTheSeed(t *testing.T) {
	a := plan(42, time.Minute, 4, 3, time.Second, allFaults)
	b := plan(42, time.Minute, 4, 3, time.Second, allFaults)
	if diff := cmp.Diff(a, b, cmp.AllowUnexported(schedule{})); diff != "" {
		t.Errorf("the same seed gave two schedules (-first +second):\n%s", diff)
	}
	c := plan(43, time.Minute, 4, 3, time.Second, allFaults)
	if cmp.Equal(a, c, cmp.AllowUnexported(schedule{})) {
		t.Error("seeds 42 and 43 gave the same schedule")
	}
	counts := a.counts()
	for _, k := range allFaults {
		if counts[k] == 0 {
			t.Errorf("a minute with every fault planned no %s: %v", k, counts)
		}
	}
	lastCrash := map[string]time.Duration{faultCrash: -time.Hour, faultResourceCrash: -time.Hour}
	for _, f := range a.faults {
		if f.At < time.Second || f.At > time.Minute-2*time.Second {
			t.Errorf("%v is outside [1s, end-2s]", f)
		}
		if f.Kind == faultCrash || f.Kind == faultStop || f.Kind == faultResourceCrash {
			down := f.Kind // what it takes down: fenced or the resource
			if down == faultStop {
				down = faultCrash
			}
			if f.At-lastCrash[down] < 4*time.Second {
				t.Errorf("%s at %v after taking %s down at %v: closer than 4s", f.Kind, f.At, down, lastCrash[down])
			}
			lastCrash[down] = f.At
		}
		if f.Kind == faultPause && f.For <= time.Second {
			t.Errorf("%v: a pause must outlast the TTL", f)
		}
	}
}

// TestStopsTakeCrashSlots: the stop fault takes some of the slots that
// crash would have, and leaves the rest of a seed's schedule as it was
// without it (the seeds of runs recorded before it plan the same faults).
func TestStopsTakeCrashSlots(t *testing.T) {
	var before []string
	for _, k := range allFaults {
		if k != faultStop {
			before = append(before, k)
		}
	}
	for seed := range uint64(20) {
		was := plan(seed, 2*time.Minute, 4, 3, time.Second, before)
		now := plan(seed, 2*time.Minute, 4, 3, time.Second, allFaults)
		if len(was.faults) != len(now.faults) || !slices.Equal(was.rates, now.rates) {
			t.Fatalf("seed %d: %d faults without stops, %d with", seed, len(was.faults), len(now.faults))
		}
		for i, f := range now.faults {
			if f.Kind == faultStop {
				f.Kind = faultCrash
			}
			if f != was.faults[i] {
				t.Errorf("seed %d: fault %d is %v with stops, %v without", seed, i, now.faults[i], was.faults[i])
			}
		}
	}
	only := plan(1, 2*time.Minute, 4, 3, time.Second, []string{faultStop})
	if len(only.faults) == 0 {
		t.Fatal("no stop planned with only stops asked for")
	}
	for _, f := range only.faults {
		if f.Kind != faultStop {
			t.Errorf("planned %v; only stops were asked for", f)
		}
	}
}

// TestStorageFaultsLeaveTheRestOfTheSchedule: the storage faults come from
// a stream and a timeline of their own, so that a seed plans every other
// fault as it did before them (the runs recorded before them plan the same
// faults); they come one at a time and heal two seconds before the end.
func TestStorageFaultsLeaveTheRestOfTheSchedule(t *testing.T) {
	var before []string
	for _, k := range allFaults {
		if !slices.Contains(storageFaults, k) {
			before = append(before, k)
		}
	}
	d := 2 * time.Minute
	for seed := range uint64(20) {
		was := plan(seed, d, 4, 3, time.Second, before)
		now := plan(seed, d, 4, 3, time.Second, allFaults)
		var rest, storage []fault
		for _, f := range now.faults {
			if slices.Contains(storageFaults, f.Kind) {
				storage = append(storage, f)
			} else {
				rest = append(rest, f)
			}
		}
		if diff := cmp.Diff(was.faults, rest); diff != "" || !slices.Equal(was.rates, now.rates) {
			t.Errorf("seed %d: the other faults changed with the storage faults on (-without +with):\n%s", seed, diff)
		}
		if len(storage) == 0 {
			t.Errorf("seed %d: no storage fault in %v", seed, d)
		}
		end := time.Duration(0)
		for _, f := range storage {
			if f.At < end+2*time.Second || f.At+f.For > d-2*time.Second {
				t.Errorf("seed %d: %v begins before the one before has healed and 2s passed (%v), or ends after %v", seed, f, end, d-2*time.Second)
			}
			if f.Target < 0 || f.Target > 3 {
				t.Errorf("seed %d: %v: target not a node of 3 or the leader", seed, f)
			}
			end = f.At + f.For
		}
	}
	only := plan(197, storageRun, 4, 1, time.Second, storageFaults)
	for _, k := range storageFaults {
		if only.counts()[k] == 0 {
			t.Errorf("the storage run (seed 197, %v) plans no %s: %v", storageRun, k, only.counts())
		}
	}
}

func TestPlanHonoursTheFaultList(t *testing.T) {
	s := plan(1, time.Minute, 4, 1, time.Second, []string{faultPause, faultNodePartition})
	for _, f := range s.faults {
		if f.Kind != faultPause {
			t.Errorf("planned %v; only pauses were asked for (and node partitions need a cluster)", f)
		}
	}
	if !slices.Equal(s.rates, []float64{1, 1, 1, 1}) {
		t.Errorf("clock rates %v without the drift fault", s.rates)
	}
	if s := plan(1, time.Minute, 4, 1, time.Second, nil); len(s.faults) != 0 {
		t.Errorf("planned %d faults with none asked for", len(s.faults))
	}
}

func TestParseFaults(t *testing.T) {
	if k, err := parseFaults("pause, delay"); err != nil || !slices.Equal(k, []string{faultPause, faultDelay}) {
		t.Errorf("parseFaults: %v, %v", k, err)
	}
	if _, err := parseFaults("pause,gc"); err == nil {
		t.Error("an unknown fault was accepted")
	}
	if k, _ := parseFaults("all"); !slices.Equal(k, allFaults) {
		t.Errorf("all = %v", k)
	}
}

func TestNextValue(t *testing.T) {
	for _, c := range []struct{ from, want string }{{"", "1/w1.3"}, {"1/w2.4", "2/w1.3"}, {"41/w9.100", "42/w1.3"}} {
		if got := next(c.from, "w1.3"); got != c.want {
			t.Errorf("next(%q) = %q, want %q", c.from, got, c.want)
		}
	}
}

// echo serves a TCP echo on loopback.
func echo(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(c, c); c.Close() }()
		}
	}()
	return ln.Addr().String()
}

// roundTrip sends one byte through addr and returns how long the echo took
// (or an error).
func roundTrip(addr string) (time.Duration, error) {
	start := time.Now()
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := c.Write([]byte{7}); err != nil {
		return 0, err
	}
	b := make([]byte, 1)
	if _, err := io.ReadFull(c, b); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}

func TestProxyHoldsCutsAndHeals(t *testing.T) {
	p, err := newProxy("127.0.0.1", echo(t))
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()
	held := make(chan time.Duration, 1)
	p.setOnHold(func(d time.Duration) { held <- d })
	if _, err := roundTrip(p.addr()); err != nil {
		t.Fatalf("through the proxy: %v", err)
	}
	p.holdNext(300 * time.Millisecond)
	called := make(chan struct{})
	p.atNext(func() { close(called) })
	if d, err := roundTrip(p.addr()); err != nil || d < 300*time.Millisecond {
		t.Errorf("held connection: %v after %v, want an echo after at least 300ms", err, d)
	}
	if d := <-held; d != 300*time.Millisecond {
		t.Errorf("onHold got %v", d)
	}
	<-called
	if d, err := roundTrip(p.addr()); err != nil || d > 200*time.Millisecond {
		t.Errorf("the connection after the held one: %v after %v, want no delay", err, d)
	}
	p.setCut(true)
	if _, err := roundTrip(p.addr()); err == nil {
		t.Error("a cut proxy passed traffic")
	}
	p.setCut(false)
	if _, err := roundTrip(p.addr()); err != nil {
		t.Errorf("after healing: %v", err)
	}
	p.setRefused("127.0.0.1", true)
	if _, err := roundTrip(p.addr()); err == nil {
		t.Error("a refused source passed traffic")
	}
}

// TestVersion: fencecheck --version prints its build and exits 0.
func TestVersion(t *testing.T) {
	out, err := exec.Command(filepath.Join(bin, "fencecheck"), "--version").Output()
	if err != nil || !strings.HasPrefix(string(out), "fencecheck ") || !strings.Contains(string(out), "\ngo:       go1.") {
		t.Errorf("fencecheck --version: %v\n%s", err, out)
	}
}

// TestParseStores: --stores names known stores once each, each with its
// server; without it, the stores are those whose servers were given.
func TestParseStores(t *testing.T) {
	for _, c := range []struct {
		list, postgres, s3 string
		want               []string
		err                string
	}{
		{"", "", "", []string{"bolt"}, ""},
		{"", "pg-dsn", "s3-url", []string{"bolt", "pg", "s3"}, ""},
		{"s3", "pg-dsn", "s3-url", []string{"s3"}, ""},
		{"bolt,s3", "", "s3-url", []string{"bolt", "s3"}, ""},
		{"s3", "", "", nil, "s3 needs --s3"},
		{"pg", "", "s3-url", nil, "pg needs --postgres"},
		{"bolt,bolt", "", "", nil, "bolt twice"},
		{"mysql", "", "", nil, `no store "mysql"; want bolt, pg or s3`},
	} {
		cfg := config{postgres: c.postgres, s3: c.s3}
		got, err := parseStores(c.list, &cfg)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("--stores %q: error %v, want one saying %q", c.list, err, c.err)
			}
			continue
		}
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("--stores %q: %v, %v; want %v", c.list, got, err, c.want)
		}
		if !slices.Contains(got, "pg") && cfg.postgres != "" || !slices.Contains(got, "s3") && cfg.s3 != "" {
			t.Errorf("--stores %q kept the server of a store it left out: %+v", c.list, cfg)
		}
	}
}
