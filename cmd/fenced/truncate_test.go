package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	fencev1 "github.com/fence-dev/fence/api/fence/v1"
	"github.com/fence-dev/fence/client"
)

// TestClusterTruncatedFollowerRestarts drives the sequence that lost
// raft-wal v0.4.0 nodes for good: a leader cut off from the others appends
// entries that never commit; the majority elects another leader and commits
// other entries at those indexes; once healed, the old leader, now a
// follower, clears the conflicting suffix of its log. It is then killed
// with kill -9, and must restart, catch up and take part again. Three
// rounds, so a log that was truncated, crashed and reopened is truncated
// and crashed again.
func TestClusterTruncatedFollowerRestarts(t *testing.T) {
	c := startCluster(t, 3)
	defer dumpLogs(t, c)
	admin := newClient(t, c.addrs(), client.WithRetryTimeout(30*time.Second))
	for round := range 3 {
		old := c.leader()
		rest := c.others(old)
		rpc := direct(old)
		rpc.Get(context.Background(), connect.NewRequest(&fencev1.GetRequest{Scope: "probe"})) // open the connection before the cut
		isolate(t, old.ip, true)

		// The cut-off leader appends these to its own log before it learns
		// it has no quorum; none may be granted.
		var wg sync.WaitGroup
		for i := range 32 {
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
				defer cancel()
				r, err := rpc.Acquire(ctx, connect.NewRequest(&fencev1.AcquireRequest{Scope: fmt.Sprintf("minority/%d/%d", round, i), Holder: "cut-off", Ttl: survivorTTL}))
				if err == nil {
					t.Errorf("the cut-off leader granted %s token %d", r.Msg.Lease.Scope, r.Msg.Lease.Token)
				}
			})
		}
		majority := newClient(t, rest[0].api+","+rest[1].api, client.WithRetryTimeout(30*time.Second))
		var want uint64
		for i := range 64 {
			l, err := majority.Grant(context.Background(), fmt.Sprintf("majority/%d", i%4), client.WithTTL(time.Minute))
			if err != nil {
				t.Fatal(err)
			}
			want = l.Token + 1 // the release closes it with the next value
			if _, err := majority.Release(context.Background(), l.Scope, l.ID); err != nil {
				t.Fatal(err)
			}
		}
		wg.Wait()

		truncations := strings.Count(readLog(t, old), "clearing log suffix")
		isolate(t, old.ip, false)
		waitFor(t, 20*time.Second, fmt.Sprintf("round %d: %s to clear the conflicting suffix of its log", round, old.id), func() bool {
			return strings.Count(readLog(t, old), "clearing log suffix") > truncations
		})

		old.p.kill(t)
		c.start(old)
		c.waitVoters(3)
		leader := c.leader()
		// Caught up: the restarted node has applied what the leader has.
		waitFor(t, 20*time.Second, fmt.Sprintf("round %d: %s to catch up after its restart", round, old.id), func() bool {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			ls, err1 := status(ctx, leader.api)
			fs, err2 := status(ctx, old.api)
			return err1 == nil && err2 == nil && fs.AppliedIndex >= ls.CommitIndex && fs.Term == ls.Term
		})
		st, err := admin.Get(context.Background(), fmt.Sprintf("majority/%d", 63%4))
		if err != nil || st.LastToken != want {
			t.Fatalf("round %d: majority/3 after the restart: %+v, %v; want last token %d", round, st, err, want)
		}
		t.Logf("round %d: %s cleared its log suffix, was killed, restarted and caught up; %s leads", round, old.id, leader.id)
	}
	for round := range 3 {
		for i := range 32 {
			st, err := admin.Get(context.Background(), fmt.Sprintf("minority/%d/%d", round, i))
			if err != nil {
				t.Fatal(err)
			}
			if st.Lease != nil {
				t.Errorf("minority/%d/%d is held with token %d: a cut-off leader's entry survived", round, i, st.Lease.Token)
			}
		}
	}
}

func readLog(t *testing.T, nd *clusterNode) string {
	t.Helper()
	b, err := os.ReadFile(nd.p.log)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// waitFor polls cond until it holds, and fails the test after d.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(d); !cond(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s", d, what)
		}
	}
}
