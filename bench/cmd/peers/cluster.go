package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/fence-dev/fence/client"
)

// clusterSize is the number of members of the cluster subcommand's
// clusters.
const clusterSize = 3

// cluster is three fenced nodes or three etcd members on loopback, each
// a process of its own with its own data directory, started with the
// same election timeout. Clients are given every member's address.
type cluster struct {
	system          string
	bin             string        // fenced, for a fence cluster
	electionTimeout time.Duration // the same on both systems
	members         []*member
}

// member is one node of a cluster.
type member struct {
	name string // fenced's node ID, etcd's member name
	dir  string
	api  string // the client address
	peer string // the Raft address
	args []string
	p    *proc // nil while killed
}

// startCluster starts a cluster of sys in dir. fence: n1 bootstraps and
// the others join it, as docs/operations.md says. etcd: the three members
// start together from one initial cluster, as etcd's docs say.
func startCluster(dir, sys, fenced string, electionTimeout time.Duration) (*cluster, error) {
	c := &cluster{system: sys, bin: fenced, electionTimeout: electionTimeout}
	var initial []string
	for i := range clusterSize {
		m := &member{name: fmt.Sprintf("n%d", i+1), dir: filepath.Join(dir, fmt.Sprintf("n%d", i+1))}
		if err := os.MkdirAll(m.dir, 0o700); err != nil {
			return nil, err
		}
		var err error
		if m.api, err = freePort(); err != nil {
			return nil, err
		}
		if m.peer, err = freePort(); err != nil {
			return nil, err
		}
		c.members = append(c.members, m)
		initial = append(initial, m.name+"=http://"+m.peer)
	}
	for i, m := range c.members {
		switch sys {
		case sysFence:
			m.args = []string{"--node-id", m.name, "--raft-listen", m.peer, "--election-timeout", electionTimeout.String()}
			if i == 0 {
				m.args = append(m.args, "--bootstrap")
			} else {
				m.args = append(m.args, "--join", c.members[0].api)
			}
		case sysEtcd:
			m.args = []string{"-dir", filepath.Join(m.dir, "data"), "-client", m.api, "-peer", m.peer, "-name", m.name,
				"-initial-cluster", strings.Join(initial, ","), "-election-timeout", electionTimeout.String()}
		default:
			return nil, fmt.Errorf("no %d-node cluster of %q", clusterSize, sys)
		}
	}
	var err error
	switch sys {
	case sysFence:
		// One at a time: a node joins through the first, which must lead.
		for _, m := range c.members {
			if err = c.start(m); err != nil {
				break
			}
		}
	case sysEtcd:
		// Together: a member is ready once a quorum has started.
		errs := make([]error, len(c.members))
		var wg sync.WaitGroup
		for i, m := range c.members {
			wg.Go(func() { errs[i] = c.start(m) })
		}
		wg.Wait()
		err = errors.Join(errs...)
	}
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), startBound)
		defer cancel()
		err = c.whole(ctx)
	}
	if err != nil {
		c.stop()
		return nil, err
	}
	return c, nil
}

// start runs m's process on its data directory, and waits until it
// serves: fenced answers a Get (forwarded to the leader if it is not
// one), an etcd member is ready once the cluster has taken it in.
func (c *cluster) start(m *member) error {
	var err error
	switch c.system {
	case sysFence:
		m.p, _, err = startFenced(c.bin, m.dir, m.api, m.args...)
	case sysEtcd:
		m.p, err = startEtcdMember(m.dir, m.args...)
	}
	if err != nil {
		m.p = nil
		return fmt.Errorf("%s %s: %w", c.system, m.name, err)
	}
	return nil
}

// addrs is the client addresses of every member, comma-separated.
func (c *cluster) addrs() string {
	var a []string
	for _, m := range c.members {
		a = append(a, m.api)
	}
	return strings.Join(a, ",")
}

// procs is the processes of the members that run.
func (c *cluster) procs() []*proc {
	var ps []*proc
	for _, m := range c.members {
		if m.p != nil {
			ps = append(ps, m.p)
		}
	}
	return ps
}

// stop stops every member at once.
func (c *cluster) stop() {
	var wg sync.WaitGroup
	for _, p := range c.procs() {
		wg.Go(p.stop)
	}
	wg.Wait()
}

// kill ends m's process with SIGKILL and waits for it to be gone.
func (c *cluster) kill(m *member) {
	_ = syscall.Kill(-m.p.cmd.Process.Pid, syscall.SIGKILL)
	<-m.p.done
	m.p = nil
}

// view is what one member says of the cluster, from its own state (no
// round to the leader): who it is and who leads, in the same terms (fence:
// node IDs; etcd: member IDs), its term, and how many voters it counts as
// leader or follower (fence: the leader's view of them; etcd: 1 if it
// knows a leader, each member answering for itself).
type view struct {
	self, leader string
	term         uint64
	healthy      int
}

// status asks member m for its view.
func (c *cluster) status(ctx context.Context, m *member) (view, error) {
	switch c.system {
	case sysFence:
		fc, err := client.New(m.api, client.WithRetryTimeout(0))
		if err != nil {
			return view{}, err
		}
		defer fc.Close()
		st, err := fc.ClusterStatus(ctx)
		if err != nil {
			return view{}, err
		}
		v := view{self: st.NodeID, leader: st.Leader, term: st.Term}
		for _, n := range st.Nodes {
			if n.Voter && (n.State == "leader" || n.State == "follower") {
				v.healthy++
			}
		}
		return v, nil
	case sysEtcd:
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{m.api}, DialTimeout: time.Second, Logger: zap.NewNop()})
		if err != nil {
			return view{}, err
		}
		defer cli.Close()
		st, err := cli.Status(ctx, m.api)
		if err != nil {
			return view{}, err
		}
		v := view{self: fmt.Sprintf("%x", st.Header.MemberId), term: st.RaftTerm}
		if st.Leader != 0 {
			v.leader, v.healthy = fmt.Sprintf("%x", st.Leader), 1
		}
		return v, nil
	}
	return view{}, fmt.Errorf("no system %q", c.system)
}

// leader waits until every running member names the same leader, and
// the leader says so itself, and returns it with its term.
func (c *cluster) leader(ctx context.Context) (*member, uint64, error) {
	var last error
	for {
		l, term, err := c.agreed(ctx)
		if err == nil {
			return l, term, nil
		}
		last = err
		select {
		case <-ctx.Done():
			return nil, 0, fmt.Errorf("%s: no leader agreed on: %w", c.system, last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// agreed asks each running member once for its view, and returns the
// leader they all name if it is one of them and says so itself.
func (c *cluster) agreed(ctx context.Context) (*member, uint64, error) {
	var leader string
	var lead *member
	var term uint64
	for _, m := range c.members {
		if m.p == nil {
			continue
		}
		sctx, cancel := context.WithTimeout(ctx, time.Second)
		v, err := c.status(sctx, m)
		cancel()
		if err != nil {
			return nil, 0, fmt.Errorf("%s: %w", m.name, err)
		}
		if v.leader == "" || leader != "" && v.leader != leader {
			return nil, 0, fmt.Errorf("%s names leader %q, others %q", m.name, v.leader, leader)
		}
		leader = v.leader
		if v.self == v.leader {
			lead, term = m, v.term
		}
	}
	if lead == nil {
		return nil, 0, fmt.Errorf("leader %q is not a running member", leader)
	}
	return lead, term, nil
}

// whole waits until every member runs, they agree on a leader, and each
// is a voter in touch with it.
func (c *cluster) whole(ctx context.Context) error {
	var last error
	for {
		last = c.isWhole(ctx)
		if last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: not whole: %w", c.system, last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (c *cluster) isWhole(ctx context.Context) error {
	for _, m := range c.members {
		if m.p == nil {
			return fmt.Errorf("%s is not running", m.name)
		}
	}
	l, _, err := c.agreed(ctx)
	if err != nil {
		return err
	}
	if c.system == sysEtcd {
		return nil // agreed asked all three: each has the leader
	}
	sctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	v, err := c.status(sctx, l)
	if err != nil {
		return err
	}
	if v.healthy != clusterSize {
		return fmt.Errorf("the leader %s counts %d healthy voters, want %d", l.name, v.healthy, clusterSize)
	}
	return nil
}
