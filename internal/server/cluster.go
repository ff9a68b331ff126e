package server

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"slices"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/fence-dev/fence"
	fencev1 "github.com/fence-dev/fence/api/fence/v1"
	"github.com/fence-dev/fence/api/fence/v1/fencev1connect"
	"github.com/fence-dev/fence/internal/authz"
	"github.com/fence-dev/fence/internal/fsm"
	"github.com/fence-dev/fence/internal/raftnode"
	"github.com/fence-dev/fence/internal/status"
	"github.com/fence-dev/fence/internal/version"
	"github.com/fence-dev/fence/internal/wire"
)

// forwardedHeader marks a request one node forwarded to the leader, so a
// node that is not (or no longer) the serving leader answers it itself,
// with Unavailable, instead of forwarding it on in a loop; and so that the
// leader takes it for the caller's, never the forwarding node's own.
const forwardedHeader = authz.ForwardedHeader

// selfOnlyHeader asks ClusterService.Status for the answering node alone;
// the node asked by a user adds it when it asks its peers.
const selfOnlyHeader = "Fence-Status-Self"

// h2c speaks HTTP/2 without TLS, which gRPC needs end to end. Pings find a
// peer that stopped answering (paused, cut off) in seconds, not at the
// kernel's TCP timeout.
func h2c() *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.Protocols = new(http.Protocols)
	t.Protocols.SetUnencryptedHTTP2(true)
	t.HTTP2 = &http.HTTP2Config{SendPingTimeout: 2 * time.Second, PingTimeout: 2 * time.Second}
	return t
}

type leaderKey struct{}

// newProxy returns the reverse proxy that carries requests to the leader.
// It forwards whole HTTP requests, so every protocol the API speaks (gRPC,
// Connect, JSON) and every RPC go through one path.
func (s *Server) newProxy(transport http.RoundTripper) *httputil.ReverseProxy {
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme = s.cfg.TLS.scheme()
			pr.Out.URL.Host = pr.In.Context().Value(leaderKey{}).(string)
			pr.Out.Header.Set(forwardedHeader, s.cfg.NodeID)
		},
		Transport:     transport,
		FlushInterval: -1, // stream answers as they come
		// Read a unary answer whole before passing it on: if the leader dies
		// between its headers and its body, the caller then gets a clean 503
		// to retry instead of a stream reset it cannot classify. Streaming
		// calls are passed through as they come.
		ModifyResponse: func(resp *http.Response) error {
			if strings.HasSuffix(resp.Request.URL.Path, "/Watch") || resp.Request.URL.Path == status.EventsPath {
				return nil
			}
			b, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil {
				return err
			}
			resp.Body = io.NopCloser(bytes.NewReader(b))
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			leader, _ := r.Context().Value(leaderKey{}).(string)
			if cause := context.Cause(r.Context()); cause != nil {
				err = cause // why forward cancelled it, rather than "context canceled"
			}
			err = fmt.Errorf("%w: forwarding to the leader at %s failed: %v", fence.ErrUnavailable, leader, err)
			// An RPC's caller parses errors in its protocol's own format;
			// the plain endpoints (/events) get text.
			if !forwardErrors.IsSupported(r) {
				http.Error(w, "fence: "+err.Error(), http.StatusServiceUnavailable)
				return
			}
			ce := wire.ToConnect(err)
			ce.Meta().Set(leaderHeader, leader)
			forwardErrors.Write(w, r, ce)
		},
	}
}

// Why forward cancels a forwarded request.
var (
	errLeaderChanged = errors.New("the leader changed")
	errStopping      = errors.New("this node is shutting down")
)

// forwardErrors writes a failed forward's error as the RPC's protocol does.
var forwardErrors = connect.NewErrorWriter()

// leaderHeader names, on a failed forward, the leader it was for.
const leaderHeader = "Fence-Leader"

// forward sends a request to the leader when this node is not the serving
// leader, and serves it here otherwise (including when no leader is known:
// the handler then answers Unavailable). With auth on, a request without
// an identity never gets here unless it is served locally: Authenticate,
// before this, refuses an RPC without one, and any other path but the
// public ones, which are all served locally. Were one forwarded, the
// leader would take it for no one, not for this node, whose certificate
// it comes over (authz.ForwardedHeader).
func (s *Server) forward(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.lessor.Ready() || servedLocally(r) || r.Header.Get(forwardedHeader) != "" {
			next.ServeHTTP(w, r)
			return
		}
		gen := s.leaderGeneration()
		addr := s.leaderAPI()
		if addr == "" {
			next.ServeHTTP(w, r)
			return
		}
		// A leader that is frozen (paused, partitioned) may hold the request
		// forever; once another leader is known, give up on it and answer
		// Unavailable so the caller retries there. So too once this node
		// stops: a waiting acquire or a watch it forwards lasts as long as
		// the caller lets it, and the graceful shutdown would wait for it
		// until its deadline; the caller retries at the leader directly.
		ctx, cancel := context.WithCancelCause(context.WithValue(r.Context(), leaderKey{}, addr))
		defer cancel(nil)
		go func() {
			select {
			case <-gen:
				cancel(errLeaderChanged)
			case <-s.closing:
				cancel(errStopping)
			case <-ctx.Done():
			}
		}()
		s.proxy.ServeHTTP(w, r.WithContext(ctx))
	})
}

// leaderGeneration returns a channel closed at the next change of leader.
func (s *Server) leaderGeneration() <-chan struct{} {
	s.gmu.Lock()
	defer s.gmu.Unlock()
	return s.leaderGen
}

func (s *Server) leaderChanged(string) {
	s.gmu.Lock()
	close(s.leaderGen)
	s.leaderGen = make(chan struct{})
	s.gmu.Unlock()
}

// leaderAPI returns the API address of the leader when it is another node.
func (s *Server) leaderAPI() string {
	id := s.node.LeaderID()
	if id == "" || id == s.cfg.NodeID {
		return ""
	}
	var addr string
	s.node.Read(func(st *fsm.State) { addr = st.Nodes()[id] })
	return addr
}

// advertise is the API address this node records for its peers.
func (s *Server) advertise() string {
	if s.cfg.Advertise != "" {
		return s.cfg.Advertise
	}
	return s.ln.Addr().String()
}

// recordSelf makes sure the replicated state has this node's API address,
// so followers can forward to it. The leader calls it on taking office.
func (s *Server) recordSelf(ctx context.Context) error {
	var have string
	s.node.Read(func(st *fsm.State) { have = st.Nodes()[s.cfg.NodeID] })
	if have == s.advertise() {
		return nil
	}
	r, err := s.node.Apply(ctx, fsm.Command{Op: fsm.OpSetNode, Node: s.cfg.NodeID, Addr: s.advertise()})
	if err == nil && r.Outcome == fsm.Invalid {
		err = r.Err
	}
	return err
}

// cluster implements fence.v1.ClusterService.
type cluster struct{ s *Server }

// Status implements fence.v1.ClusterService.Status. The node asked reports
// the configuration and asks each peer for its own state and build, so a
// dead peer shows as unreachable rather than as a follower.
func (c cluster) Status(ctx context.Context, req *connect.Request[fencev1.StatusRequest]) (*connect.Response[fencev1.StatusResponse], error) {
	st, err := c.s.node.Status()
	if err != nil {
		return nil, wire.ToConnect(err)
	}
	resp := &fencev1.StatusResponse{Leader: st.LeaderID, NodeId: st.NodeID, Term: st.Term, CommitIndex: st.CommitIndex, AppliedIndex: st.AppliedIndex}
	resp.Nodes = c.s.nodes(st)
	for _, n := range resp.Nodes {
		if n.Id == st.NodeID {
			n.Version = version.Get().Short()
		}
	}
	if req.Header().Get(selfOnlyHeader) != "" {
		return connect.NewResponse(resp), nil
	}
	var wg sync.WaitGroup
	for _, n := range resp.Nodes {
		if n.Id == st.NodeID {
			continue
		}
		if n.ApiAddr == "" {
			n.State = "unknown"
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			n.State, n.Version = c.s.peerState(ctx, n.Id, n.ApiAddr)
		}()
	}
	wg.Wait()
	return connect.NewResponse(resp), nil
}

func (s *Server) nodes(st raftnode.Status) []*fencev1.Node {
	var addrs map[string]string
	s.node.Read(func(fs *fsm.State) { addrs = fs.Nodes() })
	var out []*fencev1.Node
	for _, sv := range st.Servers {
		n := &fencev1.Node{Id: sv.ID, RaftAddr: sv.RaftAddr, ApiAddr: addrs[sv.ID], Voter: sv.Voter, State: "unknown"}
		if sv.ID == st.NodeID {
			n.State = st.State
			n.ApiAddr = s.advertise()
		}
		out = append(out, n)
	}
	slices.SortFunc(out, func(a, b *fencev1.Node) int { return strings.Compare(a.Id, b.Id) })
	return out
}

// peerState asks the node id at addr for its own state and build
// version; the version is empty when it reports none (an older build).
func (s *Server) peerState(ctx context.Context, id, addr string) (state, build string) {
	ctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	req := connect.NewRequest(&fencev1.StatusRequest{})
	req.Header().Set(selfOnlyHeader, "1")
	resp, err := fencev1connect.NewClusterServiceClient(s.peers, s.cfg.TLS.scheme()+"://"+addr).Status(ctx, req)
	if err != nil {
		return "unreachable", ""
	}
	if resp.Msg.NodeId != id {
		return "unreachable", "" // someone else answers at that address
	}
	for _, n := range resp.Msg.Nodes {
		if n.Id == id {
			return n.State, n.Version
		}
	}
	return "unknown", ""
}

// AddNode implements fence.v1.ClusterService.AddNode. It runs on the leader
// (followers forward it).
func (c cluster) AddNode(ctx context.Context, req *connect.Request[fencev1.AddNodeRequest]) (*connect.Response[fencev1.AddNodeResponse], error) {
	m := req.Msg
	if err := fsm.ValidateNodeID(m.Id); err != nil {
		return nil, wire.ToConnect(err)
	}
	for field, a := range map[string]string{"raft_addr": m.RaftAddr, "api_addr": m.ApiAddr} {
		if err := validateHostPort(field, a); err != nil {
			return nil, wire.ToConnect(err)
		}
	}
	if err := c.s.checkReady(); err != nil {
		return nil, wire.ToConnect(err)
	}
	if err := c.s.checkMove(ctx, m); err != nil {
		return nil, wire.ToConnect(err)
	}
	if err := c.s.node.AddVoter(ctx, m.Id, m.RaftAddr, m.ApiAddr); err != nil {
		return nil, wire.ToConnect(err)
	}
	c.s.log.Info("node added", "node_id", m.Id, "raft_addr", m.RaftAddr, "api_addr", m.ApiAddr)
	st, err := c.s.node.Status()
	if err != nil {
		return nil, wire.ToConnect(err)
	}
	return connect.NewResponse(&fencev1.AddNodeResponse{Nodes: c.s.nodes(st)}), nil
}

// checkMove refuses to add a member again at other addresses, unless the
// node itself asks, authenticated as that node, or an operator asks to
// replace it. Followers forward every call to the leader at the API
// address recorded for it, and the Raft address is where a voter's log and
// votes come from: an AddNode of an existing ID that rewrote them (a
// member passes the reachability check) let anyone with auth off, or any
// operator or node allowed "cluster", point the followers at a proxy and
// read the lease IDs of forwarded acquires and renewals, or cut them off.
// A node's addresses come from the node: the leader records its own on
// taking office, and a member that moved rejoins under its own
// certificate. Otherwise only an explicit replace moves it: by whoever
// may do "cluster" (anyone, with auth off) but another node. Adding a
// member again at its addresses changes nothing and is allowed, as a
// restart's join does.
func (s *Server) checkMove(ctx context.Context, m *fencev1.AddNodeRequest) error {
	st, err := s.node.Status()
	if err != nil {
		return err
	}
	for _, sv := range st.Servers {
		if sv.ID != m.Id && sv.RaftAddr == m.RaftAddr {
			// Raft refuses it only after the API address is recorded.
			return &fence.InvalidError{Field: "raft_addr", Reason: fmt.Sprintf("%s is the Raft address of member %q", m.RaftAddr, sv.ID)}
		}
	}
	i := slices.IndexFunc(st.Servers, func(sv raftnode.Server) bool { return sv.ID == m.Id })
	if i < 0 {
		if m.Replace {
			return &fence.InvalidError{Field: "replace", Reason: fmt.Sprintf(
				"%q is not a member, so there is nothing to replace; add it without replace", m.Id)}
		}
		return nil // a new member
	}
	var api string
	s.node.Read(func(fs *fsm.State) { api = fs.Nodes()[m.Id] })
	if st.Servers[i].RaftAddr == m.RaftAddr && api == m.ApiAddr {
		return nil
	}
	id := authz.Identity(ctx)
	if id == m.Id && s.auth.IsNode(id) {
		return nil // the node itself, moved
	}
	if m.Replace && s.auth.IsNode(id) {
		return &fence.InvalidError{Field: "replace", Reason: fmt.Sprintf(
			"node %q may not replace %q: replacing a member is an operator's call, and a node moves only itself", id, m.Id)}
	}
	if m.Replace {
		s.log.Warn("replacing a node's addresses", "node_id", m.Id, "by", id,
			"raft_addr_was", st.Servers[i].RaftAddr, "api_addr_was", api, "raft_addr", m.RaftAddr, "api_addr", m.ApiAddr)
		return nil
	}
	return &fence.InvalidError{Field: "id", Reason: fmt.Sprintf(
		"%q is a member with Raft address %s and API address %q; only that node changes them, when it joins again authenticated as itself (auth on, its certificate of the cluster CA), or an operator replacing it (fencectl cluster add --replace)",
		m.Id, st.Servers[i].RaftAddr, api)}
}

// RemoveNode implements fence.v1.ClusterService.RemoveNode.
func (c cluster) RemoveNode(ctx context.Context, req *connect.Request[fencev1.RemoveNodeRequest]) (*connect.Response[fencev1.RemoveNodeResponse], error) {
	id := req.Msg.Id
	if err := fsm.ValidateNodeID(id); err != nil {
		return nil, wire.ToConnect(err)
	}
	if err := c.s.checkReady(); err != nil {
		return nil, wire.ToConnect(err)
	}
	st, err := c.s.node.Status()
	if err != nil {
		return nil, wire.ToConnect(err)
	}
	if !slices.ContainsFunc(st.Servers, func(sv raftnode.Server) bool { return sv.ID == id }) {
		return nil, wire.ToConnect(&fence.InvalidError{Field: "node_id", Reason: fmt.Sprintf("%q is not a member of the cluster", id)})
	}
	if len(st.Servers) == 1 {
		return nil, wire.ToConnect(&fence.InvalidError{Field: "node_id", Reason: fmt.Sprintf("%q is the only member; a cluster cannot remove its last node", id)})
	}
	if err := c.s.node.RemoveServer(ctx, id); err != nil {
		return nil, wire.ToConnect(err)
	}
	c.s.log.Info("node removed", "node_id", id)
	if st, err = c.s.node.Status(); err != nil {
		return nil, wire.ToConnect(err)
	}
	return connect.NewResponse(&fencev1.RemoveNodeResponse{Nodes: c.s.nodes(st)}), nil
}

func validateHostPort(field, a string) error {
	host, port, err := net.SplitHostPort(a)
	if err != nil || host == "" || port == "" || port == "0" {
		return &fence.InvalidError{Field: field, Reason: fmt.Sprintf("%q is not host:port", a)}
	}
	return nil
}

// join asks the cluster at cfg.Join to add this node, trying each address
// in turn until one answers. A refusal (a removed ID, a bad address) is
// final and stops the server.
func (s *Server) join(ctx context.Context) {
	req := &fencev1.AddNodeRequest{Id: s.cfg.NodeID, RaftAddr: s.node.RaftAddr(), ApiAddr: s.advertise()}
	for attempt, backoff := 0, 200*time.Millisecond; ; attempt, backoff = attempt+1, min(2*backoff, 5*time.Second) {
		addr := s.cfg.Join[attempt%len(s.cfg.Join)]
		actx, cancel := context.WithTimeout(ctx, 30*time.Second)
		_, err := fencev1connect.NewClusterServiceClient(s.peers, s.cfg.TLS.scheme()+"://"+addr).AddNode(actx, connect.NewRequest(req))
		cancel()
		if err == nil {
			s.log.Info("joined the cluster", "via", addr)
			return
		}
		if connect.CodeOf(err) == connect.CodeInvalidArgument {
			s.fatal(fmt.Errorf("the cluster at %s refused to add this node: %w", addr, wire.FromConnect(err)))
			return
		}
		if ctx.Err() != nil {
			return
		}
		s.log.Warn("joining the cluster; will retry", "via", addr, "err", err, "retry_in", backoff)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
	}
}

func (s *Server) fatal(err error) {
	select {
	case s.failed <- err:
	default:
	}
}
