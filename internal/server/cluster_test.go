package server_test

import (
	"errors"
	"net"
	"strings"
	"testing"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/client"
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
	c, err := client.New(leader.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

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
}
