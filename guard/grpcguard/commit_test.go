package grpcguard_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/status"

	"github.com/fence-dev/fence/guard"
	"github.com/fence-dev/fence/guard/internal/ordersdb"
	"github.com/fence-dev/fence/guard/sqlguard"
)

// orderBook's UnaryCall inserts an order for the customer named in the
// payload, in the fenced section's transaction.
type orderBook struct {
	testgrpc.UnimplementedTestServiceServer
}

func (orderBook) UnaryCall(ctx context.Context, req *testgrpc.SimpleRequest) (*testgrpc.SimpleResponse, error) {
	tx, _ := sqlguard.TxFromContext(ctx)
	if _, err := tx.ExecContext(ctx, "INSERT INTO orders (customer) VALUES (?)", string(req.GetPayload().GetBody())); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	return &testgrpc.SimpleResponse{Username: "created"}, nil
}

// TestFailedCommitIsNotAcknowledged: a unary handler's writes commit with
// the mark after it has answered; when that commit fails (a deferred
// foreign key, which SQLite checks at COMMIT), the call fails with the
// commit's error, and the handler's answer is not delivered.
func TestFailedCommitIsNotAcknowledged(t *testing.T) {
	db, store := ordersdb.Open(t)
	g := guard.New(store, guard.WithLogger(slog.New(slog.DiscardHandler)))
	c := serveUnary(t, g, orderBook{})

	resp, err := c.UnaryCall(withToken("orders", 5), &testgrpc.SimpleRequest{Payload: payload("nobody")})
	if err == nil || resp != nil || !strings.Contains(err.Error(), "FOREIGN KEY") {
		t.Fatalf("a call whose commit failed was answered %v, %v; want the commit's error and no answer", resp, err)
	}
	if n := ordersdb.Count(t, db); n != 0 {
		t.Fatalf("%d orders after the failed commit, want none", n)
	}

	resp, err = c.UnaryCall(withToken("orders", 5), &testgrpc.SimpleRequest{Payload: payload("ada")})
	if err != nil || resp.GetUsername() != "created" {
		t.Fatalf("a committed call was answered %v, %v; want the handler's answer", resp, err)
	}
	if m, err := store.Highest(t.Context(), "orders"); err != nil || m.Token != 5 {
		t.Fatalf("the mark after the committed call: %+v, %v; want token 5", m, err)
	}
}
