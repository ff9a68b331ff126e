package grpcguard_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/client"
	"github.com/fence-dev/fence/fencetest"
	"github.com/fence-dev/fence/guard"
	"github.com/fence-dev/fence/guard/grpcguard"
)

// TestMain checks that the gRPC servers, connections and leases of the
// tests leave no goroutine behind.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	unaryMethod  = "/grpc.testing.TestService/UnaryCall"
	streamMethod = "/grpc.testing.TestService/StreamingInputCall"
	scopeKey     = "x-scope"
)

// scopeOf fences UnaryCall and StreamingInputCall in the scope the call
// names in its x-scope metadata, "orders" if it names none; the other
// methods pass unchecked.
func scopeOf(ctx context.Context, method string) (string, bool) {
	if method != unaryMethod && method != streamMethod {
		return "", false
	}
	if s := metadata.ValueFromIncomingContext(ctx, scopeKey); len(s) == 1 {
		return s[0], true
	}
	return "orders", true
}

// register is a tiny guarded resource behind gRPC's own test service: the
// last write per scope, and the log of applied tokens.
type register struct {
	testgrpc.UnimplementedTestServiceServer
	mu    sync.Mutex
	value map[string]string
	log   map[string][]uint64
	calls atomic.Int64 // handler runs, fenced or not
}

// Bodies the unary handler answers with an error instead of writing.
const (
	denyBody = "deny"
	// A stale rejection of another lease's token, as a service that
	// writes downstream under its own lease might pass on.
	downstreamStaleBody = "downstream stale"
)

func (r *register) UnaryCall(ctx context.Context, req *testgrpc.SimpleRequest) (*testgrpc.SimpleResponse, error) {
	r.calls.Add(1)
	switch body := string(req.GetPayload().GetBody()); body {
	case denyBody:
		return nil, status.Error(codes.PermissionDenied, "denied by the handler")
	case downstreamStaleBody:
		st, err := status.New(codes.FailedPrecondition, "downstream write refused").WithDetails(&errdetails.ErrorInfo{
			Reason: grpcguard.StaleReason, Domain: grpcguard.Domain,
			Metadata: map[string]string{"scope": "billing", "presented_token": "3", "highest_token": "4"},
		})
		if err != nil {
			return nil, err
		}
		return nil, st.Err()
	default:
		r.put(ctx, body)
	}
	return &testgrpc.SimpleResponse{}, nil
}

func (r *register) StreamingInputCall(stream grpc.ClientStreamingServer[testgrpc.StreamingInputCallRequest, testgrpc.StreamingInputCallResponse]) error {
	r.calls.Add(1)
	var n int32
	for {
		req, err := stream.Recv()
		if err == io.EOF {
			return stream.SendAndClose(&testgrpc.StreamingInputCallResponse{AggregatedPayloadSize: n})
		}
		if err != nil {
			return err
		}
		r.put(stream.Context(), string(req.GetPayload().GetBody()))
		n++
	}
}

func (r *register) EmptyCall(context.Context, *testgrpc.Empty) (*testgrpc.Empty, error) {
	r.calls.Add(1)
	return &testgrpc.Empty{}, nil
}

func (r *register) put(ctx context.Context, body string) {
	// Yield between the guard's check and the write, as a handler doing
	// I/O would: a guard that did not hold the scope across both would
	// let newer writes in here.
	runtime.Gosched()
	scope, _ := scopeOf(ctx, unaryMethod)
	tok, _ := fence.ParseToken(metadata.ValueFromIncomingContext(ctx, grpcguard.TokenKey)[0])
	r.mu.Lock()
	defer r.mu.Unlock()
	r.value[scope] = body
	r.log[scope] = append(r.log[scope], tok.Value)
}

func (r *register) get(scope string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.value[scope]
}

// counter is a guard.Observer.
type counter struct{ accepted, rejected atomic.Int64 }

func (c *counter) Accepted(string)            { c.accepted.Add(1) }
func (c *counter) Rejected(*guard.StaleError) { c.rejected.Add(1) }

// mustUnary is grpcguard.UnaryServerInterceptor for a test, which fails
// if it does.
func mustUnary(t testing.TB, g *guard.Guard, scope grpcguard.ScopeFunc, opts ...grpcguard.Option) grpc.UnaryServerInterceptor {
	t.Helper()
	i, err := grpcguard.UnaryServerInterceptor(g, scope, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return i
}

// mustStream is grpcguard.StreamServerInterceptor for a test, which fails
// if it does.
func mustStream(t testing.TB, g *guard.Guard, scope grpcguard.ScopeFunc, opts ...grpcguard.Option) grpc.StreamServerInterceptor {
	t.Helper()
	i, err := grpcguard.StreamServerInterceptor(g, scope, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return i
}

// newServer serves a register fenced by a fresh guard on loopback and
// returns its address.
func newServer(t testing.TB) (string, *register, *counter) {
	t.Helper()
	reg := &register{value: map[string]string{}, log: map[string][]uint64{}}
	obs := &counter{}
	g := guard.New(guard.NewMemoryStore(), guard.WithObserver(obs), guard.WithLogger(slog.New(slog.DiscardHandler)))
	srv := grpc.NewServer(
		grpc.ChainUnaryInterceptor(mustUnary(t, g, scopeOf)),
		grpc.ChainStreamInterceptor(mustStream(t, g, scopeOf)),
	)
	testgrpc.RegisterTestServiceServer(srv, reg)
	return serve(t, srv), reg, obs
}

// serveUnary serves svc on loopback with g fencing its UnaryCall in the
// scope "orders", and returns a client of it.
func serveUnary(t testing.TB, g *guard.Guard, svc testgrpc.TestServiceServer, opts ...grpcguard.Option) testgrpc.TestServiceClient {
	t.Helper()
	srv := grpc.NewServer(grpc.UnaryInterceptor(mustUnary(t, g, grpcguard.Methods("orders", unaryMethod), opts...)))
	testgrpc.RegisterTestServiceServer(srv, svc)
	return dial(t, serve(t, srv))
}

// serve serves srv on loopback until the test ends and returns its
// address.
func serve(t testing.TB, srv *grpc.Server) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	return lis.Addr().String()
}

func dial(t testing.TB, addr string, opts ...grpc.DialOption) testgrpc.TestServiceClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return testgrpc.NewTestServiceClient(conn)
}

// dialLease dials with the client interceptors presenting l's token.
func dialLease(t testing.TB, addr string, l grpcguard.Lease) testgrpc.TestServiceClient {
	return dial(t, addr,
		grpc.WithUnaryInterceptor(grpcguard.UnaryClientInterceptor(l)),
		grpc.WithStreamInterceptor(grpcguard.StreamClientInterceptor(l)))
}

// withToken returns a context whose calls present the token of scope with
// value v, and name scope in x-scope.
func withToken(scope string, v uint64) context.Context {
	return metadata.AppendToOutgoingContext(context.Background(),
		grpcguard.TokenKey, fence.Token{Scope: scope, Value: v}.String(), scopeKey, scope)
}

func payload(body string) *testgrpc.Payload { return &testgrpc.Payload{Body: []byte(body)} }

// put writes body with a unary call.
func put(ctx context.Context, c testgrpc.TestServiceClient, body string) error {
	_, err := c.UnaryCall(ctx, &testgrpc.SimpleRequest{Payload: payload(body)})
	return err
}

// putStream writes bodies with one client stream.
func putStream(ctx context.Context, c testgrpc.TestServiceClient, bodies ...string) error {
	s, err := c.StreamingInputCall(ctx)
	if err != nil {
		return err
	}
	for _, b := range bodies {
		err := s.Send(&testgrpc.StreamingInputCallRequest{Payload: payload(b)})
		if err == io.EOF {
			break // the server ended the stream; CloseAndRecv tells why
		}
		if err != nil {
			return err
		}
	}
	_, err = s.CloseAndRecv()
	return err
}

// writers are the two ways a test writes: one unary call, or a stream of
// the body twice.
var writers = []struct {
	name  string
	write func(ctx context.Context, c testgrpc.TestServiceClient, body string) error
}{
	{"unary", put},
	{"stream", func(ctx context.Context, c testgrpc.TestServiceClient, body string) error {
		return putStream(ctx, c, body, body)
	}},
}

// detail returns the only detail of err's status, which must be a T.
func detail[T any](t *testing.T, err error) T {
	t.Helper()
	ds := status.Convert(err).Details()
	if len(ds) != 1 {
		t.Fatalf("%v: %d details, want 1", err, len(ds))
	}
	d, ok := ds[0].(T)
	if !ok {
		t.Fatalf("%v: detail %T, want %T", err, ds[0], d)
	}
	return d
}

func TestServerAnswers(t *testing.T) {
	for _, w := range writers {
		t.Run(w.name, func(t *testing.T) {
			addr, reg, obs := newServer(t)
			c := dial(t, addr)
			if err := w.write(withToken("orders", 42), c, "B"); err != nil {
				t.Fatalf("token 42: %v", err)
			}

			err := w.write(withToken("orders", 41), c, "A")
			if st := status.Convert(err); st.Code() != codes.FailedPrecondition || st.Message() != `stale fencing token for "orders": token 41 was superseded by token 42` {
				t.Fatalf("token 41 after 42: %v, want FailedPrecondition naming both tokens", err)
			}
			want := &errdetails.ErrorInfo{Reason: "STALE_FENCING_TOKEN", Domain: "fence.dev", Metadata: map[string]string{
				"scope": "orders", "presented_token": "41", "highest_token": "42",
			}}
			if diff := cmp.Diff(want, detail[*errdetails.ErrorInfo](t, err), protocmp.Transform()); diff != "" {
				t.Fatalf("stale detail (-want +got):\n%s", diff)
			}
			if stale, ok := grpcguard.FromError(err); !ok || *stale != (guard.StaleError{Scope: "orders", Presented: 41, Highest: 42}) {
				t.Fatalf("FromError: %+v %v", stale, ok)
			}
			if got := reg.get("orders"); got != "B" {
				t.Fatalf("stored %q, want B's write", got)
			}
			if obs.accepted.Load() != 1 || obs.rejected.Load() != 1 {
				t.Fatalf("observer counted %d accepted, %d rejected; want 1 and 1", obs.accepted.Load(), obs.rejected.Load())
			}

			for _, tc := range []struct {
				name, field, reason string
				md                  []string
			}{
				{"missing", "fencing-token", "missing fencing-token metadata", nil},
				{"malformed", "fencing-token", `"41" is not a fence token`, []string{"fencing-token", "41"}},
				{"zero", "fencing-token", `"0" must be from 1`, []string{"fencing-token", "fence:v1:orders:0"}},
				{"another scope", "fencing-token", "token is for another scope", []string{"fencing-token", "fence:v1:billing:99"}},
				{"two tokens", "fencing-token", "2 fencing-token metadata values", []string{"fencing-token", "fence:v1:orders:43", "fencing-token", "fence:v1:orders:44"}},
				{"bad sequence", "fencing-sequence", "want one decimal integer", []string{"fencing-token", "fence:v1:orders:43", "fencing-sequence", "x"}},
			} {
				before := reg.calls.Load()
				err := w.write(metadata.AppendToOutgoingContext(context.Background(), tc.md...), c, "X")
				st := status.Convert(err)
				if st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), tc.reason) {
					t.Errorf("%s: %v, want InvalidArgument saying %q", tc.name, err, tc.reason)
					continue
				}
				want := &errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: tc.field, Description: st.Message()}}}
				if diff := cmp.Diff(want, detail[*errdetails.BadRequest](t, err), protocmp.Transform()); diff != "" {
					t.Errorf("%s: detail (-want +got):\n%s", tc.name, diff)
				}
				if reg.calls.Load() != before {
					t.Errorf("%s: the handler ran", tc.name)
				}
			}
			if got := reg.get("orders"); got != "B" {
				t.Fatalf("stored %q, want B's write", got)
			}
		})
	}
}

// TestServerHandlerAnswers checks that a fenced handler's own error
// reaches the client unchanged and still records the token, and that
// methods the ScopeFunc does not fence pass without a token.
func TestServerHandlerAnswers(t *testing.T) {
	addr, _, _ := newServer(t)
	c := dial(t, addr)
	err := put(withToken("orders", 50), c, denyBody)
	if st := status.Convert(err); st.Code() != codes.PermissionDenied || st.Message() != "denied by the handler" || len(st.Details()) != 0 {
		t.Fatalf("handler error: %v, want the handler's PermissionDenied unchanged", err)
	}
	err = put(withToken("orders", 45), c, "X")
	if stale, ok := grpcguard.FromError(err); !ok || stale.Highest != 50 {
		t.Fatalf("token 45 after the handler failed under 50: %v, want stale with highest 50", err)
	}
	if _, err := c.EmptyCall(context.Background(), &testgrpc.Empty{}); err != nil {
		t.Fatalf("unfenced method without a token: %v", err)
	}
}

// TestServerSequence checks that a rejection by sequence number carries
// the sequences in its detail, back to a *guard.StaleError.
func TestServerSequence(t *testing.T) {
	addr, _, _ := newServer(t)
	c := dial(t, addr)
	withSeq := func(seq string) context.Context {
		return metadata.AppendToOutgoingContext(withToken("orders", 42), grpcguard.SequenceKey, seq)
	}
	if err := put(withSeq("5"), c, "B"); err != nil {
		t.Fatal(err)
	}
	err := put(withSeq("3"), c, "A")
	want := &guard.StaleError{Scope: "orders", Presented: 42, Highest: 42, PresentedSeq: 3, HighestSeq: 5}
	if stale, ok := grpcguard.FromError(err); !ok || *stale != *want {
		t.Fatalf("sequence 3 after 5: FromError(%v) = %+v, %v; want %+v", err, stale, ok, want)
	}
	if status.Convert(err).Message() != want.Error() {
		t.Fatalf("message %q, want %q", status.Convert(err).Message(), want.Error())
	}
}

// newFence starts an in-process fenced and returns a client of it.
func newFence(t *testing.T) *client.Client {
	t.Helper()
	fs := fencetest.NewServer()
	t.Cleanup(fs.Close)
	fc := fs.Client()
	t.Cleanup(func() { fc.Close() })
	return fc
}

// supersede acquires scope as A, releases A's lease behind its back (as
// expiry would) and acquires it as B, with a greater token.
func supersede(t *testing.T, c *client.Client, scope string) (a, b *client.Lease) {
	t.Helper()
	ctx := context.Background()
	a, err := c.Acquire(ctx, scope, client.WithTTL(5*time.Second), client.WithHolder("A"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Release(ctx) })
	if _, err := c.Release(ctx, scope, a.ID()); err != nil {
		t.Fatal(err)
	}
	b, err = c.Acquire(ctx, scope, client.WithHolder("B"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Release(ctx) })
	if b.Token().Value <= a.Token().Value {
		t.Fatalf("B's token %d is not above A's %d", b.Token().Value, a.Token().Value)
	}
	return a, b
}

// checkLost checks that err is the stale rejection of a's token under
// b's, and that a is lost because of it.
func checkLost(t *testing.T, err error, a, b *client.Lease) {
	t.Helper()
	if status.Code(err) != codes.FailedPrecondition || !errors.Is(err, fence.ErrStale) {
		t.Fatalf("A's stale write: %v, want FailedPrecondition matching fence.ErrStale", err)
	}
	var stale *guard.StaleError
	want := guard.StaleError{Scope: a.Scope(), Presented: a.Token().Value, Highest: b.Token().Value}
	if !errors.As(err, &stale) || *stale != want {
		t.Fatalf("A's stale write: %v reads as %+v, want %+v", err, stale, want)
	}
	select {
	case <-a.Done():
	default:
		t.Fatal("A's lease did not report itself lost after a stale rejection")
	}
	if !errors.Is(a.Err(), fence.ErrLeaseLost) || !strings.Contains(a.Err().Error(), "superseded") {
		t.Fatalf("A's lease error %v, want lost because superseded", a.Err())
	}
	if b.Err() != nil {
		t.Fatalf("B's lease ended: %v", b.Err())
	}
}

// TestClientMarksLeaseLost plays the source text's story with a real
// fenced: A's lease is superseded by B's, B writes, A's late write is
// refused, A's lease reports itself lost, and A's next calls are not even
// sent; unary calls on one scope, streams on another.
func TestClientMarksLeaseLost(t *testing.T) {
	fc := newFence(t)
	addr, reg, _ := newServer(t)

	for _, w := range writers {
		t.Run(w.name, func(t *testing.T) {
			scope := "orders/" + w.name
			a, b := supersede(t, fc, scope)
			ca, cb := dialLease(t, addr, a), dialLease(t, addr, b)
			ctx := metadata.AppendToOutgoingContext(context.Background(), scopeKey, scope)

			if err := w.write(ctx, cb, "B"); err != nil {
				t.Fatalf("B's write: %v", err)
			}
			checkLost(t, w.write(ctx, ca, "A"), a, b)

			calls := reg.calls.Load()
			for _, again := range writers {
				err := again.write(ctx, ca, "A again")
				if !errors.Is(err, fence.ErrLeaseLost) || status.Code(err) != codes.FailedPrecondition {
					t.Fatalf("A's next %s write: %v, want a lost-lease FailedPrecondition without sending", again.name, err)
				}
			}
			if reg.calls.Load() != calls {
				t.Fatal("a call was sent with a lost lease")
			}
			if got := reg.get(scope); got != "B" {
				t.Fatalf("stored %q, want B's write", got)
			}
		})
	}
}

// TestClientKeepsLeaseOnOthersRejection checks that a handler passing on
// the stale rejection of another lease's token does not end the caller's
// lease.
func TestClientKeepsLeaseOnOthersRejection(t *testing.T) {
	fc := newFence(t)
	addr, _, _ := newServer(t)
	ctx := context.Background()
	l, err := fc.Acquire(ctx, "orders")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)

	err = put(ctx, dialLease(t, addr, l), downstreamStaleBody)
	if stale, ok := grpcguard.FromError(err); !ok || stale.Scope != "billing" {
		t.Fatalf("passed-on rejection: %v, want it readable as billing's", err)
	}
	if l.Err() != nil {
		t.Fatalf("the lease ended on another lease's rejection: %v", l.Err())
	}
}

// TestConcurrent sends random older and newer tokens for three scopes
// from 32 goroutines, by unary calls and streams: each scope's applied log
// must be non-decreasing (so no newer write lands between the two writes
// of an older stream) and end with the write of the highest token
// presented (invariant 6).
func TestConcurrent(t *testing.T) {
	addr, reg, obs := newServer(t)
	c := dial(t, addr)
	var mu sync.Mutex
	highest := map[string]uint64{}
	var ok, stale atomic.Int64
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			for i := range 30 {
				scope := fmt.Sprintf("s%d", rand.IntN(3))
				// Around a rising frontier, so that many writes are
				// current and contend, not only the first few.
				v := uint64(1 + 2*i + rand.IntN(20))
				mu.Lock()
				highest[scope] = max(highest[scope], v)
				mu.Unlock()
				w := writers[rand.IntN(len(writers))]
				err := w.write(withToken(scope, v), c, fmt.Sprint(v))
				switch status.Code(err) {
				case codes.OK:
					ok.Add(1)
				case codes.FailedPrecondition:
					stale.Add(1)
				default:
					t.Errorf("%s write of %s:%d: %v", w.name, scope, v, err)
					return
				}
			}
		})
	}
	wg.Wait()
	reg.mu.Lock()
	defer reg.mu.Unlock()
	for scope, log := range reg.log {
		for i := 1; i < len(log); i++ {
			if log[i] < log[i-1] {
				t.Fatalf("%s: applied token %d after %d", scope, log[i], log[i-1])
			}
		}
		if reg.value[scope] != fmt.Sprint(highest[scope]) {
			t.Fatalf("%s: stored %s, want the write of the highest token %d", scope, reg.value[scope], highest[scope])
		}
	}
	if len(reg.log) != len(highest) {
		t.Fatalf("%d scopes written, want %d", len(reg.log), len(highest))
	}
	if obs.accepted.Load() != ok.Load() || obs.rejected.Load() != stale.Load() {
		t.Fatalf("observer counted %d accepted, %d rejected; clients saw %d and %d",
			obs.accepted.Load(), obs.rejected.Load(), ok.Load(), stale.Load())
	}
}
