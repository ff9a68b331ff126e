package client

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"time"

	"connectrpc.com/connect"

	fencev1 "github.com/fence-dev/fence/api/fence/v1"
)

// ClusterStatus is one node's view of the cluster, as ClusterStatus
// reports it.
type ClusterStatus struct {
	Leader       string // the leader's node ID; empty while there is none
	NodeID       string // the node that answered
	Term         uint64 // its current Raft term
	CommitIndex  uint64 // the last log index it knows to be committed
	AppliedIndex uint64 // the last log index it has applied
	Nodes        []Node // every member of the Raft configuration
}

// Node is a member of the cluster.
type Node struct {
	ID       string
	APIAddr  string // where it serves the lease API, as it advertised it
	RaftAddr string // where the other nodes reach its Raft transport
	// State is "leader", "follower", "candidate", "shutdown", or "unknown"
	// when the node that answered cannot tell.
	State string
	Voter bool
	// Version is the build the node runs, as it reported it to the node
	// that answered ClusterStatus: a module version such as "v1.2.3", or a
	// pseudo-version naming a commit. Empty when it reported none (a
	// build older than the field, or a node not reached), and in the
	// answers of AddNode and RemoveNode.
	Version string
}

// ClusterStatus asks the node the client is talking to for its view of
// the cluster: its members, their roles, and which node leads. Views can
// differ between nodes for a while around an election.
func (c *Client) ClusterStatus(ctx context.Context) (ClusterStatus, error) {
	resp, err := retry(ctx, c, func(actx context.Context, s *service) (*connect.Response[fencev1.StatusResponse], error) {
		return s.cluster.Status(actx, connect.NewRequest(&fencev1.StatusRequest{}))
	})
	if err != nil {
		return ClusterStatus{}, fmt.Errorf("cluster status: %w", err)
	}
	m := resp.Msg
	return ClusterStatus{
		Leader:       m.Leader,
		NodeID:       m.NodeId,
		Term:         m.Term,
		CommitIndex:  m.CommitIndex,
		AppliedIndex: m.AppliedIndex,
		Nodes:        nodesFrom(m.Nodes),
	}, nil
}

// AddNode makes the node id, reachable for Raft at raftAddr and serving
// the API at apiAddr, a voting member, and returns the members after the
// change. Adding a member again at its own addresses changes nothing, so
// a retried AddNode is harmless; at other addresses it is refused (an
// *fence.InvalidError) unless the caller is that node, authenticated as
// itself: ReplaceNode moves a member. A removed node ID is refused for
// good: a removed node rejoins under a new ID with an empty data
// directory.
func (c *Client) AddNode(ctx context.Context, id, raftAddr, apiAddr string) ([]Node, error) {
	return c.addNode(ctx, &fencev1.AddNodeRequest{Id: id, RaftAddr: raftAddr, ApiAddr: apiAddr})
}

// ReplaceNode moves the member id to raftAddr and apiAddr, for an
// operator whose node moved with its data directory and cannot rejoin
// authenticated as itself, and returns the members after the change. It
// needs the "cluster" permission and is refused from another node's
// identity, and for an ID that is not a member. A new Raft address must
// answer, as for AddNode; the API address, where followers forward every
// call to while the node leads, is taken as given.
func (c *Client) ReplaceNode(ctx context.Context, id, raftAddr, apiAddr string) ([]Node, error) {
	return c.addNode(ctx, &fencev1.AddNodeRequest{Id: id, RaftAddr: raftAddr, ApiAddr: apiAddr, Replace: true})
}

func (c *Client) addNode(ctx context.Context, req *fencev1.AddNodeRequest) ([]Node, error) {
	resp, err := retry(ctx, c, func(actx context.Context, s *service) (*connect.Response[fencev1.AddNodeResponse], error) {
		return s.cluster.AddNode(actx, connect.NewRequest(req))
	})
	if err != nil {
		if req.Replace {
			return nil, fmt.Errorf("replace node %q: %w", req.Id, err)
		}
		return nil, fmt.Errorf("add node %q: %w", req.Id, err)
	}
	return nodesFrom(resp.Msg.Nodes), nil
}

// RemoveNode takes the node id out of the cluster and returns the members
// after the change. The ID can never join again.
func (c *Client) RemoveNode(ctx context.Context, id string) ([]Node, error) {
	req := &fencev1.RemoveNodeRequest{Id: id}
	resp, err := retry(ctx, c, func(actx context.Context, s *service) (*connect.Response[fencev1.RemoveNodeResponse], error) {
		return s.cluster.RemoveNode(actx, connect.NewRequest(req))
	})
	if err != nil {
		return nil, fmt.Errorf("remove node %q: %w", id, err)
	}
	return nodesFrom(resp.Msg.Nodes), nil
}

func nodesFrom(ns []*fencev1.Node) []Node {
	out := make([]Node, 0, len(ns))
	for _, n := range ns {
		out = append(out, Node{ID: n.Id, APIAddr: n.ApiAddr, RaftAddr: n.RaftAddr, State: n.State, Voter: n.Voter, Version: n.Version})
	}
	return out
}

// KeyRotation is what RotateSigningKey did: the new key, and when it
// starts to sign.
type KeyRotation struct {
	KeyID string
	// SignsFrom is when KeyID starts to sign (fenced --key-publish-delay
	// after the rotation). Until then the previous key signs, and guards
	// fetch the new one from /keys. Zero from a service too old to say,
	// which signs with the new key at once.
	SignsFrom time.Time
}

// RotateSigningKey adds a new signing key to the service. The service
// publishes it at once and signs with it from the returned SignsFrom on;
// tokens signed with the previous keys keep verifying for the service's
// grace period after that (fenced --key-grace). A retry after a lost
// answer may rotate twice, which is harmless: the second key starts later.
func (c *Client) RotateSigningKey(ctx context.Context) (KeyRotation, error) {
	resp, err := retry(ctx, c, func(actx context.Context, s *service) (*connect.Response[fencev1.RotateSigningKeyResponse], error) {
		return s.cluster.RotateSigningKey(actx, connect.NewRequest(&fencev1.RotateSigningKeyRequest{}))
	})
	if err != nil {
		return KeyRotation{}, fmt.Errorf("rotate signing key: %w", err)
	}
	r := KeyRotation{KeyID: resp.Msg.KeyId}
	if resp.Msg.SignsFrom != nil {
		r.SignsFrom = resp.Msg.SignsFrom.AsTime()
	}
	return r, nil
}

// Backup writes a backup of the service's lease state to w: a snapshot
// the leader takes when the call arrives, which `fenced --restore` starts
// a new cluster from, with tokens above every one the service issued. It
// holds every lease ID and signing key: keep it as a secret. The caller
// needs the "cluster" permission. The backup is received whole before the
// first byte is written to w, so a call that fails over to another node
// writes nothing twice; it returns the bytes written.
func (c *Client) Backup(ctx context.Context, w io.Writer) (int64, error) {
	b, err := retry(ctx, c, func(actx context.Context, s *service) (*bytes.Buffer, error) {
		stream, err := s.cluster.Backup(actx, connect.NewRequest(&fencev1.BackupRequest{}))
		if err != nil {
			return nil, err
		}
		defer stream.Close()
		var b bytes.Buffer
		for stream.Receive() {
			b.Write(stream.Msg().Chunk)
		}
		return &b, stream.Err()
	})
	if err != nil {
		return 0, fmt.Errorf("backup: %w", err)
	}
	return b.WriteTo(w)
}
