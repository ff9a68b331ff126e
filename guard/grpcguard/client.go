package grpcguard

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/guard"
)

// Lease is what the client interceptors need of a lease; *client.Lease has
// it.
type Lease interface {
	Token() fence.Token
	Err() error
	MarkLost(cause error)
}

// UnaryClientInterceptor returns an interceptor that sends lease's token
// with every call and marks the lease lost when a guard answers that the
// token is stale. Once the lease is lost, calls fail without being sent:
// retrying a stale token can never succeed. It is safe for concurrent use.
func UnaryClientInterceptor(lease Lease, opts ...Option) grpc.UnaryClientInterceptor {
	p := &presenter{lease: lease, key: newConfig(opts).key}
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, callOpts ...grpc.CallOption) error {
		ctx, err := p.outgoing(ctx, method)
		if err != nil {
			return err
		}
		return p.answer(invoker(ctx, method, req, reply, cc, callOpts...))
	}
}

// StreamClientInterceptor returns an interceptor that sends lease's token
// when a stream opens and marks the lease lost when a guard answers that
// the token is stale. Once the lease is lost, streams fail to open without
// being sent; a stream opened before runs to its end, as the guard fenced
// it whole. It is safe for concurrent use.
func StreamClientInterceptor(lease Lease, opts ...Option) grpc.StreamClientInterceptor {
	p := &presenter{lease: lease, key: newConfig(opts).key}
	return func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, callOpts ...grpc.CallOption) (grpc.ClientStream, error) {
		ctx, err := p.outgoing(ctx, method)
		if err != nil {
			return nil, err
		}
		cs, err := streamer(ctx, desc, cc, method, callOpts...)
		if err != nil {
			return nil, p.answer(err)
		}
		return &clientStream{ClientStream: cs, p: p}, nil
	}
}

// clientStream watches a stream's answers: the guard's verdict arrives
// with the stream's status, on whichever call reports it.
type clientStream struct {
	grpc.ClientStream
	p *presenter
}

func (s *clientStream) Header() (metadata.MD, error) {
	md, err := s.ClientStream.Header()
	return md, s.p.answer(err)
}

func (s *clientStream) SendMsg(m any) error { return s.p.answer(s.ClientStream.SendMsg(m)) }
func (s *clientStream) RecvMsg(m any) error { return s.p.answer(s.ClientStream.RecvMsg(m)) }

// presenter presents a lease's token and learns from the answers.
type presenter struct {
	lease Lease
	key   string
}

// outgoing returns ctx with the token in its outgoing metadata, replacing
// any the caller put there, or an error if the lease is lost.
func (p *presenter) outgoing(ctx context.Context, method string) (context.Context, error) {
	if err := p.lease.Err(); err != nil {
		if !errors.Is(err, fence.ErrLeaseLost) {
			err = fmt.Errorf("%w: %w", fence.ErrLeaseLost, err)
		}
		return nil, &notSentError{method: method, err: err}
	}
	md, _ := metadata.FromOutgoingContext(ctx)
	if md == nil {
		md = metadata.MD{}
	}
	md.Set(p.key, p.lease.Token().String())
	return metadata.NewOutgoingContext(ctx, md), nil
}

// answer marks the lease lost if err is a stale rejection of its token,
// and returns err in a form errors.As can read as a *guard.StaleError.
func (p *presenter) answer(err error) error {
	stale, ok := FromError(err)
	if !ok {
		return err
	}
	// A server may pass on the rejection of another lease's token (its
	// own write downstream): that says nothing about this lease. Fields
	// the detail lacks are given the benefit of the doubt, so that a
	// terse guard still ends the lease.
	tok := p.lease.Token()
	if stale.Scope != "" && stale.Scope != tok.Scope || stale.Presented != 0 && stale.Presented != tok.Value {
		return err
	}
	p.lease.MarkLost(stale)
	st, _ := status.FromError(err)
	return &staleError{stale: stale, st: st}
}

// notSentError is a call refused locally because its lease is lost.
type notSentError struct {
	method string
	err    error
}

func (e *notSentError) Error() string {
	return fmt.Sprintf("grpcguard: %s not sent: %v", e.method, e.err)
}
func (e *notSentError) Unwrap() error { return e.err }

// GRPCStatus makes status.Code report the refusal as a failed
// precondition, like a guard's own answer.
func (e *notSentError) GRPCStatus() *status.Status {
	return status.New(codes.FailedPrecondition, e.Error())
}

// staleError is a guard's stale answer to this lease, readable both as
// its gRPC status and, with errors.As, as a *guard.StaleError.
type staleError struct {
	stale *guard.StaleError
	st    *status.Status
}

func (e *staleError) Error() string              { return e.st.Err().Error() }
func (e *staleError) Unwrap() error              { return e.stale }
func (e *staleError) GRPCStatus() *status.Status { return e.st }
