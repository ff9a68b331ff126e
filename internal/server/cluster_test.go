package server_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/client"
	"github.com/fence-dev/fence/internal/fsm"
	"github.com/fence-dev/fence/internal/scrape"
	"github.com/fence-dev/fence/internal/server"
	"github.com/fence-dev/fence/internal/version"
)

// TestAddNodeRefusesAnAbsentNode: adding a voter whose Raft address does
// not answer is refused, saying so, and changes nothing: a cluster of one
// plus a voter that never answers would have no quorum.
func TestAddNodeRefusesAnAbsentNode(t *testing.T) {
	ctx := testContext(t)
	leader := startNode(t, "n1")
	await(ctx, t, "n1 leads", func() bool { return leader.Ready() })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	absent := ln.Addr().String()
	ln.Close() // nothing answers there now
	c := newClient(t, leader.Addr())

	_, err = c.AddNode(ctx, "n2", absent, "127.0.0.1:1")
	var inv *fence.InvalidError
	if !errors.As(err, &inv) || inv.Field != "raft_addr" || !strings.Contains(err.Error(), "does not answer at "+absent) {
		t.Fatalf("AddNode of a node that is not running: %v; want invalid raft_addr, does not answer", err)
	}
	st, err := c.ClusterStatus(ctx)
	if err != nil || len(st.Nodes) != 1 || st.Leader != "n1" {
		t.Fatalf("after the refusal: %+v, %v; want n1 alone, leading", st, err)
	}
	if _, err := c.Grant(ctx, "still-granting"); err != nil {
		t.Fatalf("a grant after the refusal: %v", err)
	}

	// A node that is running is added (it joins by asking for this).
	startNode(t, "n2", leader.Addr())
	await(ctx, t, "n2 joins", func() bool {
		st, err := c.ClusterStatus(ctx)
		return err == nil && len(st.Nodes) == 2
	})
	// Each node reports its build: n1 its own, n2 when n1 asks it.
	await(ctx, t, "both nodes report their build", func() bool {
		st, err := c.ClusterStatus(ctx)
		return err == nil && len(st.Nodes) == 2 && st.Nodes[0].Version == version.Get().Short() && st.Nodes[1].Version == version.Get().Short()
	})
}

// TestAddNodeKeepsAMembersAddresses: with auth off, AddNode of a member
// at another API or Raft address is refused and changes nothing; it once
// rewrote the leader's API address, so that followers forwarded every call
// (with the lease IDs of acquires and renewals) to whatever answered there.
// Adding a member again at its own addresses, as a restart's join does,
// is still allowed.
func TestAddNodeKeepsAMembersAddresses(t *testing.T) {
	ctx := testContext(t)
	leader, follower := startPair(ctx, t)
	c := newClient(t, follower.Addr())
	st, err := c.ClusterStatus(ctx)
	if err != nil {
		t.Fatal(err)
	}
	raftAddr := map[string]string{}
	for _, n := range st.Nodes {
		raftAddr[n.ID] = n.RaftAddr
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	proxy := ln.Addr().String() // answers, as the prober's proxy would

	for _, move := range []struct{ id, raft, api string }{
		{"n1", raftAddr["n1"], proxy},
		{"n2", raftAddr["n2"], proxy},
		{"n1", proxy, leader.Addr()},
	} {
		_, err := c.AddNode(ctx, move.id, move.raft, move.api)
		var inv *fence.InvalidError
		if !errors.As(err, &inv) || !strings.Contains(inv.Reason, "only that node changes them") || !strings.Contains(inv.Reason, "--replace") {
			t.Errorf("AddNode(%s, raft %s, api %s): %v; want invalid, a member's addresses kept", move.id, move.raft, move.api, err)
		}
	}
	st, err = c.ClusterStatus(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range st.Nodes {
		want := map[string]string{"n1": leader.Addr(), "n2": follower.Addr()}[n.ID]
		if n.APIAddr != want || n.RaftAddr != raftAddr[n.ID] {
			t.Errorf("after the refusals, %s is at api %s, raft %s; want api %s, raft %s", n.ID, n.APIAddr, n.RaftAddr, want, raftAddr[n.ID])
		}
	}
	if _, err := c.Grant(ctx, "through-the-follower"); err != nil {
		t.Errorf("a grant through the follower after the refusals: %v", err)
	}
	if _, err := c.AddNode(ctx, "n2", raftAddr["n2"], follower.Addr()); err != nil {
		t.Errorf("adding n2 again at its own addresses: %v", err)
	}
}

// TestReplaceNode: with auth off, an operator moves a member with an
// explicit replace, which a plain AddNode at other addresses is refused
// (TestAddNodeKeepsAMembersAddresses); a replace of an ID that is not a
// member, or to a Raft address where nothing answers, is refused and
// changes nothing.
func TestReplaceNode(t *testing.T) {
	ctx := testContext(t)
	leader, follower := startPair(ctx, t)
	c := newClient(t, leader.Addr())
	addrs := func() map[string][2]string {
		st, err := c.ClusterStatus(ctx)
		if err != nil {
			t.Fatal(err)
		}
		m := map[string][2]string{}
		for _, n := range st.Nodes {
			m[n.ID] = [2]string{n.RaftAddr, n.APIAddr}
		}
		return m
	}
	before := addrs()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	absent := ln.Addr().String()
	ln.Close()

	for _, bad := range []struct{ name, id, raft, field, reason string }{
		{"an ID that is not a member", "n9", absent, "replace", `"n9" is not a member`},
		{"n1 at n2's Raft address", "n1", before["n2"][0], "raft_addr", "is the Raft address of member \"n2\""},
		{"a Raft address where nothing answers", "n2", absent, "raft_addr", "does not answer at " + absent},
	} {
		_, err := c.ReplaceNode(ctx, bad.id, bad.raft, "127.0.0.1:9")
		var inv *fence.InvalidError
		if !errors.As(err, &inv) || inv.Field != bad.field || !strings.Contains(inv.Reason, bad.reason) {
			t.Errorf("replacing %s: %v; want invalid %s, %q", bad.name, err, bad.field, bad.reason)
		}
	}
	if _, err := c.AddNode(ctx, "n9", before["n2"][0], "127.0.0.1:9"); !strings.Contains(fmt.Sprint(err), "is the Raft address of member") {
		t.Errorf("adding n9 at n2's Raft address: %v; want invalid raft_addr, n2's", err)
	}
	if got := addrs(); got["n2"] != before["n2"] || got["n1"] != before["n1"] || len(got) != 2 {
		t.Fatalf("after the refused replaces: %v; want %v", got, before)
	}

	nodes, err := c.ReplaceNode(ctx, "n2", before["n2"][0], "127.0.0.1:9")
	if err != nil {
		t.Fatalf("replacing n2's API address: %v", err)
	}
	for _, n := range nodes {
		if n.ID == "n2" && n.APIAddr != "127.0.0.1:9" {
			t.Errorf("the answer to the replace has n2 at api %s; want 127.0.0.1:9", n.APIAddr)
		}
	}
	if got := addrs()["n2"][1]; got != "127.0.0.1:9" {
		t.Errorf("after the replace n2 is at api %s; want 127.0.0.1:9", got)
	}
	// Back, as a moved node's operator would; then the node's own join at
	// its addresses changes nothing.
	if _, err := c.ReplaceNode(ctx, "n2", before["n2"][0], follower.Addr()); err != nil {
		t.Fatalf("replacing n2 back: %v", err)
	}
	if _, err := c.AddNode(ctx, "n2", before["n2"][0], follower.Addr()); err != nil {
		t.Errorf("adding n2 again at its addresses after the replace: %v", err)
	}
	if got := addrs(); got["n2"] != before["n2"] {
		t.Errorf("n2 at %v; want %v", got["n2"], before["n2"])
	}
	if _, err := newClient(t, follower.Addr()).Grant(ctx, "through-the-follower"); err != nil {
		t.Errorf("a grant through the follower after the replaces: %v", err)
	}
}

// TestRenewalCommitsInACluster: in a cluster a renewal is confirmed only
// once an entry appended after it arrived has committed at a quorum, which
// only answers to appends sent after it can do; Raft's VerifyLeader would
// count an answer to a heartbeat sent before it, which a leader paused with
// one in flight and deposed meanwhile finds waiting when it wakes (see
// docs/safety.md). A node alone writes nothing for a renewal.
func TestRenewalCommitsInACluster(t *testing.T) {
	ctx := testContext(t)
	leader := startNode(t, "n1")
	await(ctx, t, "n1 leads", func() bool { return leader.Ready() })
	c := newClient(t, leader.Addr())
	l, err := c.Grant(ctx, "orders", client.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	lastIndex := func() float64 {
		v, ok := scrape.Find(scrape.Families(t, leader.Addr()), "fence_raft_last_log_index")
		if !ok {
			t.Fatal("no fence_raft_last_log_index")
		}
		return v
	}
	renewals := map[string]func() error{
		"Renew": func() error { _, err := c.Renew(ctx, "orders", l.ID); return err },
		"RenewBatch": func() error {
			rs, err := c.RenewBatch(ctx, []client.Renewal{{Scope: "orders", ID: l.ID}})
			if err == nil {
				err = rs[0].Err
			}
			return err
		},
	}
	for name, renew := range renewals {
		before := lastIndex()
		if err := renew(); err != nil {
			t.Fatalf("%s alone: %v", name, err)
		}
		if after := lastIndex(); after != before {
			t.Errorf("%s on a node alone appended %v log entries, want none", name, after-before)
		}
	}

	follower := startNode(t, "n2", leader.Addr())
	await(ctx, t, "n2 follows", func() bool {
		code, _ := get(t, follower.Addr(), "/readyz")
		return code == http.StatusOK
	})
	for name, renew := range renewals {
		before := lastIndex()
		if err := renew(); err != nil {
			t.Fatalf("%s in a cluster: %v", name, err)
		}
		if after := lastIndex(); after <= before {
			t.Errorf("%s in a cluster was confirmed without appending to the log (last index %v before, %v after)", name, before, after)
		}
	}
}

// TestLeaderHandsOffOnClose: a leader that is closed hands its office to
// a follower first. The followers here would wait ten minutes before
// electing a leader of their own, so one leads within the test's bound
// only if the leader handed off; a lease held through the hand-off renews
// on the new leader.
func TestLeaderHandsOffOnClose(t *testing.T) {
	ctx := testContext(t)
	c, l, _, _ := handOff(ctx, t, 10*time.Minute)
	if _, err := c.Renew(ctx, "orders", l.ID); err != nil {
		t.Fatalf("renewing the lease granted before the hand-off: %v", err)
	}
}

// handOff starts a cluster of n1 and two followers that wait election
// before electing a leader of their own, grants the scope orders for a
// minute through the followers, and closes n1, which hands its office to
// a follower. It returns the followers' client and the lease once a
// follower leads (within 30s: well before election, so only by the hand
// off), then the new leader and the other follower.
func handOff(ctx context.Context, t *testing.T, election time.Duration) (c *client.Client, l fence.Lease, leader, other *server.Server) {
	t.Helper()
	n1 := startNode(t, "n1")
	await(ctx, t, "n1 leads", n1.Ready)
	var followers []*server.Server
	for _, id := range []string{"n2", "n3"} {
		cfg := nodeConfig(id, n1.Addr())
		cfg.ElectionTimeout = election
		f := startNodeConfig(t, cfg)
		await(ctx, t, id+" follows", func() bool {
			code, _ := get(t, f.Addr(), "/readyz")
			return code == http.StatusOK
		})
		followers = append(followers, f)
	}
	c = newClient(t, followers[0].Addr()+","+followers[1].Addr())
	l, err := c.Grant(ctx, "orders", client.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}

	closing, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := n1.Close(closing); err != nil {
		t.Fatalf("closing the leader: %v", err)
	}
	soon, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	await(soon, t, "a follower leads after the leader closed", func() bool {
		return followers[0].Ready() || followers[1].Ready()
	})
	leader, other = followers[0], followers[1]
	if !leader.Ready() {
		leader, other = other, leader
	}
	return c, l, leader, other
}

// TestReplaceLeader: an operator replaces the leader's own Raft address
// (127.0.0.1:P to 127.0.0.2:P; the leader listens on every address, so it
// answers at both, as a leader whose advertised address changes does).
// hashicorp/raft lets a leader change its own entry in the configuration:
// it stays leader in the same term, and the cluster keeps granting, tokens
// rising. Then the leader hands off and stops, and comes back from its
// data directory listening at the new address alone, without --join: it
// follows the new leader only if the others dial it there.
func TestReplaceLeader(t *testing.T) {
	ctx := testContext(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	ln.Close()
	was, moved := "127.0.0.1:"+port, "127.0.0.2:"+port
	n1cfg := nodeConfig("n1")
	n1cfg.DataDir = t.TempDir() // for its restart
	n1cfg.RaftListen, n1cfg.RaftAdvertise = "0.0.0.0:"+port, was
	n1 := startNodeConfig(t, n1cfg)
	await(ctx, t, "n1 leads", n1.Ready)
	followers := map[string]*server.Server{}
	for _, id := range []string{"n2", "n3"} {
		n := startNode(t, id, n1.Addr())
		await(ctx, t, id+" follows", func() bool {
			code, _ := get(t, n.Addr(), "/readyz")
			return code == http.StatusOK
		})
		followers[id] = n
	}
	c := newClient(t, n1.Addr()+","+followers["n2"].Addr()+","+followers["n3"].Addr())
	find := func(ns []client.Node, id string) client.Node {
		t.Helper()
		i := slices.IndexFunc(ns, func(n client.Node) bool { return n.ID == id })
		if i < 0 {
			t.Fatalf("%s is not among the members %+v", id, ns)
		}
		return ns[i]
	}
	st, err := c.ClusterStatus(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Leader != "n1" || len(st.Nodes) != 3 || find(st.Nodes, "n1").RaftAddr != was {
		t.Fatalf("before the replace: %+v; want n1 at raft %s leading 3 nodes", st, was)
	}
	term := st.Term

	var last uint64
	grant := func(when string) {
		t.Helper()
		l, err := c.Grant(ctx, "orders", client.WithTTL(time.Minute))
		if err != nil {
			t.Fatalf("a grant %s: %v", when, err)
		}
		if l.Token <= last {
			t.Fatalf("a grant %s has token %d, after %d", when, l.Token, last)
		}
		last = l.Token
		if _, err := c.Release(ctx, "orders", l.ID); err != nil {
			t.Fatalf("the release %s: %v", when, err)
		}
	}
	grant("before the replace")

	nodes, err := c.ReplaceNode(ctx, "n1", moved, n1.Addr())
	if err != nil {
		t.Fatalf("replacing the leader's Raft address: %v", err)
	}
	if got := find(nodes, "n1").RaftAddr; got != moved {
		t.Errorf("the answer to the replace has n1 at raft %s; want %s", got, moved)
	}
	for range 3 {
		grant("after the replace")
	}
	st, err = c.ClusterStatus(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n := find(st.Nodes, "n1"); st.Leader != "n1" || st.Term != term || n.RaftAddr != moved || n.State != "leader" {
		t.Fatalf("after the replace: %+v; want n1 still leading in term %d, at raft %s", st, term, moved)
	}

	// The leader hands off and stops; the others lead and grant.
	closing, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := n1.Close(closing); err != nil {
		t.Fatalf("closing n1: %v", err)
	}
	await(ctx, t, "n2 or n3 leads", func() bool { return followers["n2"].Ready() || followers["n3"].Ready() })
	grant("after n1 stopped")

	// n1 again, from its data directory, at the address the replace gave
	// alone: nothing answers at the old one now.
	n1cfg.Bootstrap = false
	n1cfg.Listen, n1cfg.RaftListen, n1cfg.RaftAdvertise = n1.Addr(), moved, ""
	again := startNodeConfig(t, n1cfg)
	via := newClient(t, again.Addr())
	await(ctx, t, "n1 follows at "+moved, func() bool {
		st, err := via.ClusterStatus(ctx)
		return err == nil && st.Leader != "" && st.Leader != "n1" && find(st.Nodes, "n1").State == "follower" && find(st.Nodes, "n1").RaftAddr == moved
	})
	grant("after n1 came back")
	if _, err := via.Grant(ctx, "through-n1"); err != nil {
		t.Errorf("a grant through n1, forwarded: %v", err)
	}
}

// TestBackupConfirmsLeadership: a leader that has lost its quorum without
// noticing yet may have been deposed, and its state may lack the new
// leader's grants: it sends no backup, though it still counts itself
// leader. With its quorum, it sends one that holds every grant.
func TestBackupConfirmsLeadership(t *testing.T) {
	ctx := testContext(t)
	// A leader notices that it lost its quorum after a quarter of the
	// election timeout (its leader lease): a minute is long enough for
	// the test's calls, short enough that the leader steps down and
	// closes soon after.
	_, l, leader, other := handOff(ctx, t, time.Minute)
	direct := newClient(t, leader.Addr())
	var b bytes.Buffer
	if _, err := direct.Backup(ctx, &b); err != nil {
		t.Fatalf("backup with a quorum: %v", err)
	}
	st, err := fsm.RestoreFrom(&b)
	if err != nil {
		t.Fatal(err)
	}
	if in := st.Get("orders"); in.Lease == nil || in.Lease.Token != l.Token {
		t.Fatalf("orders in the backup: %+v; want held with token %d", in, l.Token)
	}

	closing, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := other.Close(closing); err != nil {
		t.Fatalf("closing the other follower: %v", err)
	}
	short, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	b.Reset()
	if n, err := direct.Backup(short, &b); err == nil || n != 0 {
		t.Errorf("backup from a leader without a quorum: %d bytes, %v; want none and an error", n, err)
	} else {
		t.Log(err)
	}
	if !leader.Ready() {
		t.Fatal("the leader noticed it lost its quorum: the refusal above tested nothing")
	}
}
