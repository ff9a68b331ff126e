// Command peers measures fenced side by side with the locks users would
// otherwise take: etcd's concurrency.Mutex (an embedded single-node etcd,
// fsync on) and a Redis lock (Debian's redis-server, once with
// appendfsync always and once with its defaults, which are not durable).
//
// It starts every server itself, each in its own process and on its own
// loopback port, and runs each workload from a separate client process (this
// binary re-executed), so the servers and the load share the machine's
// cores but not a Go runtime:
//
//	peers -fenced bin/fenced             # the whole comparison, 3 runs
//	BENCH_TIME=2s peers -runs 1          # a quick look
//	peers -only lock-cycle,contended     # some workloads only
//
// Each cell (workload, concurrency, system) gets fresh servers with empty
// data directories, is bounded by BENCH_TIME (default 10s) and by -max-ops
// operations, and reports ops/s, p50, p99 and p99.9 of the operation's
// latency, and the disk's flush requests per operation (device-wide, from
// /proc/diskstats). The table shows the medians of the runs; the last lines
// are one per workload and concurrency:
//
//	ratio lock-cycle 64 fence/etcd=5.20
//
// The roles used by the re-executed processes (client, etcd, resource) are
// internal; see role.go.
package main

import (
	"fmt"
	"os"
)

func main() {
	role := ""
	if len(os.Args) > 1 {
		role = os.Args[1]
	}
	var err error
	switch role {
	case roleClient:
		err = clientMain(os.Args[2:])
	case roleEtcd:
		err = etcdMain(os.Args[2:])
	case roleResource:
		err = resourceMain(os.Args[2:])
	default:
		err = runMain(os.Args[1:])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "peers:", err)
		os.Exit(1)
	}
}
