package history

import (
	"time"

	"golang.org/x/sys/unix"
)

// Now returns the wall time and the CLOCK_MONOTONIC reading in
// nanoseconds. Unlike the monotonic reading inside a time.Time, which
// counts from its own process's start, CLOCK_MONOTONIC is one clock for
// every process of the machine, so events of different processes can be
// ordered by it; the wall time is for people.
func Now() (time.Time, int64) {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts) // cannot fail for CLOCK_MONOTONIC
	return time.Now(), ts.Nano()
}
