//go:build unix

package main

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	fencev1 "github.com/fence-dev/fence/api/fence/v1"
	"github.com/fence-dev/fence/client"
	"github.com/fence-dev/fence/fencetest"
	"github.com/fence-dev/fence/internal/version"
)

// nodeOutput and clusterOutput are cluster status -o json: the API's
// StatusResponse.
type nodeOutput struct {
	ID, APIAddr, RaftAddr, State string
	Voter                        bool
	Version                      string
}

type clusterOutput struct {
	Leader string
	NodeID string
	Term   uint64
	Nodes  []nodeOutput
}

func nodesOf(ns []*fencev1.Node) []nodeOutput {
	var out []nodeOutput
	for _, n := range ns {
		out = append(out, nodeOutput{ID: n.Id, APIAddr: n.ApiAddr, RaftAddr: n.RaftAddr, State: n.State, Voter: n.Voter, Version: n.Version})
	}
	return out
}

func (c *clusterOutput) fromAPI(b []byte) error {
	var m fencev1.StatusResponse
	if err := protojson.Unmarshal(b, &m); err != nil {
		return err
	}
	*c = clusterOutput{Leader: m.Leader, NodeID: m.NodeId, Term: m.Term, Nodes: nodesOf(m.Nodes)}
	return nil
}

// membersOutput is cluster add's and remove's -o json: the API's
// AddNodeResponse (RemoveNodeResponse has the same shape).
type membersOutput struct{ Nodes []nodeOutput }

func (o *membersOutput) fromAPI(b []byte) error {
	var m fencev1.AddNodeResponse
	if err := protojson.Unmarshal(b, &m); err != nil {
		return err
	}
	o.Nodes = nodesOf(m.Nodes)
	return nil
}

// TestClusterStatus asks a one-node service for its cluster, through an
// address list whose first node is down: it is its own leader.
func TestClusterStatus(t *testing.T) {
	t.Parallel()
	srv := fencetest.NewServer()
	t.Cleanup(srv.Close)
	s := &fenced{addr: freeAddr(t) + "," + srv.Addr} // through FENCE_ADDR

	var st clusterOutput
	s.wantJSON(t, 0, &st, "cluster", "status")
	if len(st.Nodes) != 1 {
		t.Fatalf("cluster status lists %d nodes, want 1: %+v", len(st.Nodes), st)
	}
	n := st.Nodes[0]
	if n.State != "leader" || n.ID == "" || st.Leader != n.ID || st.NodeID != n.ID || n.APIAddr != srv.Addr || !n.Voter || st.Term == 0 {
		t.Errorf("cluster status: %+v, want its one node, a voter at %s, as leader and answering", st, srv.Addr)
	}
	if n.Version != version.Get().Short() { // the server runs in this process
		t.Errorf("cluster status: version %q, want this build's %q", n.Version, version.Get().Short())
	}

	r := s.want(t, 0, "cluster", "status", "--addr", srv.Addr)
	lines := strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n")
	if len(lines) != 3 || lines[0] != "leader "+n.ID+" in term "+strconv.FormatUint(st.Term, 10)+", as node "+n.ID+" sees it" ||
		!regexp.MustCompile(`^ID +STATE +API +RAFT +VERSION$`).MatchString(lines[1]) ||
		!regexp.MustCompile(`^`+regexp.QuoteMeta(n.ID)+` \* +leader +`+regexp.QuoteMeta(srv.Addr)+` .* `+regexp.QuoteMeta(n.Version)+`$`).MatchString(lines[2]) {
		t.Errorf("cluster status text:\n%s", r.stdout)
	}

	// Lease calls take the same address list.
	var g getOutput
	s.wantJSON(t, 0, &g, "get", "orders")
	if g.Scope != "orders" || g.Held {
		t.Errorf("get through the address list: %+v", g)
	}
}

// TestNodeVersionUnknown: a node that reports no build, as one older than
// the field does, shows as unknown.
func TestNodeVersionUnknown(t *testing.T) {
	var b strings.Builder
	nodesText(&b, []client.Node{{ID: "n1", State: "leader", APIAddr: "a:1", RaftAddr: "a:2", Voter: true, Version: "v1.2.3"},
		{ID: "n2", State: "follower", APIAddr: "b:1", RaftAddr: "b:2", Voter: true}}, "n1", true)
	if !regexp.MustCompile(`(?m)^n1 \* +leader +a:1 +a:2 +v1\.2\.3$\n^n2 +follower +b:1 +b:2 +unknown$`).MatchString(b.String()) {
		t.Errorf("nodes table:\n%s", b.String())
	}
}

// TestClusterChangesRefused: changes the service refuses exit with status
// 2 and name the field.
func TestClusterChangesRefused(t *testing.T) {
	t.Parallel()
	srv := fencetest.NewServer()
	t.Cleanup(srv.Close)
	s := &fenced{addr: srv.Addr}
	var st clusterOutput
	s.wantJSON(t, 0, &st, "cluster", "status")

	for _, args := range [][]string{
		{"cluster", "remove", "n9"},      // not a member
		{"cluster", "remove", st.Leader}, // the last member
	} {
		var e errorOutput
		s.wantJSON(t, 2, &e, args...)
		if e.Code != "invalid" || e.Field != "node_id" || e.ExitStatus != 2 {
			t.Errorf("%q: error object %+v, want code invalid for node_id", args, e)
		}
	}
	var after clusterOutput
	s.wantJSON(t, 0, &after, "cluster", "status")
	if len(after.Nodes) != 1 || after.Leader != st.Leader {
		t.Errorf("after refused changes: %+v, want %+v", after, st)
	}
}

// TestClusterBadInput: mistakes on the command line fail with status 2
// before any call; no service is needed.
func TestClusterBadInput(t *testing.T) {
	t.Parallel()
	s := &fenced{addr: freeAddr(t)}
	for _, tc := range []struct {
		args   []string
		stderr string
	}{
		{[]string{"cluster", "frob"}, `unknown command "frob" for "fencectl cluster"`},
		{[]string{"cluster", "status", "x"}, `unexpected argument "x"`},
		{[]string{"cluster", "add"}, "missing ID"},
		{[]string{"cluster", "add", "n4"}, `required flag(s) "api-addr", "raft-addr" not set`},
		{[]string{"cluster", "add", "n4", "--raft-addr", "127.0.0.1:1"}, `required flag(s) "api-addr" not set`},
		{[]string{"cluster", "add", "n 4", "--raft-addr", "127.0.0.1:1", "--api-addr", "127.0.0.1:2"}, "invalid node_id"},
		{[]string{"cluster", "add", strings.Repeat("n", 65), "--raft-addr", "127.0.0.1:1", "--api-addr", "127.0.0.1:2"}, "invalid node_id"},
		{[]string{"cluster", "add", "n4", "n5", "--raft-addr", "127.0.0.1:1", "--api-addr", "127.0.0.1:2"}, `unexpected argument "n5"`},
		{[]string{"cluster", "remove"}, "missing ID"},
		{[]string{"cluster", "remove", ""}, "invalid node_id"},
		{[]string{"cluster", "remove", "a/b"}, "invalid node_id"},
		{[]string{"cluster", "status", "--addr", "a:1,,b:2"}, "address 2 of 3 is empty"},
		{[]string{"cluster", "status", "--addr", "a:1, a:1"}, "listed twice"},
	} {
		r := s.want(t, 2, tc.args...)
		wantStderr(t, r, tc.stderr, "--help' for usage")
		if r.stdout != "" {
			t.Errorf("text mode wrote to stdout on error\n%v", r)
		}
	}
	var e errorOutput
	s.wantJSON(t, 2, &e, "cluster", "add", "n 4", "--raft-addr", "127.0.0.1:1", "--api-addr", "127.0.0.1:2")
	if e.Code != "usage" || e.Field != "node_id" || e.ExitStatus != 2 {
		t.Errorf("bad node ID error object: %+v", e)
	}
}

// TestVersion: fencectl --version prints its build and exits 0.
func TestVersion(t *testing.T) {
	t.Parallel()
	r := (&fenced{addr: "127.0.0.1:1"}).want(t, 0, "--version")
	if !strings.HasPrefix(r.stdout, "fencectl ") || !strings.Contains(r.stdout, "\nrevision: ") || !strings.Contains(r.stdout, "\ngo:       go1.") {
		t.Errorf("fencectl --version:\n%s", r.stdout)
	}
}

// TestClusterAddReplace: through fencectl, against a cluster of three
// fenced processes, a follower moves with its data directory (killed, and
// started from it at new API and Raft addresses, without --join). Adding
// its ID at the new addresses is refused, exit status 2, naming --replace,
// and changes nothing; with --replace it is accepted, and cluster status
// shows the node at its new addresses, following, and answering through
// them. The cluster grants throughout.
func TestClusterAddReplace(t *testing.T) {
	t.Parallel()
	n1 := startFenced(t, "--node-id", "n1", "--raft-listen", freeAddr(t), "--bootstrap")
	type node struct{ id, api, raft, dir string }
	joined := map[string]*node{}
	stop := map[string]func(){}
	for _, id := range []string{"n2", "n3"} {
		nd := &node{id, freeAddr(t), freeAddr(t), t.TempDir()}
		joined[id] = nd
		stop[id] = runFenced(t, "--node-id", id, "--data-dir", nd.dir, "--listen", nd.api, "--raft-listen", nd.raft, "--join", n1.addr)
	}
	s := &fenced{addr: n1.addr + "," + joined["n2"].api + "," + joined["n3"].api}
	status := func() clusterOutput {
		t.Helper()
		var st clusterOutput
		s.wantJSON(t, 0, &st, "cluster", "status")
		return st
	}
	member := func(st clusterOutput, id string) nodeOutput {
		for _, n := range st.Nodes {
			if n.ID == id {
				return n
			}
		}
		t.Fatalf("%s is not a member: %+v", id, st)
		return nodeOutput{}
	}
	awaitStatus := func(what string, ok func(clusterOutput) bool) clusterOutput {
		t.Helper()
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
			st := status()
			if ok(st) {
				return st
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: not after a minute; cluster status %+v", what, st)
			}
		}
	}
	st := awaitStatus("three nodes, a leader and two followers", func(st clusterOutput) bool {
		states := map[string]int{}
		for _, n := range st.Nodes {
			states[n.State]++
		}
		return len(st.Nodes) == 3 && states["leader"] == 1 && states["follower"] == 2
	})
	var last uint64
	grant := func(when string) {
		t.Helper()
		var l leaseOutput
		s.wantJSON(t, 0, &l, "acquire", "orders", "--ttl", "30s")
		if l.Token <= last {
			t.Fatalf("a grant %s has token %d, after %d", when, l.Token, last)
		}
		last = l.Token
		s.want(t, 0, "release", "orders", "--lease", l.LeaseID)
	}
	grant("before the move")

	// A follower moves: killed, then started at new addresses.
	mover := joined["n2"]
	if st.Leader == "n2" {
		mover = joined["n3"]
	}
	stop[mover.id]()
	moved := &node{mover.id, freeAddr(t), freeAddr(t), mover.dir}
	runFenced(t, "--node-id", moved.id, "--data-dir", moved.dir, "--listen", moved.api, "--raft-listen", moved.raft)
	add := []string{"cluster", "add", moved.id, "--raft-addr", moved.raft, "--api-addr", moved.api}

	r := s.want(t, 2, add...)
	wantStderr(t, r, "invalid id", fmt.Sprintf("%q is a member with Raft address %s and API address %q", moved.id, mover.raft, mover.api), "--replace")
	if r.stdout != "" {
		t.Errorf("a refused add wrote to stdout\n%v", r)
	}
	var e errorOutput
	s.wantJSON(t, 2, &e, add...)
	if e.Code != "invalid" || e.Field != "id" || e.ExitStatus != 2 {
		t.Errorf("refused add's error object %+v, want code invalid, field id, exit status 2", e)
	}
	if n := member(status(), moved.id); n.APIAddr != mover.api || n.RaftAddr != mover.raft {
		t.Fatalf("after the refused add %s is at api %s, raft %s; want its old api %s, raft %s", moved.id, n.APIAddr, n.RaftAddr, mover.api, mover.raft)
	}
	grant("after the refused add")

	var out membersOutput
	s.wantJSON(t, 0, &out, append(add, "--replace")...)
	if n := member(clusterOutput{Nodes: out.Nodes}, moved.id); n.APIAddr != moved.api || n.RaftAddr != moved.raft {
		t.Errorf("the replace printed %+v; want %s at api %s, raft %s", out, moved.id, moved.api, moved.raft)
	}
	awaitStatus(moved.id+" follows at its new addresses", func(st clusterOutput) bool {
		n := member(st, moved.id)
		return n.APIAddr == moved.api && n.RaftAddr == moved.raft && n.State == "follower"
	})
	// Through the moved node alone, forwarded to the leader. Its own view
	// of the members is its copy of the configuration, which applies the
	// change a moment after the leader's: wait for it, bounded.
	via := &fenced{addr: moved.api}
	followsThere := regexp.MustCompile(`(?m)^` + moved.id + ` +follower +` + regexp.QuoteMeta(moved.api) + ` +` + regexp.QuoteMeta(moved.raft) + ` `)
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		r = via.want(t, 0, "cluster", "status")
		if followsThere.MatchString(r.stdout) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("cluster status through %s, after a minute:\n%s", moved.id, r.stdout)
		}
	}
	s = &fenced{addr: moved.api + "," + n1.addr}
	grant("after the replace")
	// Adding it again at its new addresses changes nothing.
	s.want(t, 0, add...)
}

// runFenced runs fenced with args, which name its data directory and
// addresses, until the returned stop, or the end of the test, kills it.
// Unlike startFenced it does not wait for fenced to answer: a node that
// moved has no leader until it is replaced. Its log is shown if the test
// fails.
func runFenced(t *testing.T, args ...string) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var log bytes.Buffer
	cmd := exec.CommandContext(ctx, fencedBin, append([]string{"--max-ttl", maxTTL.String(), "--sign-tokens=false"}, args...)...)
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	stop = sync.OnceFunc(func() {
		cancel()
		_ = cmd.Wait() // killed; its output copied
	})
	t.Cleanup(func() {
		stop()
		if t.Failed() {
			t.Logf("fenced %q log:\n%s", args, log.String())
		}
	})
	return stop
}
