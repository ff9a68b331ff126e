package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	fencev1 "github.com/fence-dev/fence/api/fence/v1"
	"github.com/fence-dev/fence/api/fence/v1/fencev1connect"
	"github.com/fence-dev/fence/client"
)

// testCluster is three or five fenced processes on loopback. Each node has
// its own 127.x.y.z address, and its Raft port sits behind a partition
// proxy, so a test can cut any node off from the others.
type testCluster struct {
	t     testing.TB
	nodes []*clusterNode
}

type clusterNode struct {
	id       string
	ip       string
	api      string // API address
	raft     string // the real Raft listener
	dataDir  string
	proxy    *partitionProxy // in front of raft; peers dial proxy.addr
	p        *proc
	joinArgs []string
}

// loopbackBase picks a /24 of 127.0.0.0/8 for one test, so tests running
// at the same time in other packages do not meet.
func loopbackBase() string { return fmt.Sprintf("127.%d.%d.", 1+rand.IntN(250), 1+rand.IntN(250)) }

// freePort returns a port free a moment ago on ip.
func freePort(t testing.TB, ip string) string {
	t.Helper()
	ln, err := net.Listen("tcp", ip+":0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// startCluster starts n nodes: n1 bootstraps, the others join through it.
func startCluster(t testing.TB, n int, extra ...string) *testCluster {
	t.Helper()
	base := loopbackBase()
	c := &testCluster{t: t}
	for i := range n {
		ip := base + fmt.Sprint(10+i)
		nd := &clusterNode{id: fmt.Sprintf("n%d", i+1), ip: ip, api: freePort(t, ip), raft: freePort(t, ip), dataDir: t.TempDir()}
		nd.proxy = newPartitionProxy(t, ip, nd.raft)
		c.nodes = append(c.nodes, nd)
	}
	c.nodes[0].joinArgs = append([]string{"--bootstrap"}, extra...)
	for _, nd := range c.nodes[1:] {
		nd.joinArgs = append([]string{"--join", c.nodes[0].api}, extra...)
	}
	for _, nd := range c.nodes {
		c.start(nd)
	}
	c.waitVoters(n)
	return c
}

func (c *testCluster) start(nd *clusterNode) {
	c.t.Helper()
	nd.p = startProc(c.t, nd.dataDir, nd.api, nd.args()...)
}

// args are nd's command-line arguments, but for its data directory and
// API address.
func (nd *clusterNode) args() []string {
	return append([]string{"--node-id", nd.id, "--raft-listen", nd.raft, "--raft-advertise", nd.proxy.addr, "--election-timeout", "1s"}, nd.joinArgs...)
}

// addrs is the client's address list: every node.
func (c *testCluster) addrs() string {
	var a []string
	for _, nd := range c.nodes {
		a = append(a, nd.api)
	}
	return strings.Join(a, ",")
}

// status asks one node for its view.
func status(ctx context.Context, addr string) (*fencev1.StatusResponse, error) {
	resp, err := fencev1connect.NewClusterServiceClient(h2cClient, "http://"+addr).Status(ctx, connect.NewRequest(&fencev1.StatusRequest{}))
	if err != nil {
		return nil, err
	}
	return resp.Msg, nil
}

// leader waits until the nodes in among agree on a serving leader and
// returns it.
func (c *testCluster) leader(among ...*clusterNode) *clusterNode {
	c.t.Helper()
	if len(among) == 0 {
		among = c.nodes
	}
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		var ids []string
		for _, nd := range among {
			st, err := status(ctx, nd.api)
			if err == nil {
				ids = append(ids, st.Leader)
			}
		}
		cancel()
		if len(ids) == len(among) && ids[0] != "" && allEqual(ids) {
			for _, nd := range among {
				if nd.id == ids[0] && c.serves(nd) {
					return nd
				}
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	c.t.Fatalf("no leader agreed on by %d nodes within 20s", len(among))
	return nil
}

// serves reports whether nd answers a lease call itself (it is a ready
// leader, not forwarding).
func (c *testCluster) serves(nd *clusterNode) bool {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	req := connect.NewRequest(&fencev1.GetRequest{Scope: "probe"})
	req.Header().Set("Fence-Forwarded-By", "test")
	_, err := fencev1connect.NewLeaseServiceClient(h2cClient, "http://"+nd.api).Get(ctx, req)
	return err == nil
}

func allEqual(s []string) bool {
	for _, x := range s {
		if x != s[0] {
			return false
		}
	}
	return true
}

// waitVoters waits until the leader's configuration has n voters, each
// with an API address.
func (c *testCluster) waitVoters(n int) {
	c.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		st, err := status(ctx, c.nodes[0].api)
		cancel()
		if err == nil {
			ok := 0
			for _, nd := range st.Nodes {
				if nd.Voter && nd.ApiAddr != "" && (nd.State == "leader" || nd.State == "follower") {
					ok++
				}
			}
			if ok == n {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	c.t.Fatalf("the cluster did not reach %d voters within 30s", n)
}

// startProc runs fenced like startFenced, but only waits for the API to
// answer: a joining node serves nothing until it has a leader.
func startProc(t testing.TB, dataDir, addr string, args ...string) *proc {
	t.Helper()
	return startUntil(t, dataDir, addr, func(ctx context.Context) error {
		_, err := status(ctx, addr)
		return err
	}, args...)
}

// others returns every node but nd.
func (c *testCluster) others(nd *clusterNode) []*clusterNode {
	var rest []*clusterNode
	for _, o := range c.nodes {
		if o != nd {
			rest = append(rest, o)
		}
	}
	return rest
}

func newClient(t testing.TB, addrs string, opts ...client.Option) *client.Client {
	t.Helper()
	c, err := client.New(addrs, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func (p *proc) signal(t testing.TB, sig syscall.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
}

func dumpLogs(t *testing.T, c *testCluster) {
	if !t.Failed() {
		return
	}
	for _, nd := range c.nodes {
		b, _ := os.ReadFile(nd.p.log)
		lines := strings.Split(string(b), "\n")
		t.Logf("--- %s (last lines of %s)\n%s", nd.id, filepath.Base(nd.p.log), strings.Join(lines[max(0, len(lines)-40):], "\n"))
	}
}
