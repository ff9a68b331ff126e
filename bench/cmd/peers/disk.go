package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// diskOf names the block device (as in /proc/diskstats) holding path: the
// whole disk when path is on a partition. "" if there is none (tmpfs,
// overlay).
func diskOf(path string) string {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return ""
	}
	sys := fmt.Sprintf("/sys/dev/block/%d:%d", unix.Major(st.Dev), unix.Minor(st.Dev))
	real, err := filepath.EvalSymlinks(sys)
	if err != nil {
		return ""
	}
	if _, err := os.Stat(filepath.Join(real, "partition")); err == nil {
		real = filepath.Dir(real)
	}
	return filepath.Base(real)
}

// diskFlushes returns the flush requests the disk has completed (field 16
// of /proc/diskstats, Linux 5.5 and later); 0 if unknown. Every fsync or
// fdatasync that reaches the disk is at least one; other processes' count
// too.
func diskFlushes(disk string) int64 {
	if disk == "" {
		return 0
	}
	b, err := os.ReadFile("/proc/diskstats")
	if err != nil {
		return 0
	}
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(line)
		if len(f) >= 19 && f[2] == disk {
			n, _ := strconv.ParseInt(f[18], 10, 64)
			return n
		}
	}
	return 0
}

// cpuTime returns the user and system time the processes have used so
// far, from /proc (in clock ticks of 10 ms).
func cpuTime(pids []string) time.Duration {
	var total time.Duration
	for _, pid := range pids {
		b, err := os.ReadFile("/proc/" + pid + "/stat")
		if err != nil {
			continue
		}
		// The fields after the command name, which is in parentheses.
		_, rest, _ := strings.Cut(string(b), ") ")
		f := strings.Fields(rest)
		if len(f) < 13 {
			continue
		}
		utime, _ := strconv.ParseInt(f[11], 10, 64)
		stime, _ := strconv.ParseInt(f[12], 10, 64)
		total += time.Duration(utime+stime) * 10 * time.Millisecond
	}
	return total
}

// selfCPU returns the user and system time this process has used so far.
func selfCPU() time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// probeFsync measures the disk where the servers keep their data: 4 KiB
// written in place and fdatasync'd, one at a time, for d (at most 100,000
// times).
func probeFsync(dir, disk string, d time.Duration) (fsyncProbe, error) {
	f, err := os.CreateTemp(dir, "peers-fsync-")
	if err != nil {
		return fsyncProbe{}, err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	buf := make([]byte, 4096)
	if _, err := f.WriteAt(buf, 0); err != nil {
		return fsyncProbe{}, err
	}
	if err := f.Sync(); err != nil {
		return fsyncProbe{}, err
	}
	var lat []time.Duration
	flushes := diskFlushes(disk)
	start := time.Now()
	for i := 0; time.Since(start) < d && i < 100_000; i++ {
		t0 := time.Now()
		buf[0] = byte(i)
		if _, err := f.WriteAt(buf, 0); err != nil {
			return fsyncProbe{}, err
		}
		if err := unix.Fdatasync(int(f.Fd())); err != nil {
			return fsyncProbe{}, err
		}
		lat = append(lat, time.Since(t0))
	}
	p := fsyncProbe{Ops: int64(len(lat)), Elapsed: time.Since(start), Flushes: diskFlushes(disk) - flushes}
	slices.Sort(lat)
	p.P50 = percentile(lat, 0.5)
	return p, nil
}
