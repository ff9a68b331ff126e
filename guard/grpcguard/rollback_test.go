package grpcguard_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/guard"
	"github.com/fence-dev/fence/guard/grpcguard"
	"github.com/fence-dev/fence/guard/internal/txstore"
)

// rowWriter writes a row per payload in the fenced section's transaction,
// and fails after writing a payload that contains "fail".
type rowWriter struct {
	testgrpc.UnimplementedTestServiceServer
	st txstore.Store
}

func (w rowWriter) write(ctx context.Context, body string) error {
	if err := w.st.Insert(ctx, body); err != nil {
		return status.Error(codes.Internal, err.Error())
	}
	if strings.Contains(body, "fail") {
		return status.Error(codes.Aborted, "refused after writing "+body)
	}
	return nil
}

func (w rowWriter) UnaryCall(ctx context.Context, req *testgrpc.SimpleRequest) (*testgrpc.SimpleResponse, error) {
	if err := w.write(ctx, string(req.GetPayload().GetBody())); err != nil {
		return nil, err
	}
	return &testgrpc.SimpleResponse{}, nil
}

func (w rowWriter) StreamingInputCall(stream grpc.ClientStreamingServer[testgrpc.StreamingInputCallRequest, testgrpc.StreamingInputCallResponse]) error {
	for {
		m, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return stream.SendAndClose(&testgrpc.StreamingInputCallResponse{})
		}
		if err != nil {
			return err
		}
		if err := w.write(stream.Context(), string(m.GetPayload().GetBody())); err != nil {
			return err
		}
	}
}

// TestFailedHandlerRollsBack: a unary or stream handler that writes rows
// and then returns an error has failed, so its rows must not land, and the
// caller gets its error. Its token still becomes the scope's highest, so an
// older token is refused after it; its sequence number does not, so a
// retry with the same one is accepted. boltguard's Batched store, which
// fences unary calls only, runs a failed handler again on its own, with
// the same outcome.
func TestFailedHandlerRollsBack(t *testing.T) {
	for _, st := range []txstore.Store{txstore.Bolt(t, false), txstore.Bolt(t, true), txstore.SQLite(t)} {
		t.Run(st.Name, func(t *testing.T) {
			g := guard.New(st.Store, guard.WithStrictSequence(), guard.WithLogger(slog.New(slog.DiscardHandler)))
			rows := grpcguard.Methods("rows", unaryMethod, streamMethod)
			opts := []grpc.ServerOption{grpc.ChainUnaryInterceptor(mustUnary(t, g, rows, grpcguard.WithRepeats()))}
			if !g.Repeats() {
				opts = append(opts, grpc.ChainStreamInterceptor(mustStream(t, g, rows)))
			}
			srv := grpc.NewServer(opts...)
			testgrpc.RegisterTestServiceServer(srv, rowWriter{st: st})
			c := dial(t, serve(t, srv))
			call := func(tok, seq uint64) context.Context {
				return metadata.AppendToOutgoingContext(context.Background(),
					grpcguard.TokenKey, fence.Token{Scope: "rows", Value: tok}.String(),
					grpcguard.SequenceKey, strconv.FormatUint(seq, 10))
			}
			var tok uint64
			for name, write := range map[string]func(ctx context.Context, bodies ...string) error{
				"unary": func(ctx context.Context, bodies ...string) error {
					return put(ctx, c, strings.Join(bodies, ""))
				},
				"stream": func(ctx context.Context, bodies ...string) error { return putStream(ctx, c, bodies...) },
			} {
				if name == "stream" && g.Repeats() {
					continue
				}
				tok += 10
				before := st.Rows(t)
				err := write(call(tok, 1), "r", "fail")
				if status.Code(err) != codes.Aborted || !strings.Contains(err.Error(), "refused after writing") {
					t.Fatalf("%s: failed handler answered %v, want its own ABORTED", name, err)
				}
				if n := st.Rows(t); n != before {
					t.Fatalf("%s: %d rows committed by the failed handler, want its writes rolled back", name, n-before)
				}
				if m := st.Highest(t, "rows"); m != (guard.Mark{Token: tok}) {
					t.Fatalf("%s: mark %+v after the failed handler, want token %d without its sequence", name, m, tok)
				}
				if err := write(call(tok-1, 1), "old"); status.Code(err) != codes.FailedPrecondition {
					t.Fatalf("%s: an older token after the failed handler: %v, want FAILED_PRECONDITION", name, err)
				}
				if err := write(call(tok, 1), name); err != nil {
					t.Fatalf("%s: the retry with the same token and sequence: %v", name, err)
				}
				if n, m := st.Rows(t), st.Highest(t, "rows"); n != before+1 || m != (guard.Mark{Token: tok, Seq: 1}) {
					t.Fatalf("%s: after the retry: %d rows, mark %+v; want 1 more and token %d sequence 1", name, n-before, m, tok)
				}
			}
		})
	}
}
