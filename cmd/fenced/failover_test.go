package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fence-dev/fence"
	fencev1 "github.com/fence-dev/fence/api/fence/v1"
	"github.com/fence-dev/fence/api/fence/v1/fencev1connect"
	"github.com/fence-dev/fence/client"
)

// workload runs clients that acquire and release random scopes through
// every node's address until stop is closed, recording what was granted.
type workload struct {
	mu     sync.Mutex
	acks   []ack
	epoch  atomic.Int64 // bumped at each fault
	errs   atomic.Int64
	stop   chan struct{}
	wg     sync.WaitGroup
	scopes int
}

func runWorkload(t *testing.T, addrs string, clients, scopes int) *workload {
	w := &workload{stop: make(chan struct{}), scopes: scopes}
	for i := range clients {
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			c := newClient(t, addrs, client.WithRetryTimeout(30*time.Second), client.WithHolder(fmt.Sprintf("worker-%d", i)))
			for {
				select {
				case <-w.stop:
					return
				default:
				}
				scope := fmt.Sprintf("work/%d", rand.IntN(scopes))
				opts := []client.AcquireOption{client.WithTTL(2 * time.Second)}
				if i%2 == 0 {
					opts = append(opts, client.WithWait())
				}
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				before := w.epoch.Load()
				l, err := c.Grant(ctx, scope, opts...)
				after := w.epoch.Load()
				cancel()
				switch {
				case errors.Is(err, fence.ErrHeld), errors.Is(err, fence.ErrLeaseLost), errors.Is(err, context.DeadlineExceeded):
					continue
				case err != nil:
					w.errs.Add(1)
					t.Logf("worker %d: %v", i, err)
					continue
				}
				e := int(before)
				if before != after {
					e = -1
				}
				w.mu.Lock()
				w.acks = append(w.acks, ack{scope: scope, token: l.Token, epoch: e})
				w.mu.Unlock()
				if r, err := c.Renew(context.Background(), scope, l.ID); err == nil && r.Token != l.Token {
					t.Errorf("worker %d: renewal of %s token %d answered token %d", i, scope, l.Token, r.Token)
				} else if err != nil && !errors.Is(err, fence.ErrLeaseLost) && !errors.Is(err, fence.ErrNotHolder) {
					// Lost or not holder: across a failover the lease may have
					// expired and been followed by more grants than the scope
					// remembers (recentGrants).
					w.errs.Add(1)
					t.Logf("worker %d: renew: %v", i, err)
				}
				_, err = c.Release(context.Background(), scope, l.ID)
				if err != nil && !errors.Is(err, fence.ErrLeaseLost) && !errors.Is(err, fence.ErrNotHolder) {
					w.errs.Add(1)
					t.Logf("worker %d: release: %v", i, err)
				}
			}
		}()
	}
	return w
}

func (w *workload) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.acks)
}

// finish stops the workload and checks the history against the service:
// no token granted twice, tokens of later epochs above earlier ones, and
// every acknowledged token at or below the scope's counter now.
func (w *workload) finish(t *testing.T, c *client.Client) {
	t.Helper()
	close(w.stop)
	w.wg.Wait()
	w.mu.Lock()
	defer w.mu.Unlock()
	checkAcks(t, w.acks)
	highest := map[string]uint64{}
	for _, a := range w.acks {
		highest[a.scope] = max(highest[a.scope], a.token)
	}
	for scope, h := range highest {
		st, err := c.Get(context.Background(), scope)
		if err != nil {
			t.Fatal(err)
		}
		if st.LastToken < h {
			t.Errorf("%s: last token %d is below acknowledged token %d: an acknowledged grant was lost", scope, st.LastToken, h)
		}
	}
	if w.errs.Load() > 0 {
		t.Errorf("%d calls failed outright (see the log); clients must ride through a failover", w.errs.Load())
	}
}

// TestClusterLeaderKill kills the leader with SIGKILL twice, then a
// follower, while 32 clients acquire, renew and release through all three
// addresses; then it kills all three nodes at once and restarts them.
func TestClusterLeaderKill(t *testing.T) {
	c := startCluster(t, 3)
	defer dumpLogs(t, c)
	admin := newClient(t, c.addrs(), client.WithRetryTimeout(30*time.Second))
	kept, err := admin.Grant(context.Background(), "kept", client.WithTTL(5*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	w := runWorkload(t, c.addrs(), 32, 8)

	rounds := 3
	if os.Getenv("FENCE_LONG") != "" {
		rounds = 30 // make test-long
	}
	for round := range rounds {
		time.Sleep(time.Second)
		old := c.leader()
		what := "leader"
		if round%3 == 2 {
			old, what = c.others(old)[0], "follower"
		}
		before := w.count()
		old.p.kill(t)
		w.epoch.Add(1)
		killed := time.Now()
		nl := c.leader(c.others(old)...)
		t.Logf("round %d: killed %s %s; %s serving after %v", round, what, old.id, nl.id, time.Since(killed).Round(time.Millisecond))
		checkStatus(t, admin, map[string]string{old.id: "unreachable", nl.id: "leader"})
		time.Sleep(time.Second)
		if w.count() == before {
			t.Errorf("round %d: no grant acknowledged in the second after the new leader took office", round)
		}
		c.start(old)
		c.waitVoters(3)
	}
	w.finish(t, admin)

	// Every node at once.
	for _, nd := range c.nodes {
		nd.p.signal(t, syscall.SIGKILL)
	}
	for _, nd := range c.nodes {
		nd.p.kill(t)
	}
	for _, nd := range c.nodes {
		c.start(nd)
	}
	c.leader()
	st, err := admin.Get(context.Background(), "kept")
	if err != nil {
		t.Fatal(err)
	}
	if st.Lease == nil || st.Lease.Token != kept.Token {
		t.Fatalf("after killing every node: kept lease token %d forgotten: %+v", kept.Token, st)
	}
	for s := range w.scopes {
		scope := fmt.Sprintf("work/%d", s)
		before, err := admin.Get(context.Background(), scope)
		if err != nil {
			t.Fatal(err)
		}
		l, err := admin.Grant(context.Background(), scope, client.WithWait(), client.WithTTL(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if l.Token <= before.LastToken {
			t.Errorf("%s: granted token %d after a full restart, not above the last token %d", scope, l.Token, before.LastToken)
		}
	}
	t.Logf("%d grants acknowledged", len(w.acks))
}

// TestClusterLeaderStop stops the leader with SIGTERM while 32 clients
// acquire, renew and release: it hands the leadership to a follower
// before it exits (its log says so), grants go on at the new leader, and
// the history holds no token granted twice.
func TestClusterLeaderStop(t *testing.T) {
	c := startCluster(t, 3)
	defer dumpLogs(t, c)
	admin := newClient(t, c.addrs(), client.WithRetryTimeout(30*time.Second))
	w := runWorkload(t, c.addrs(), 32, 8)
	time.Sleep(time.Second)
	old := c.leader()
	before := w.count()
	old.p.stop(t)
	w.epoch.Add(1)
	exited := time.Now()
	if code := old.p.cmd.ProcessState.ExitCode(); code != 0 {
		t.Errorf("the stopped leader exited with status %d, want 0", code)
	}
	if b, err := os.ReadFile(old.p.log); err != nil || !strings.Contains(string(b), "handed the leadership to another voter before stopping") {
		t.Errorf("the stopped leader's log does not say it handed the leadership over (%v)", err)
	}
	nl := c.leader(c.others(old)...)
	t.Logf("stopped leader %s; %s serving %v after it exited", old.id, nl.id, time.Since(exited).Round(time.Millisecond))
	time.Sleep(time.Second)
	if w.count() == before {
		t.Errorf("no grant acknowledged in the second after %s took office", nl.id)
	}
	c.start(old)
	c.waitVoters(3)
	w.finish(t, admin)
}

// checkStatus checks the cluster's status as a client sees it: three
// voters, each with both addresses, in the states want gives (the others
// followers), and the leader named.
func checkStatus(t *testing.T, c *client.Client, want map[string]string) {
	t.Helper()
	st, err := c.ClusterStatus(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Nodes) != 3 {
		t.Fatalf("status lists %d nodes, want 3: %+v", len(st.Nodes), st)
	}
	for _, n := range st.Nodes {
		w, ok := want[n.ID]
		if !ok {
			w = "follower"
		}
		if n.State != w || !n.Voter || n.APIAddr == "" || n.RaftAddr == "" {
			t.Errorf("status of %s: %+v, want state %s", n.ID, n, w)
		}
		if w == "leader" && st.Leader != n.ID {
			t.Errorf("status names leader %q, want %s", st.Leader, n.ID)
		}
	}
}

// direct calls one node's lease service, asking it to answer itself rather
// than forward: the test wants to see what that node would grant.
func direct(nd *clusterNode) fencev1connect.LeaseServiceClient {
	return fencev1connect.NewLeaseServiceClient(h2cClient, "http://"+nd.api, connect.WithInterceptors(selfOnly{}))
}

type selfOnly struct{}

func (selfOnly) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, r connect.AnyRequest) (connect.AnyResponse, error) {
		r.Header().Set("Fence-Forwarded-By", "test")
		return next(ctx, r)
	}
}
func (selfOnly) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}
func (selfOnly) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

// staleAttempts asks the deposed leader old to grant, renew and read, and
// fails the test on anything it confirms that the real leader does not
// back: a grant (the majority never saw it), a renewal of held (the new
// leader counts its TTL from its own start), or a read older than token
// want. It first sends a burst of calls, then calls resume (SIGCONT, or
// nothing), so the burst is waiting when the old leader wakes up; then it
// keeps asking for d.
func staleAttempts(t *testing.T, old *clusterNode, held fence.Lease, scope string, want uint64, resume func(), d time.Duration) int {
	t.Helper()
	rpc := direct(old)
	var n atomic.Int64
	round := func(ctx context.Context) {
		i := n.Add(1)
		var wg sync.WaitGroup
		wg.Go(func() {
			if r, err := rpc.Acquire(ctx, connect.NewRequest(&fencev1.AcquireRequest{Scope: fmt.Sprintf("minority/%d", i), Holder: "stale", Ttl: survivorTTL})); err == nil {
				t.Errorf("the deposed leader granted %s token %d", r.Msg.Lease.Scope, r.Msg.Lease.Token)
			}
		})
		wg.Go(func() {
			if _, err := rpc.Renew(ctx, connect.NewRequest(&fencev1.RenewRequest{Scope: held.Scope, LeaseId: held.ID.String()})); err == nil {
				t.Errorf("the deposed leader confirmed a renewal of %s", held.Scope)
			}
		})
		wg.Go(func() {
			if r, err := rpc.Get(ctx, connect.NewRequest(&fencev1.GetRequest{Scope: scope})); err == nil && r.Msg.LastToken < want {
				t.Errorf("the deposed leader answered a read of %s with last token %d, older than %d", scope, r.Msg.LastToken, want)
			}
		})
		wg.Wait()
	}
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			round(ctx)
		}()
	}
	time.Sleep(100 * time.Millisecond) // let the burst reach the socket
	resume()
	wg.Wait()
	for deadline := time.Now().Add(d); time.Now().Before(deadline); {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		round(ctx)
		cancel()
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("%d rounds of grant, renew and read at the deposed leader %s", n.Load(), old.id)
	return int(n.Load())
}

// TestClusterPartition cuts the leader off from the others (in a cluster
// of five, a follower too, so two nodes are cut off): the cut-off leader
// must grant, renew and serve nothing, the majority must elect a leader and
// carry on, and after healing no grant is lost and no token repeats.
func TestClusterPartition(t *testing.T) {
	for _, n := range []int{3, 5} {
		t.Run(fmt.Sprintf("nodes=%d", n), func(t *testing.T) { testPartition(t, n) })
	}
}

func testPartition(t *testing.T, nodes int) {
	c := startCluster(t, nodes)
	defer dumpLogs(t, c)
	admin := newClient(t, c.addrs(), client.WithRetryTimeout(30*time.Second))
	held, err := admin.Grant(context.Background(), "held", client.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	w := runWorkload(t, c.addrs(), 16, 4)
	time.Sleep(500 * time.Millisecond)

	old := c.leader()
	cut := []*clusterNode{old}
	if nodes == 5 {
		cut = append(cut, c.others(old)[0])
	}
	direct(old).Get(context.Background(), connect.NewRequest(&fencev1.GetRequest{Scope: "p"})) // open the connection before the cut
	for _, nd := range cut {
		isolate(t, nd.ip, true)
	}
	w.epoch.Add(1)
	attempts := staleAttempts(t, old, held, "p", 0, func() {}, 0)
	var rest []*clusterNode
	for _, nd := range c.nodes {
		if !slices.Contains(cut, nd) {
			rest = append(rest, nd)
		}
	}
	var addrs []string
	for _, nd := range rest {
		addrs = append(addrs, nd.api)
	}
	majority := newClient(t, strings.Join(addrs, ","), client.WithRetryTimeout(30*time.Second))
	g, err := majority.Grant(context.Background(), "p", client.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	nl := c.leader(rest...)
	t.Logf("cut off %d of %d nodes, the leader %s among them; %s leads the majority", len(cut), nodes, old.id, nl.id)
	attempts = max(attempts, staleAttempts(t, old, held, "p", g.Token, func() {}, 2*time.Second))

	for _, nd := range cut {
		isolate(t, nd.ip, false)
	}
	w.epoch.Add(1)
	c.leader()
	time.Sleep(time.Second)
	w.finish(t, admin)
	st, err := admin.Get(context.Background(), "p")
	if err != nil || st.Lease == nil || st.Lease.Token != g.Token {
		t.Fatalf("after healing, the majority's grant of p token %d: %+v, %v", g.Token, st, err)
	}
	for i := 1; i <= attempts; i++ {
		st, err := admin.Get(context.Background(), fmt.Sprintf("minority/%d", i))
		if err != nil {
			t.Fatal(err)
		}
		if st.Lease != nil {
			t.Errorf("minority/%d is held with token %d after healing: the cut-off leader's grant survived", i, st.Lease.Token)
		}
	}
}

// TestClusterPause stops the leader with SIGSTOP for longer than the
// election timeout, then resumes it: it must step down and confirm nothing
// on the authority it had before the pause.
func TestClusterPause(t *testing.T) {
	c := startCluster(t, 3)
	defer dumpLogs(t, c)
	admin := newClient(t, c.addrs(), client.WithRetryTimeout(30*time.Second))
	held, err := admin.Grant(context.Background(), "held", client.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	old := c.leader()
	direct(old).Get(context.Background(), connect.NewRequest(&fencev1.GetRequest{Scope: "s"})) // open the connection before the pause
	old.p.signal(t, syscall.SIGSTOP)
	rest := c.others(old)
	majority := newClient(t, rest[0].api+","+rest[1].api, client.WithRetryTimeout(30*time.Second))
	g, err := majority.Grant(context.Background(), "s", client.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	nl := c.leader(rest...)
	t.Logf("paused %s; %s leads; resuming", old.id, nl.id)
	attempts := staleAttempts(t, old, held, "s", g.Token, func() { old.p.signal(t, syscall.SIGCONT) }, 2*time.Second)
	c.leader()
	for i := 1; i <= attempts; i++ {
		st, err := admin.Get(context.Background(), fmt.Sprintf("minority/%d", i))
		if err != nil {
			t.Fatal(err)
		}
		if st.Lease != nil {
			t.Errorf("minority/%d is held with token %d: the paused leader's grant survived", i, st.Lease.Token)
		}
	}
}

// TestClusterSnapshotCatchUpAndRemoval takes a node down while the log
// grows past several snapshots, so that it can only catch up from a
// snapshot; then removes it, and checks that it cannot rejoin under its
// old ID.
func TestClusterSnapshotCatchUpAndRemoval(t *testing.T) {
	// raft-wal drops compacted entries a segment at a time: small segments
	// make the entries the lagging node needs really gone.
	c := startCluster(t, 3, "--snapshot-threshold", "64", "--snapshot-interval", "200ms", "--raft-segment-size", "65536")
	defer dumpLogs(t, c)
	admin := newClient(t, c.addrs(), client.WithRetryTimeout(30*time.Second))
	l := c.leader()
	var down *clusterNode
	for _, nd := range c.nodes {
		if nd != l {
			down = nd
		}
	}
	down.p.kill(t)
	var last uint64
	for i := range 400 {
		g, err := admin.Grant(context.Background(), "grow", client.WithTTL(time.Second))
		if err != nil {
			t.Fatalf("grant %d: %v", i, err)
		}
		if _, err := admin.Release(context.Background(), "grow", g.ID); err != nil {
			t.Fatal(err)
		}
		last = g.Token + 1 // the release closed it with the next value
	}
	ctx := context.Background()
	lst, err := status(ctx, l.api)
	if err != nil {
		t.Fatal(err)
	}
	c.start(down)
	deadline := time.Now().Add(20 * time.Second)
	for {
		st, err := status(ctx, down.api)
		if err == nil && st.AppliedIndex >= lst.CommitIndex {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not catch up to index %d within 20s: %+v, %v", down.id, lst.CommitIndex, st, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	snaps, _ := filepath.Glob(filepath.Join(down.dataDir, "snapshots", "*"))
	if len(snaps) == 0 {
		t.Errorf("%s caught up without a snapshot in its data dir", down.id)
	}
	st, err := admin.Get(ctx, "grow")
	if err != nil || st.LastToken != last {
		t.Fatalf("grow: %+v, %v; want last token %d", st, err, last)
	}

	if _, err := admin.RemoveNode(ctx, down.id); err != nil {
		t.Fatal(err)
	}
	down.p.kill(t)
	p := spawn(t, down.dataDir, down.api, "--node-id", down.id, "--raft-listen", down.raft, "--raft-advertise", down.proxy.addr, "--join", l.api)
	select {
	case <-p.exit:
	case <-time.After(30 * time.Second):
		t.Fatal("a removed node restarted with --join kept running; it must refuse to rejoin under its old ID")
	}
	b, _ := os.ReadFile(p.log)
	if !strings.Contains(string(b), "was removed") {
		t.Errorf("the removed node's log does not say why it stopped:\n%s", b)
	}
	if p.cmd.ProcessState.ExitCode() == 0 {
		t.Error("the removed node exited with status 0")
	}

	// The two members left restart from their snapshots plus the log's
	// tail, with every token.
	for _, nd := range c.others(down) {
		nd.p.kill(t)
	}
	for _, nd := range c.others(down) {
		c.start(nd)
	}
	c.leader(c.others(down)...)
	st, err = admin.Get(ctx, "grow")
	if err != nil || st.LastToken < last {
		t.Fatalf("after restarting from snapshots, grow: %+v, %v; want last token %d or above (the new leader's floor)", st, err, last)
	}
	g, err := admin.Grant(ctx, "grow", client.WithTTL(time.Second))
	if err != nil || g.Token != st.LastToken+1 {
		t.Fatalf("after restarting from snapshots, grant of grow = %+v, %v; want token %d", g, err, st.LastToken+1)
	}
}

// survivorTTL is the TTL of the grants a cut-off or paused leader must not
// make: had one survived, it would still be held when the test looks, since
// every new leader gives each held lease a full TTL. (A scope's last token
// cannot tell: every new leader raises it to its token floor, granted or
// not.)
var survivorTTL = durationpb.New(5 * time.Minute)
