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
//	peers -report results/peers-X.json   # the table of earlier results again
//	peers scale -fenced bin/fenced       # one node holding 100,000 and 1,000,000 leases
//	peers cluster -fenced bin/fenced     # fence and etcd on three nodes each
//
// The workloads are lock-cycle (1, 16 and 64 clients on scopes of their
// own), contended (64 clients on one scope), renew (confirmed renewals of
// 10,000 live leases) and guarded-write-STORE (64 clients writing with
// their token to an HTTP resource on bbolt, SQLite, PostgreSQL with a
// fence table, PostgreSQL with the token in the written row (postgres-row),
// Redis or an S3 bucket (s3, on make services' SeaweedFS), served once
// with its guard, signatures verified, and once without). The systems are fence (fenced with its defaults: raft-wal,
// fsync on, signed tokens), etcd and Redis, and beside fence, never as a
// goal's side of a ratio, fence-unsigned (--sign-tokens=false), fence-bolt
// (--raft-log bolt), fence-single (renew one lease per call) and
// fence-followed (lock-cycle and contended: fenced with its defaults and,
// for the whole cell, a guard/follow Follower of every scope over a
// guard.MemoryStore, in a process of its own whose CPU counts as the
// server's; it shows what eager fencing costs the grant path). The doc
// comments of fenceSetup, etcdSetup, redisSetup, resourceMain and
// followerMain say exactly what each system does.
//
// Each cell (workload, concurrency, system) gets fresh servers with empty
// data directories, is bounded by BENCH_TIME (default 10s) and by -max-ops
// operations, and reports ops/s, p50, p99 and p99.9 of the operation's
// latency, the disk's flush requests (device-wide, from /proc/diskstats)
// and the server and client processes' CPU time per operation. The table
// shows the medians of the runs and how evenly each cell's workers were
// served (fewest and most operations of one worker); the last lines are
// the goals' ratios, fence against etcd and the fenced resource against
// the plain one:
//
//	ratio lock-cycle 64 fence/etcd=5.20
//	ratio guarded-write-bbolt 64 fenced/plain=0.97
//
// The cluster subcommand runs fence and etcd only, each as a three-node
// cluster on loopback (cluster.go: three fenced processes, one
// bootstrapping and two joining it; three etcd members), the clients
// given every member's address: the lock cycle, contended and renew
// cells, and failover (runFailover): under the lock cycle of 16 clients
// it kills the leader with SIGKILL -kills times a run, and measures the
// time from the kill to the first grant answered by the new leader. Both
// systems run with the same election timeout (-election-timeout, 1s, etcd's
// default); etcd's leader sends a heartbeat every tenth of it, fenced's
// every twentieth to tenth. Its last line is
//
//	ratio failover 16 etcd/fence=1.10
//
// above 1 when fence recovers faster.
//
// Results go to -out as JSON, with a plot of the lock cycle. The roles of
// the re-executed processes (client, etcd, resource, follower) are
// internal; see role.go.
package main

import (
	"errors"
	"flag"
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
	case roleFollower:
		err = followerMain(os.Args[2:])
	case roleScale:
		err = scaleMain(os.Args[2:])
	case roleCluster:
		err = runMain(os.Args[2:], true)
	default:
		err = runMain(os.Args[1:], false)
	}
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "peers:", err)
		os.Exit(1)
	}
}
