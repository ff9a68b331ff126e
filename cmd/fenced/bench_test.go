package main

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/fence-dev/fence/client"
)

// BenchmarkCluster measures a three-node cluster of real fenced processes
// on loopback (one disk, two cores: every node fsyncs to the same disk).
// Clients list the leader first, as they settle on it after a failover;
// "via-follower" lists a follower first, so every call is forwarded.
// ns/op is per operation, all clients together; p99 is per call.
func BenchmarkCluster(b *testing.B) {
	c := startCluster(b, 3)
	l := c.leader()
	var f *clusterNode
	for _, nd := range c.nodes {
		if nd != l {
			f = nd
		}
	}
	leaderFirst := l.api + "," + c.others(l)[0].api + "," + c.others(l)[1].api
	followerFirst := f.api + "," + l.api
	cycle := func(cl *client.Client, scope string) func() error {
		ctx := context.Background()
		return func() error {
			g, err := cl.Grant(ctx, scope, client.WithTTL(10*time.Second))
			if err != nil {
				return err
			}
			_, err = cl.Release(ctx, scope, g.ID)
			return err
		}
	}
	renew := func(cl *client.Client, scope string) func() error {
		ctx := context.Background()
		g, err := cl.Grant(ctx, scope, client.WithTTL(time.Minute))
		if err != nil {
			return func() error { return err }
		}
		return func() error {
			_, err := cl.Renew(ctx, scope, g.ID)
			return err
		}
	}
	for _, w := range []struct {
		name  string
		addrs string
		setup func(*client.Client, string) func() error
	}{
		{"cycle", leaderFirst, cycle},
		{"cycle-via-follower", followerFirst, cycle},
		{"renew", leaderFirst, renew},
	} {
		for _, n := range []int{1, 16, 64} {
			b.Run(fmt.Sprintf("%s/clients=%d", w.name, n), func(b *testing.B) {
				cl := newClient(b, w.addrs)
				ops := make([]func() error, n)
				for i := range ops {
					// b.Run calls this again for each b.N: fresh scopes each time.
					ops[i] = w.setup(cl, fmt.Sprintf("bench/%s/%d/%d/%d", w.name, n, b.N, i))
				}
				runClients(b, ops)
			})
		}
	}
}

// runClients runs b.N calls spread over the ops, one goroutine each, and
// reports the 99th percentile of one call's latency.
func runClients(b *testing.B, ops []func() error) {
	n := len(ops)
	lat := make([][]time.Duration, n)
	b.ResetTimer()
	var wg sync.WaitGroup
	for i, op := range ops {
		count := b.N / n
		if i < b.N%n {
			count++
		}
		wg.Go(func() {
			for range count {
				start := time.Now()
				if err := op(); err != nil {
					b.Error(err)
					return
				}
				lat[i] = append(lat[i], time.Since(start))
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	all := slices.Concat(lat...)
	if len(all) > 0 {
		slices.Sort(all)
		b.ReportMetric(float64(all[len(all)*99/100].Microseconds())/1000, "p99-ms")
	}
}

// BenchmarkFailover measures the time from kill -9 of the leader to the
// first grant acknowledged by the new one, as a client with every address
// sees it. Each iteration kills the current leader and restarts it after.
func BenchmarkFailover(b *testing.B) {
	c := startCluster(b, 3)
	cl := newClient(b, c.addrs(), client.WithRetryTimeout(30*time.Second))
	var total time.Duration
	for i := range b.N {
		old := c.leader()
		b.StartTimer()
		killed := time.Now()
		old.p.kill(b)
		if _, err := cl.Grant(context.Background(), fmt.Sprintf("failover/%d", i), client.WithTTL(time.Second)); err != nil {
			b.Fatal(err)
		}
		total += time.Since(killed)
		b.StopTimer()
		c.start(old)
		c.waitVoters(3)
	}
	b.ReportMetric(total.Seconds()/float64(b.N), "s/failover")
}
