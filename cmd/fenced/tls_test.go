package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fence-dev/fence/client"
	"github.com/fence-dev/fence/internal/testcerts"
)

// TestClusterTLS runs three nodes with TLS on the API and mutual TLS on
// Raft: they join, forward over TLS, fail over after a leader kill, and
// refuse Raft connections from anyone without a certificate of their CA.
func TestClusterTLS(t *testing.T) {
	dir := t.TempDir()
	ca, rogue := testcerts.NewCA(t, "fence cluster CA"), testcerts.NewCA(t, "rogue CA")
	caFile := ca.WriteCA(t, dir, "ca")
	c := &testCluster{t: t}
	base := loopbackBase()
	for i := range 3 {
		ip := base + fmt.Sprint(10+i)
		nd := &clusterNode{id: fmt.Sprintf("n%d", i+1), ip: ip, api: freePort(t, ip), raft: freePort(t, ip), dataDir: t.TempDir()}
		nd.proxy = newPartitionProxy(t, ip, nd.raft)
		cert, key := testcerts.Write(t, dir, nd.id, ca.Issue(t, nd.id, ip))
		nd.joinArgs = []string{"--tls-cert", cert, "--tls-key", key, "--tls-ca", caFile}
		c.nodes = append(c.nodes, nd)
	}
	defer dumpLogs(t, c)
	cl := newClient(t, c.addrs(), client.WithTLS(&tls.Config{RootCAs: ca.Pool()}), client.WithRetryTimeout(30*time.Second))
	start := func(nd *clusterNode, extra ...string) {
		args := append([]string{"--node-id", nd.id, "--raft-listen", nd.raft, "--raft-advertise", nd.proxy.addr}, nd.joinArgs...)
		nd.p = spawn(t, nd.dataDir, nd.api, append(args, extra...)...)
	}
	waitVoters := func(n int) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			st, err := cl.ClusterStatus(context.Background())
			ok := 0
			if err == nil {
				for _, nd := range st.Nodes {
					if nd.State == "leader" || nd.State == "follower" {
						ok++
					}
				}
			}
			if ok == n && st.Leader != "" {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d of %d TLS nodes up after 30s: %+v, %v", ok, n, st, err)
			}
		}
	}
	start(c.nodes[0], "--bootstrap")
	waitVoters(1)
	for _, nd := range c.nodes[1:] {
		start(nd, "--join", c.nodes[0].api)
	}
	waitVoters(3)

	// Through a follower first: the call is forwarded to the leader over TLS.
	st, _ := cl.ClusterStatus(context.Background())
	var follower *clusterNode
	for _, nd := range c.nodes {
		if nd.id != st.Leader {
			follower = nd
		}
	}
	viaFollower := newClient(t, follower.api, client.WithTLS(&tls.Config{RootCAs: ca.Pool()}))
	l, err := viaFollower.Grant(context.Background(), "tls/a")
	if err != nil {
		t.Fatalf("grant through follower %s: %v", follower.id, err)
	}
	if !l.FencingToken().Signed() {
		t.Errorf("token %s is not signed", l.FencingToken())
	}

	// Without a certificate, or with one of another CA, Raft refuses.
	for name, cfg := range map[string]*tls.Config{
		"no certificate":                   {RootCAs: ca.Pool()},
		"another CA's":                     {RootCAs: ca.Pool(), Certificates: []tls.Certificate{rogue.Issue(t, "n9", follower.ip)}},
		"no certificate, server unchecked": {InsecureSkipVerify: true},
	} {
		conn, err := tls.Dial("tcp", follower.raft, cfg)
		if err == nil {
			conn.SetDeadline(time.Now().Add(5 * time.Second))
			_, err = conn.Read(make([]byte, 1))
			conn.Close()
		}
		if err == nil || !strings.Contains(err.Error(), "certificate") {
			t.Errorf("raft connection with %s: %v; want it refused for its certificate", name, err)
		}
	}

	// The leader dies; the others elect one over mutual TLS.
	for _, nd := range c.nodes {
		if nd.id == st.Leader {
			nd.p.kill(t)
		}
	}
	g, err := cl.Grant(context.Background(), "tls/b")
	if err != nil {
		t.Fatalf("grant after the leader's death: %v", err)
	}
	t.Logf("after killing %s, granted tls/b token %d", st.Leader, g.Token)
}
