package main

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/spf13/cobra"

	fencev1 "github.com/fence-dev/fence/api/fence/v1"
	"github.com/fence-dev/fence/client"
	"github.com/fence-dev/fence/internal/fsm"
)

// nodesOut is the members as the API's Nodes.
func nodesOut(ns []client.Node) []*fencev1.Node {
	out := make([]*fencev1.Node, 0, len(ns))
	for _, n := range ns {
		out = append(out, &fencev1.Node{Id: n.ID, ApiAddr: n.APIAddr, RaftAddr: n.RaftAddr, State: n.State, Voter: n.Voter, Version: n.Version})
	}
	return out
}

// nodeVersion is a node's build for cluster status: "unknown" when it
// reported none, as a node of an older build does.
func nodeVersion(n client.Node) string {
	if n.Version == "" {
		return "unknown"
	}
	return n.Version
}

// nodesText writes the members as a table, the leader's ID marked with *;
// with versions, the build each node runs as a last column.
func nodesText(w io.Writer, ns []client.Node, leader string, versions bool) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if versions {
		fmt.Fprintln(tw, "ID\tSTATE\tAPI\tRAFT\tVERSION")
	} else {
		fmt.Fprintln(tw, "ID\tSTATE\tAPI\tRAFT")
	}
	for _, n := range ns {
		id, state, api := n.ID, n.State, n.APIAddr
		if id == leader {
			id += " *"
		}
		if !n.Voter {
			state += " (nonvoter)"
		}
		if api == "" {
			api = "-"
		}
		if versions {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", id, state, api, n.RaftAddr, nodeVersion(n))
		} else {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", id, state, api, n.RaftAddr)
		}
	}
	tw.Flush()
}

// groupArgs is the Args of a command that only groups others. Without it,
// cobra prints help and exits 0 for a mistyped subcommand, where root's own
// unknown commands are usage errors.
func groupArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usageErrorf("unknown command %q for %q", args[0], cmd.CommandPath())
	}
	return nil
}

func (a *app) newClusterCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "cluster",
		Short: "Show the nodes of a fenced cluster; add and remove nodes",
		Long: `Cluster shows and changes the membership of a replicated fenced.

Give --addr (or FENCE_ADDR) every node's address, comma-separated: any live
node answers, and changes go to the leader whichever node takes them.`,
		Example: `  fencectl cluster status --addr 10.0.0.1:7481,10.0.0.2:7481,10.0.0.3:7481
  fencectl cluster add n4 --raft-addr 10.0.0.4:7491 --api-addr 10.0.0.4:7481
  fencectl cluster remove n3`,
		Args: groupArgs,
		RunE: func(cmd *cobra.Command, args []string) error { return cmd.Help() },
	}
	cmd.AddCommand(a.newClusterStatusCmd(), a.newClusterAddCmd(), a.newClusterRemoveCmd())
	return cmd
}

func (a *app) newClusterStatusCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "status",
		Short: "List the nodes of the cluster, their roles and the leader",
		Long: `Status lists every member of the cluster with its state (leader, follower,
candidate, shutdown, unreachable or unknown), its API address, its Raft
address and the build it runs (its "fenced --version"; unknown for a node
that does not report it, as builds before the field did not, or that
could not be reached), and names the leader, marked * in the table.

It is the view of the node that answers (the first of --addr that does),
which asks each peer for its state: around an election, nodes can disagree
for a moment. No leader is not an error: the status is printed and the
exit status is 0.

With -o json it prints the API's StatusResponse: {"nodes": [{"id",
"apiAddr", "raftAddr", "state", "voter", "version"}, ...], "leader",
"nodeId", "term", "commitIndex", "appliedIndex"}; nodeId is the node that
answered, leader is left out while there is none, and a node's version
while it reported none.`,
		Example: `  fencectl cluster status
  fencectl cluster status -o json | jq -r .leader`,
		Args: exactArgs(),
		RunE: a.run(func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			defer c.Close()
			st, err := c.ClusterStatus(cmd.Context())
			if err != nil {
				return err
			}
			out := &fencev1.StatusResponse{Nodes: nodesOut(st.Nodes), Leader: st.Leader, NodeId: st.NodeID, Term: st.Term,
				CommitIndex: st.CommitIndex, AppliedIndex: st.AppliedIndex}
			return a.emit(out, func(w io.Writer) {
				if st.Leader == "" {
					fmt.Fprintf(w, "no leader in term %d, as node %s sees it\n", st.Term, st.NodeID)
				} else {
					fmt.Fprintf(w, "leader %s in term %d, as node %s sees it\n", st.Leader, st.Term, st.NodeID)
				}
				nodesText(w, st.Nodes, st.Leader, true)
			})
		}),
	}
}

func (a *app) newClusterAddCmd() *cobra.Command {
	var raftAddr, apiAddr string
	var replace bool
	cmd := &cobra.Command{
		Use:   "add ID --raft-addr HOST:PORT --api-addr HOST:PORT [--replace]",
		Short: "Make the node ID a voting member of the cluster",
		Long: `Add makes the node ID, whose Raft transport listens at --raft-addr, a voting
member, and prints the members after the change. Start that node first
(fenced --node-id ID --raft-listen ...) without --bootstrap; a node started
with --join asks to be added by itself.

Adding a member again at its addresses changes nothing; at other addresses
it is refused, unless the node itself asks, authenticated as itself (with
auth on, as it does when it joins again after a move), or --replace is
given. An ID that was removed is refused for good: a removed node rejoins
under a new ID with an empty data directory.

--replace moves the member ID to the addresses given: for a node that
moved with its data directory (a new machine, a new address) and cannot
rejoin as itself, as with auth off. It needs the "cluster" permission, is
refused from another node's certificate, and for an ID that is not a
member. Start the moved node first, without --join (a join at the new
addresses is refused until the replace): its new Raft address must answer.

With -o json it prints the API's AddNodeResponse, {"nodes": [NODE, ...]}, each node as
"fencectl cluster status" prints it.`,
		Example: `  fencectl cluster add n4 --raft-addr 10.0.0.4:7491 --api-addr 10.0.0.4:7481
  fencectl cluster add n2 --raft-addr 10.0.0.7:7491 --api-addr 10.0.0.7:7481 --replace`,
		Args: exactArgs("ID"),
		RunE: a.run(func(cmd *cobra.Command, args []string) error {
			id := args[0]
			if replace {
				return a.changeMembers(cmd.Context(), id, "replaced node "+id+": now at raft "+raftAddr+", api "+apiAddr,
					func(ctx context.Context, c *client.Client) ([]client.Node, error) {
						return c.ReplaceNode(ctx, id, raftAddr, apiAddr)
					})
			}
			return a.changeMembers(cmd.Context(), id, "added node "+id+" at raft "+raftAddr,
				func(ctx context.Context, c *client.Client) ([]client.Node, error) {
					return c.AddNode(ctx, id, raftAddr, apiAddr)
				})
		}),
	}
	cmd.Flags().StringVar(&raftAddr, "raft-addr", "", "where the other nodes reach the node's Raft transport (its fenced --raft-advertise, or --raft-listen)")
	cmd.Flags().StringVar(&apiAddr, "api-addr", "", "where the node serves the lease API, for followers to forward to (its fenced --advertise)")
	cmd.Flags().BoolVar(&replace, "replace", false, "move the member ID to these addresses (an operator's call, for a node that moved and cannot rejoin as itself)")
	_ = cmd.MarkFlagRequired("raft-addr")
	// Followers forward to the leader at its API address, so every member needs one.
	_ = cmd.MarkFlagRequired("api-addr")
	return cmd
}

func (a *app) newClusterRemoveCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "remove ID",
		Short: "Take the node ID out of the cluster for good",
		Long: `Remove takes the node ID out of the cluster's Raft configuration and prints
the members after the change. The ID can never join again: to bring the
machine back, start it under a new ID with an empty data directory.

Removing a node that is not a member, or the last one, fails with exit
status 2 and changes nothing. Shrink a cluster one node at a time, keeping
a majority of the remaining members up.

With -o json it prints the API's RemoveNodeResponse, {"nodes": [NODE, ...]}, each node as
"fencectl cluster status" prints it.`,
		Example: `  fencectl cluster remove n3`,
		Args:    exactArgs("ID"),
		RunE: a.run(func(cmd *cobra.Command, args []string) error {
			id := args[0]
			return a.changeMembers(cmd.Context(), id, "removed node "+id,
				func(ctx context.Context, c *client.Client) ([]client.Node, error) {
					return c.RemoveNode(ctx, id)
				})
		}),
	}
}

// changeMembers checks the node ID and makes one membership change. It
// prints the members after the change: as the API answers (-o json), or
// after the line done (text).
func (a *app) changeMembers(ctx context.Context, id string, done string,
	change func(context.Context, *client.Client) ([]client.Node, error)) error {
	if err := fsm.ValidateNodeID(id); err != nil {
		return usage(err)
	}
	c, err := a.client()
	if err != nil {
		return err
	}
	defer c.Close()
	nodes, err := change(ctx, c)
	if err != nil {
		return err
	}
	// AddNodeResponse and RemoveNodeResponse have the same one field.
	return a.emit(&fencev1.AddNodeResponse{Nodes: nodesOut(nodes)}, func(w io.Writer) {
		fmt.Fprintln(w, done)
		nodesText(w, nodes, "", false)
	})
}
