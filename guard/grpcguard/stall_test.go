package grpcguard_test

import (
	"context"
	"log/slog"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"go.etcd.io/bbolt"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/fence-dev/fence/guard"
	"github.com/fence-dev/fence/guard/boltguard"
	"github.com/fence-dev/fence/guard/grpcguard"
)

// boltWriter stores each message of a client stream, and each unary call's
// payload, in the bbolt transaction of its fenced section, and records the
// order in which its handlers ran and ended.
type boltWriter struct {
	testgrpc.UnimplementedTestServiceServer
	firstWrite chan struct{} // closed when the stream has stored its first message
	mu         sync.Mutex
	events     []string
}

func (b *boltWriter) event(e string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.events = append(b.events, e)
}

func putTx(ctx context.Context, bucket, value string) error {
	tx, _ := boltguard.TxFromContext(ctx)
	bk, err := tx.CreateBucketIfNotExists([]byte(bucket))
	if err != nil {
		return err
	}
	return bk.Put([]byte(value), nil)
}

func (b *boltWriter) StreamingInputCall(stream grpc.ClientStreamingServer[testgrpc.StreamingInputCallRequest, testgrpc.StreamingInputCallResponse]) error {
	defer b.event("stream ended")
	for n := 0; ; n++ {
		req, err := stream.Recv()
		if err != nil {
			return err // the client stalled until its connection was closed: roll back
		}
		if err := putTx(stream.Context(), "orders", string(req.GetPayload().GetBody())); err != nil {
			return err
		}
		if n == 0 {
			close(b.firstWrite)
		}
	}
}

func (b *boltWriter) UnaryCall(ctx context.Context, req *testgrpc.SimpleRequest) (*testgrpc.SimpleResponse, error) {
	b.event("billing written")
	return &testgrpc.SimpleResponse{}, putTx(ctx, "billing", string(req.GetPayload().GetBody()))
}

// TestStalledStreamHoldsTheStore documents the caveat of fenced streams:
// the stream's message receives run inside its fenced section, so a client
// stream that sends a message and stalls holds the store's write
// transaction, and over bbolt every other scope's write waits for it. The
// server's keepalive MaxConnectionAge and MaxConnectionAgeGrace bound
// that: the stalled stream's connection is closed, its handler's Recv
// fails, its writes roll back, and the other scope's write goes through.
func TestStalledStreamHoldsTheStore(t *testing.T) {
	s, err := boltguard.Open(filepath.Join(t.TempDir(), "g.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	g := guard.New(s, guard.WithLogger(slog.New(slog.DiscardHandler)))
	w := &boltWriter{firstWrite: make(chan struct{})}

	// Streams of "orders" on a server that bounds each connection's life;
	// unary writes of "billing" on another, which does not.
	streams := grpc.NewServer(
		grpc.StreamInterceptor(mustStream(t, g, grpcguard.Methods("orders", streamMethod))),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionAge: 100 * time.Millisecond, MaxConnectionAgeGrace: 100 * time.Millisecond}),
	)
	testgrpc.RegisterTestServiceServer(streams, w)
	unary := grpc.NewServer(grpc.UnaryInterceptor(mustUnary(t, g, grpcguard.Methods("billing", unaryMethod))))
	testgrpc.RegisterTestServiceServer(unary, w)
	sc, uc := dial(t, serve(t, streams)), dial(t, serve(t, unary))

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel() // ends the stalled stream if the test fails first
	stream, err := sc.StreamingInputCall(metadata.AppendToOutgoingContext(ctx, grpcguard.TokenKey, "fence:v1:orders:5"))
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&testgrpc.StreamingInputCallRequest{Payload: &testgrpc.Payload{Body: []byte("first")}}); err != nil {
		t.Fatal(err)
	}
	<-w.firstWrite // the stream is inside its fenced section, waiting for more

	// A write of another scope, while the stream stalls.
	_, err = uc.UnaryCall(metadata.AppendToOutgoingContext(ctx, grpcguard.TokenKey, "fence:v1:billing:3"),
		&testgrpc.SimpleRequest{Payload: &testgrpc.Payload{Body: []byte("invoice")}})
	if err != nil {
		t.Fatalf("the billing write: %v", err)
	}
	if _, err := stream.CloseAndRecv(); status.Code(err) != codes.Unavailable {
		t.Fatalf("the stalled stream: %v, want UNAVAILABLE once the server closed its connection", err)
	}
	w.mu.Lock()
	events := slices.Clone(w.events)
	w.mu.Unlock()
	if want := []string{"stream ended", "billing written"}; !slices.Equal(events, want) {
		t.Fatalf("handlers ran %q, want %q: the billing write waits for the stalled stream's transaction", events, want)
	}
	err = s.DB().View(func(tx *bbolt.Tx) error {
		if tx.Bucket([]byte("orders")) != nil {
			t.Error("the stalled stream's first message was kept, want it rolled back")
		}
		if b := tx.Bucket([]byte("billing")); b == nil || b.Get([]byte("invoice")) == nil {
			t.Error("the billing write is missing")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
