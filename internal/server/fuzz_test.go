package server_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/fence-dev/fence"
	fencev1 "github.com/fence-dev/fence/api/fence/v1"
	"github.com/fence-dev/fence/api/fence/v1/fencev1connect"
	"github.com/fence-dev/fence/internal/server"
)

// rpc is one method of the API, as a raw HTTP client reaches it.
type rpc struct {
	path      string // "/fence.v1.LeaseService/Acquire"
	desc      protoreflect.MethodDescriptor
	streaming bool
}

// rpcs lists every method of every service the server serves, from the
// descriptors, so that a method added to the API is fuzzed without
// touching this file.
func rpcs() []rpc {
	var out []rpc
	for _, fd := range []protoreflect.FileDescriptor{fencev1.File_fence_v1_fence_proto, fencev1.File_fence_v1_cluster_proto} {
		for i := range fd.Services().Len() {
			sd := fd.Services().Get(i)
			for j := range sd.Methods().Len() {
				md := sd.Methods().Get(j)
				out = append(out, rpc{
					path:      "/" + string(sd.FullName()) + "/" + string(md.Name()),
					desc:      md,
					streaming: md.IsStreamingClient() || md.IsStreamingServer(),
				})
			}
		}
	}
	return out
}

// startServer starts a one-node fenced for a test. TTLs are at least an
// hour, so that no lease the test makes expires while it runs and every
// change of state is one a request made.
func startServer(tb testing.TB) *server.Server {
	tb.Helper()
	cfg := server.DefaultConfig()
	cfg.DataDir = tb.TempDir()
	cfg.Listen = "127.0.0.1:0"
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg.MinTTL, cfg.DefaultTTL, cfg.MaxTTL = time.Hour, time.Hour, 24*time.Hour
	srv, err := server.Start(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		srv.Close(ctx)
	})
	for deadline := time.Now().Add(30 * time.Second); !srv.Ready(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			tb.Fatal("the server did not become leader within 30s")
		}
	}
	return srv
}

// rawClient posts arbitrary bodies to a server, as curl would.
type rawClient struct {
	base string
	hc   *http.Client
}

func newRawClient(tb testing.TB, addr string) *rawClient {
	hc := &http.Client{Timeout: time.Minute}
	tb.Cleanup(hc.CloseIdleConnections)
	return &rawClient{base: "http://" + addr, hc: hc}
}

// answer is what the server said to one request.
type answer struct {
	status int
	code   string // the Connect error code; "" on success
	msg    string
	body   []byte // a unary success's body
	proto  bool   // body is binary protobuf, not JSON
}

// post sends body to m, as JSON or binary protobuf, with a short Connect
// timeout so that an acquire that waits in line ends. A streaming method's
// body goes in one Connect envelope; its answer is the end-of-stream
// error, if any.
func (c *rawClient) post(tb testing.TB, m rpc, asProto bool, body []byte) answer {
	tb.Helper()
	ct := "application/json"
	if asProto {
		ct = "application/proto"
	}
	if m.streaming {
		ct = strings.Replace(ct, "application/", "application/connect+", 1)
		env := make([]byte, 5, 5+len(body))
		binary.BigEndian.PutUint32(env[1:], uint32(len(body)))
		body = append(env, body...)
	}
	req, err := http.NewRequest(http.MethodPost, c.base+m.path, bytes.NewReader(body))
	if err != nil {
		tb.Fatal(err)
	}
	req.Header.Set("Content-Type", ct)
	req.Header.Set("Connect-Timeout-Ms", "500")
	resp, err := c.hc.Do(req)
	if err != nil {
		tb.Fatalf("%s: %v", m.path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		tb.Fatalf("%s: read the answer: %v", m.path, err)
	}
	a := answer{status: resp.StatusCode, proto: asProto}
	var e struct {
		Code    string `json:"code"`
		Message string `json:"message"`
		Error   *struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	switch {
	case m.streaming && resp.StatusCode == http.StatusOK:
		// Envelopes; the last one (flag 2) ends the stream.
		for len(b) >= 5 {
			n := int(binary.BigEndian.Uint32(b[1:5]))
			if len(b) < 5+n {
				tb.Fatalf("%s: a truncated envelope in %q", m.path, b)
			}
			if b[0]&2 != 0 {
				if err := json.Unmarshal(b[5:5+n], &e); err != nil {
					tb.Fatalf("%s: end of stream %q: %v", m.path, b[5:5+n], err)
				}
				if e.Error != nil {
					a.code, a.msg = e.Error.Code, e.Error.Message
				}
			}
			b = b[5+n:]
		}
	case resp.StatusCode == http.StatusOK:
		a.body = b
	default:
		if err := json.Unmarshal(b, &e); err != nil || e.Code == "" {
			tb.Fatalf("%s: HTTP %d with a body that is no Connect error: %q", m.path, resp.StatusCode, b)
		}
		a.code, a.msg = e.Code, e.Message
	}
	return a
}

// badCodes are the answers no request, however malformed, may get from a
// healthy one-node server: they would mean a bug, or that the request broke
// the server.
var badCodes = map[string]bool{
	"internal": true, "unknown": true, "data_loss": true, "unavailable": true, "unimplemented": true,
}

// checkAnswer checks that a is a proper answer to a request of m.
func checkAnswer(tb testing.TB, m rpc, a answer) {
	tb.Helper()
	if a.status >= 500 && a.code != "deadline_exceeded" {
		tb.Fatalf("%s: HTTP %d (%s: %s)", m.path, a.status, a.code, a.msg)
	}
	if badCodes[a.code] {
		tb.Fatalf("%s: answered %s: %s", m.path, a.code, a.msg)
	}
	if a.code == "" && !m.streaming {
		out := dynamicpb.NewMessage(m.desc.Output())
		unmarshal := protojson.Unmarshal
		if a.proto {
			unmarshal = proto.Unmarshal
		}
		if err := unmarshal(a.body, out); err != nil {
			tb.Fatalf("%s: a success whose body does not decode: %v\n%s", m.path, err, a.body)
		}
	}
}

// snapshot is what the API reports of the state that a request could
// change: every held lease, the counter, waiters and lease of the named
// scopes, and the cluster's members. Times left are left out: they change
// by themselves.
type snapshot struct {
	Leases  []string
	Scopes  []string
	Members []string
}

type inspector struct {
	leases  fencev1connect.LeaseServiceClient
	cluster fencev1connect.ClusterServiceClient
}

func newInspector(tb testing.TB, addr string) *inspector {
	hc := &http.Client{Timeout: time.Minute}
	tb.Cleanup(hc.CloseIdleConnections)
	return &inspector{
		leases:  fencev1connect.NewLeaseServiceClient(hc, "http://"+addr),
		cluster: fencev1connect.NewClusterServiceClient(hc, "http://"+addr),
	}
}

func leaseString(l *fencev1.Lease) string {
	if l == nil {
		return "free"
	}
	return fmt.Sprintf("%s token %d id %q holder %q ttl %v", l.Scope, l.Token, l.LeaseId, l.Holder, l.Ttl.AsDuration())
}

// snapshot reads the state; scopes are the scopes to Get besides the
// listed ones (invalid names are skipped).
func (in *inspector) snapshot(tb testing.TB, scopes ...string) snapshot {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var s snapshot
	for page := ""; ; {
		r, err := in.leases.List(ctx, connect.NewRequest(&fencev1.ListRequest{PageToken: page}))
		if err != nil {
			tb.Fatalf("List: %v", err)
		}
		for _, l := range r.Msg.Leases {
			s.Leases = append(s.Leases, leaseString(l))
			scopes = append(scopes, l.Scope)
		}
		if page = r.Msg.NextPageToken; page == "" {
			break
		}
	}
	for _, sc := range scopes {
		if fence.ValidateScope(sc) != nil {
			continue
		}
		r, err := in.leases.Get(ctx, connect.NewRequest(&fencev1.GetRequest{Scope: sc}))
		if err != nil {
			tb.Fatalf("Get %q: %v", sc, err)
		}
		s.Scopes = append(s.Scopes, fmt.Sprintf("%s last %d waiters %d lease %s", r.Msg.Scope, r.Msg.LastToken, r.Msg.Waiters, leaseString(r.Msg.Lease)))
	}
	st, err := in.cluster.Status(ctx, connect.NewRequest(&fencev1.StatusRequest{}))
	if err != nil {
		tb.Fatalf("Status: %v", err)
	}
	for _, n := range st.Msg.Nodes {
		s.Members = append(s.Members, fmt.Sprintf("%s api %s raft %s voter %v", n.Id, n.ApiAddr, n.RaftAddr, n.Voter))
	}
	return s
}

// seed gives the server something a request could change: a held scope
// whose acquire had a request ID, and a released one with a counter.
func (in *inspector) seed(tb testing.TB) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := in.leases.Acquire(ctx, connect.NewRequest(&fencev1.AcquireRequest{Scope: "held", Holder: "seed-holder", RequestId: "seed-request"})); err != nil {
		tb.Fatal(err)
	}
	r, err := in.leases.Acquire(ctx, connect.NewRequest(&fencev1.AcquireRequest{Scope: "released", Holder: "seed-holder"}))
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := in.leases.Release(ctx, connect.NewRequest(&fencev1.ReleaseRequest{Scope: "released", LeaseId: r.Msg.Lease.LeaseId})); err != nil {
		tb.Fatal(err)
	}
}

// scopeOf returns the scope a request body names, if it decodes.
func scopeOf(m rpc, asProto bool, body []byte) string {
	msg := dynamicpb.NewMessage(m.desc.Input())
	var err error
	if asProto {
		err = proto.Unmarshal(body, msg)
	} else {
		err = protojson.UnmarshalOptions{DiscardUnknown: true}.Unmarshal(body, msg)
	}
	f := m.desc.Input().Fields().ByName("scope")
	if err != nil || f == nil {
		return ""
	}
	return msg.Get(f).String()
}

// fuzzSeeds are request bodies worth starting from, by method name.
var fuzzSeeds = map[string][]string{
	"Acquire": {
		`{"scope":"fuzz","holder":"h","ttl":"3600s"}`,
		`{"scope":"held","holder":"other"}`,
		`{"scope":"held","holder":"other","wait":true}`,
		`{"scope":"held","holder":"intruder","request_id":"seed-request"}`,
		`{"scope":"held","holder":"seed-holder","request_id":"seed-request"}`,
		`{"scope":"x","ttl":"315576000001s"}`,
		`{"scope":"x","ttl":"1.999999999s"}`,
		`{"scope":"x","ttl":"-1s"}`,
		`{"scope":"x","ttl":"0s"}`,
		`{"scope":"x","ttl":{"seconds":"1","nanos":2000000000}}`,
		`{"scope":"../x"}`, `{"scope":""}`, `{"scope":"a\u0000b"}`, `{"scope":1e309}`,
		`{"scope":"x","request_id":"` + strings.Repeat("r", 65) + `"}`,
	},
	"Renew": {`{"scope":"held","lease_id":"00000000000000000000000000000001"}`, `{"scope":"held","lease_id":"zz"}`, `{"scope":"held"}`},
	"RenewBatch": {
		`{"renewals":[{"scope":"held","lease_id":"00000000000000000000000000000001"},{"scope":"never","lease_id":"00000000000000000000000000000002"}]}`,
		`{"renewals":[]}`, `{"renewals":[{"scope":"held"}]}`, `{"renewals":[{}]}`,
	},
	"Release": {`{"scope":"held","lease_id":"00000000000000000000000000000001"}`, `{"scope":"held","lease_id":"` + strings.Repeat("f", 33) + `"}`},
	"Get":     {`{"scope":"held"}`, `{"scope":"never"}`, `{"scope":"a//b"}`, `{}`},
	"List":    {`{}`, `{"prefix":"he","page_size":1}`, `{"page_size":1001}`, `{"page_token":"!!"}`, `{"page_token":"Li4"}`},
	"Watch":   {`{}`, `{"prefix":"held","include_held":true}`, `{"start_position":"18446744073709551615"}`},
	"Status":  {`{}`},
	"AddNode": {
		`{"id":"n2","raft_addr":"127.0.0.1:1","api_addr":"127.0.0.1:2"}`,
		`{"id":"n1","raft_addr":"127.0.0.1:1","api_addr":"127.0.0.1:2"}`,
		`{"id":"../n","raft_addr":"x","api_addr":"y"}`,
	},
	"RemoveNode": {`{"id":"n1"}`, `{"id":"n2"}`, `{"id":""}`},
}

// FuzzRequest sends arbitrary bodies, as JSON and as binary protobuf, to
// every method of a real server. Each answer is a success or a proper
// error (never internal, unknown or a 5xx), a healthy server stays healthy,
// and an error changes nothing that List, Get and Status can see.
func FuzzRequest(f *testing.F) {
	methods := rpcs()
	for i, m := range methods {
		for _, s := range fuzzSeeds[string(m.desc.Name())] {
			f.Add(uint8(i), false, []byte(s))
			msg := dynamicpb.NewMessage(m.desc.Input())
			if protojson.Unmarshal([]byte(s), msg) == nil {
				if b, err := proto.Marshal(msg); err == nil {
					f.Add(uint8(i), true, b)
				}
			}
		}
		f.Add(uint8(i), true, []byte{0x0a, 0x80, 0x80, 0x80, 0x80, 0x10}) // a length beyond the body
		f.Add(uint8(i), false, []byte(`{"scope":"held"`))
		f.Add(uint8(i), false, []byte("\xff\xfe"))
	}
	srv := startServer(f)
	raw := newRawClient(f, srv.Addr())
	in := newInspector(f, srv.Addr())
	in.seed(f)
	f.Fuzz(func(t *testing.T, method uint8, asProto bool, body []byte) {
		m := methods[int(method)%len(methods)]
		scope := scopeOf(m, asProto, body)
		before := in.snapshot(t, "held", "released", scope)
		a := raw.post(t, m, asProto, body)
		checkAnswer(t, m, a)
		if !srv.Ready() {
			t.Fatalf("%s %q: the server is no longer ready", m.path, body)
		}
		// A request that timed out may have been applied; any other error
		// must have changed nothing.
		if a.code == "" || a.code == "deadline_exceeded" || a.code == "canceled" {
			return
		}
		if diff := cmp.Diff(before, in.snapshot(t, "held", "released", scope)); diff != "" {
			t.Fatalf("%s %q answered %s (%s) but changed the state (-before +after):\n%s", m.path, body, a.code, a.msg, diff)
		}
	})
}

// TestRPCsAreFuzzed keeps FuzzRequest's method list honest: it must find
// the methods of both services.
func TestRPCsAreFuzzed(t *testing.T) {
	var names []string
	for _, m := range rpcs() {
		names = append(names, m.path)
	}
	for _, want := range []string{fencev1connect.LeaseServiceAcquireProcedure, fencev1connect.ClusterServiceAddNodeProcedure} {
		if !strings.Contains(strings.Join(names, " "), want) {
			t.Errorf("rpcs() = %v, missing %s", names, want)
		}
	}
	if len(names) > 255 {
		t.Errorf("%d methods; FuzzRequest picks one with a uint8", len(names))
	}
}
