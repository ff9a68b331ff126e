package grpcguard_test

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"go.etcd.io/bbolt"
	"google.golang.org/grpc/codes"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/fence-dev/fence/guard"
	"github.com/fence-dev/fence/guard/boltguard"
	"github.com/fence-dev/fence/guard/grpcguard"
	"github.com/fence-dev/fence/guard/internal/rerun"
)

// TestRepeatingStoreNeedsOptIn: a store that may run a handler again
// (boltguard's Batched) fences unary calls only with WithRepeats, and
// never a stream, whose messages cannot be received twice; building the
// interceptor says so at once, naming the store. A store that runs each
// handler once needs no option.
func TestRepeatingStoreNeedsOptIn(t *testing.T) {
	s, err := boltguard.Open(filepath.Join(t.TempDir(), "g.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	scope := grpcguard.Methods("orders", "/shop.v1.Orders/Put", "/shop.v1.Orders/Import")
	once, batched := guard.New(s), guard.New(s.Batched())
	if _, err := grpcguard.UnaryServerInterceptor(once, scope); err != nil {
		t.Errorf("UnaryServerInterceptor over the Store: %v", err)
	}
	if _, err := grpcguard.StreamServerInterceptor(once, scope); err != nil {
		t.Errorf("StreamServerInterceptor over the Store: %v", err)
	}
	if i, err := grpcguard.UnaryServerInterceptor(batched, scope); i != nil || err == nil ||
		!strings.Contains(err.Error(), "Batched") || !strings.Contains(err.Error(), "WithRepeats") {
		t.Errorf("UnaryServerInterceptor over the Batched store without WithRepeats: %v; want an error naming the store and WithRepeats", err)
	}
	if _, err := grpcguard.UnaryServerInterceptor(batched, scope, grpcguard.WithRepeats()); err != nil {
		t.Errorf("UnaryServerInterceptor over the Batched store with WithRepeats: %v", err)
	}
	for _, opts := range [][]grpcguard.Option{nil, {grpcguard.WithRepeats()}} {
		if i, err := grpcguard.StreamServerInterceptor(batched, scope, opts...); i != nil || err == nil || !strings.Contains(err.Error(), "Batched") {
			t.Errorf("StreamServerInterceptor over the Batched store with %d options: %v; want an error naming the store", len(opts), err)
		}
	}
}

// runStamper's UnaryCall stores, under the key in the payload, the number
// of its run, and answers that number: a caller can then check that the
// answer it got is the run whose write was kept.
type runStamper struct {
	testgrpc.UnimplementedTestServiceServer
	runs *atomic.Int64
}

func (s runStamper) UnaryCall(ctx context.Context, req *testgrpc.SimpleRequest) (*testgrpc.SimpleResponse, error) {
	run := strconv.FormatInt(s.runs.Add(1), 10)
	tx, _ := boltguard.TxFromContext(ctx)
	b, err := tx.CreateBucketIfNotExists([]byte("runs"))
	if err == nil {
		err = b.Put(req.GetPayload().GetBody(), []byte(run))
	}
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	return &testgrpc.SimpleResponse{Username: run}, nil
}

// TestUnaryOverBatchedStore: over boltguard's Batched store, a unary
// handler may run more than once (direct UpdateBatch calls that always
// fail share the batches, so bbolt runs the others again). Each call must
// answer with its last run, the one whose write was kept; the test fails
// if no handler ran twice.
func TestUnaryOverBatchedStore(t *testing.T) {
	s, err := boltguard.Open(filepath.Join(t.TempDir(), "g.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var runs atomic.Int64
	c := serveUnary(t, guard.New(s.Batched()), runStamper{runs: &runs}, grpcguard.WithRepeats())
	stop := rerun.Force(s)
	defer stop()
	const callers, calls = 16, 40
	var made atomic.Int64
	var wg sync.WaitGroup
	for i := range callers {
		wg.Go(func() {
			for j := range calls {
				key := fmt.Sprintf("c%d-%d", i, j)
				md := metadata.Pairs(grpcguard.TokenKey, "fence:v1:orders:7")
				resp, err := c.UnaryCall(metadata.NewOutgoingContext(t.Context(), md), &testgrpc.SimpleRequest{Payload: &testgrpc.Payload{Body: []byte(key)}})
				if err != nil {
					t.Error(err)
					return
				}
				made.Add(1)
				var kept string
				s.DB().View(func(tx *bbolt.Tx) error {
					kept = string(tx.Bucket([]byte("runs")).Get([]byte(key)))
					return nil
				})
				if resp.GetUsername() != kept {
					t.Errorf("%s: answered run %s, but run %s's write was kept", key, resp.GetUsername(), kept)
					return
				}
			}
		})
	}
	wg.Wait()
	stop()
	if again := runs.Load() - made.Load(); again <= 0 {
		t.Fatalf("%d handler runs for %d calls: none ran again, so the test showed nothing", runs.Load(), made.Load())
	} else {
		t.Logf("%d handler runs again for %d calls", again, made.Load())
	}
}

// failOnce's UnaryCall fails the first run of each payload body, with
// PermissionDenied, and stores the body on every later run.
type failOnce struct {
	testgrpc.UnimplementedTestServiceServer
	mu   sync.Mutex
	runs map[string]int
}

func (s *failOnce) UnaryCall(ctx context.Context, req *testgrpc.SimpleRequest) (*testgrpc.SimpleResponse, error) {
	key := string(req.GetPayload().GetBody())
	s.mu.Lock()
	s.runs[key]++
	first := s.runs[key] == 1
	s.mu.Unlock()
	if first && strings.HasPrefix(key, "fail-once") {
		return nil, status.Error(codes.PermissionDenied, "the handler's first run fails")
	}
	tx, _ := boltguard.TxFromContext(ctx)
	b, err := tx.CreateBucketIfNotExists([]byte("runs"))
	if err == nil {
		err = b.Put([]byte(key), nil)
	}
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	return &testgrpc.SimpleResponse{}, nil
}

func (s *failOnce) ran(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.runs[key]
}

// TestStaleOnRerunOverBatchedStore: over boltguard's Batched store, a call
// whose handler fails is run again alone (bbolt's DB.Batch), and a newer
// token committed in between makes that rerun find it stale. Its answer
// must then be the stale status, which makes the client mark its lease
// lost, not the error of the handler's earlier run, which rolled back. A
// newer writer races each such call; the test goes on until one rerun
// found the call stale, and fails if none did in 200 rounds.
func TestStaleOnRerunOverBatchedStore(t *testing.T) {
	s, err := boltguard.Open(filepath.Join(t.TempDir(), "g.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	svc := &failOnce{runs: map[string]int{}}
	c := serveUnary(t, guard.New(s.Batched(), guard.WithLogger(slog.New(slog.DiscardHandler))), svc, grpcguard.WithRepeats())
	call := func(key string, tok uint64) error {
		md := metadata.Pairs(grpcguard.TokenKey, fmt.Sprintf("fence:v1:orders:%d", tok))
		_, err := c.UnaryCall(metadata.NewOutgoingContext(t.Context(), md), &testgrpc.SimpleRequest{Payload: &testgrpc.Payload{Body: []byte(key)}})
		return err
	}
	for i := range uint64(200) {
		older, newer := 2*i+1, 2*i+2
		key := fmt.Sprintf("fail-once-%d", i)
		var errOld, errNew error
		var wg sync.WaitGroup
		wg.Go(func() { errOld = call(key, older) })
		wg.Go(func() { errNew = call(fmt.Sprintf("newer-%d", i), newer) })
		wg.Wait()
		if errNew != nil {
			t.Fatalf("round %d: the newer write: %v", i, errNew)
		}
		runs := svc.ran(key)
		if runs == 2 {
			// Its rerun came before the newer write, and succeeded.
			if errOld != nil {
				t.Fatalf("round %d: the older write ran again and succeeded, but answered %v", i, errOld)
			}
			continue
		}
		// Stale in the batch before its handler ran (0 runs), or on the
		// rerun after its first run failed (1 run).
		stale, ok := grpcguard.FromError(errOld)
		if !ok || status.Code(errOld) != codes.FailedPrecondition || stale.Presented != older || stale.Highest != newer {
			t.Fatalf("round %d: the older write, its handler run %d times: %v; want FAILED_PRECONDITION stale, token %d superseded by %d",
				i, runs, errOld, older, newer)
		}
		if runs == 1 {
			t.Logf("round %d: the rerun found the call stale after its handler failed", i)
			return
		}
	}
	t.Fatal("in 200 rounds no rerun found its call stale after a failed run: the test showed nothing")
}
