package grpcguard_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/status"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/client"
	"github.com/fence-dev/fence/fencetest"
	"github.com/fence-dev/fence/guard"
	"github.com/fence-dev/fence/guard/boltguard"
	"github.com/fence-dev/fence/guard/grpcguard"
)

// orders is the guarded service: gRPC's test service, whose UnaryCall
// stores the payload.
type orders struct {
	testgrpc.UnimplementedTestServiceServer
	mu   sync.Mutex
	last string
}

func (o *orders) UnaryCall(_ context.Context, req *testgrpc.SimpleRequest) (*testgrpc.SimpleResponse, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.last = string(req.GetPayload().GetBody())
	return &testgrpc.SimpleResponse{}, nil
}

func (o *orders) Last() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.last
}

// Example plays the source text's story: A's lease runs out behind its
// back, B takes the scope and writes, and A's late write is refused.
func Example() {
	ctx := context.Background()
	fs := fencetest.NewServer()
	defer fs.Close()
	fc := fs.Client()
	defer fc.Close()

	// The service fences its writes with a guard.
	g := guard.New(guard.NewMemoryStore(), guard.WithLogger(slog.New(slog.DiscardHandler)))
	scope := grpcguard.Methods("orders", "/grpc.testing.TestService/UnaryCall")
	fenced, err := grpcguard.UnaryServerInterceptor(g, scope)
	if err != nil {
		log.Fatal(err)
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(fenced))
	svc := &orders{}
	testgrpc.RegisterTestServiceServer(srv, svc)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	go srv.Serve(lis)
	defer srv.Stop()

	// Each writer calls it through a connection that presents its lease.
	write := func(lease *client.Lease, body string) error {
		conn, err := grpc.NewClient(lis.Addr().String(),
			grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithUnaryInterceptor(grpcguard.UnaryClientInterceptor(lease)))
		if err != nil {
			return err
		}
		defer conn.Close()
		_, err = testgrpc.NewTestServiceClient(conn).UnaryCall(ctx, &testgrpc.SimpleRequest{Payload: &testgrpc.Payload{Body: []byte(body)}})
		return err
	}

	a, err := fc.Acquire(ctx, "orders", client.WithHolder("A"))
	if err != nil {
		log.Fatal(err)
	}
	// A pauses; meanwhile its lease ends (released here, as expiry would)
	// and B acquires the scope with a newer token.
	if _, err := fc.Release(ctx, "orders", a.ID()); err != nil {
		log.Fatal(err)
	}
	b, err := fc.Acquire(ctx, "orders", client.WithHolder("B"))
	if err != nil {
		log.Fatal(err)
	}
	defer b.Release(ctx)

	fmt.Println("B writes with", b.Token(), "→", write(b, "B's order"))
	err = write(a, "A's order")
	var stale *guard.StaleError
	fmt.Println("A writes with", a.Token(), "→", status.Code(err), errors.Is(err, fence.ErrStale), errors.As(err, &stale))
	fmt.Println(stale)
	<-a.Done()
	fmt.Println(a.Err())
	fmt.Println(write(a, "A's order again"))
	fmt.Println("stored:", svc.Last())
	// Output:
	// B writes with fence:v1:orders:3 → <nil>
	// A writes with fence:v1:orders:1 → FailedPrecondition true true
	// stale fencing token for "orders": token 1 was superseded by token 3
	// lease on "orders" with token 1 is lost: stale fencing token for "orders": token 1 was superseded by token 3
	// grpcguard: /grpc.testing.TestService/UnaryCall not sent: lease on "orders" with token 1 is lost: stale fencing token for "orders": token 1 was superseded by token 3
	// stored: B's order
}

// boltguard's Batched store may run a handler more than once, so the
// unary interceptor accepts it only with WithRepeats, and the stream
// interceptor not at all.
func ExampleWithRepeats() {
	dir, err := os.MkdirTemp("", "grpcguard")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	store, err := boltguard.Open(filepath.Join(dir, "orders.db"))
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	g := guard.New(store.Batched())
	scope := grpcguard.Methods("orders", "/shop.v1.Orders/Put")

	if _, err := grpcguard.UnaryServerInterceptor(g, scope); err != nil {
		fmt.Println("unary without WithRepeats: refused")
	}
	if _, err := grpcguard.UnaryServerInterceptor(g, scope, grpcguard.WithRepeats()); err == nil {
		fmt.Println("unary with WithRepeats: accepted")
	}
	if _, err := grpcguard.StreamServerInterceptor(g, scope, grpcguard.WithRepeats()); err != nil {
		fmt.Println("stream: refused")
	}
	// Output:
	// unary without WithRepeats: refused
	// unary with WithRepeats: accepted
	// stream: refused
}
