package grpcguard

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/guard"
)

// The default metadata keys. gRPC metadata keys are lowercase.
const (
	TokenKey    = "fencing-token"
	SequenceKey = "fencing-sequence"
)

// Option configures the interceptors of this package.
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// WithMetadataKey reads the token from (server side) or writes it to
// (client side) the named metadata key instead of fencing-token. Both
// sides must agree.
func WithMetadataKey(key string) Option {
	return optionFunc(func(c *config) { c.key = strings.ToLower(key) })
}

// WithRepeats lets UnaryServerInterceptor accept a guard whose store may
// run a handler more than once for one call (a guard.Repeater, such as
// boltguard's Batched store). Give it only when every fenced handler
// changes nothing but the store's transaction: only the last run's writes
// and answer are kept, but a side effect elsewhere (a call to another
// service, a message sent) happens once per run. Without it,
// UnaryServerInterceptor refuses such a guard. StreamServerInterceptor
// refuses one in any case, and the client interceptors ignore it.
func WithRepeats() Option { return optionFunc(func(c *config) { c.repeats = true }) }

type config struct {
	key     string
	repeats bool // WithRepeats
}

func newConfig(opts []Option) *config {
	c := &config{key: TokenKey}
	for _, o := range opts {
		o.apply(c)
	}
	return c
}

// ScopeFunc decides whether the method of a call is fenced, and in which
// scope. ctx is the call's, so a scope may depend on its incoming metadata
// or peer as well as on the method. It must be safe for concurrent use.
type ScopeFunc func(ctx context.Context, fullMethod string) (scope string, ok bool)

// Methods returns a ScopeFunc that fences the named methods
// ("/package.Service/Method") in scope and lets every other method pass
// unchecked.
func Methods(scope string, fullMethods ...string) ScopeFunc {
	fullMethods = slices.Clone(fullMethods)
	return func(_ context.Context, fullMethod string) (string, bool) {
		return scope, slices.Contains(fullMethods, fullMethod)
	}
}

// UnaryServerInterceptor returns an interceptor that runs the handlers of
// the methods scope fences inside g's fenced section for their scope, if
// the call's token is current. The interceptor is safe for concurrent use.
// It fails if g's store may run a handler more than once (a
// guard.Repeater) and WithRepeats is not given; with it, only the last
// run's answer is returned.
func UnaryServerInterceptor(g *guard.Guard, scope ScopeFunc, opts ...Option) (grpc.UnaryServerInterceptor, error) {
	c := newConfig(opts)
	if g.Repeats() && !c.repeats {
		return nil, errors.New("grpcguard: the guard's store may run a handler more than once for one call " +
			"(a guard.Repeater, such as boltguard's Batched store); give grpcguard.WithRepeats() if every fenced " +
			"handler changes nothing but the store's transaction, or use a store that runs it once")
	}
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		s, ok := scope(ctx, info.FullMethod)
		if !ok {
			return handler(ctx, req)
		}
		var resp any
		err := c.fence(ctx, g, s, func(ctx context.Context) error {
			var err error
			resp, err = handler(ctx, req)
			return err
		})
		return resp, err
	}, nil
}

// StreamServerInterceptor returns an interceptor that runs the handlers of
// the streams scope fences, from their start to their end, inside g's
// fenced section for their scope, if the stream's token is current. Their
// message receives run inside it too, so a client that stalls holds the
// store's write transaction: bound fenced streams from the server (see
// the package's Caveats). The interceptor is safe for concurrent use. It
// fails if g's store may run a handler more than once (a guard.Repeater,
// such as boltguard's Batched store), WithRepeats or not: a stream's
// messages cannot be received again.
func StreamServerInterceptor(g *guard.Guard, scope ScopeFunc, opts ...Option) (grpc.StreamServerInterceptor, error) {
	if g.Repeats() {
		return nil, errors.New("grpcguard: a stream cannot be fenced over a store that may run its handler more than once " +
			"(a guard.Repeater, such as boltguard's Batched store): its messages cannot be received again; " +
			"fence streams with a guard over a store that runs it once")
	}
	c := newConfig(opts)
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		s, ok := scope(ss.Context(), info.FullMethod)
		if !ok {
			return handler(srv, ss)
		}
		return c.fence(ss.Context(), g, s, func(ctx context.Context) error {
			return handler(srv, &serverStream{ServerStream: ss, ctx: ctx})
		})
	}, nil
}

// serverStream hands the handler the context of the fenced section, which
// a store may have derived (to carry its transaction, say).
type serverStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *serverStream) Context() context.Context { return s.ctx }

// fence runs handle inside g's fenced section for scope and returns the
// handler's error unchanged, or the status of a rejection.
func (c *config) fence(ctx context.Context, g *guard.Guard, scope string, handle func(context.Context) error) error {
	w, err := c.write(ctx)
	if err != nil {
		return err
	}
	err = g.Fence(ctx, scope, w, func(ctx context.Context) error {
		if err := handle(ctx); err != nil {
			return &handlerError{err: err} // a failed handler's writes roll back
		}
		return nil
	})
	// Fence's answer is that of its last try, which is what counts: a
	// store that runs the handler again (boltguard's Batched) may find the
	// token stale on the rerun that follows a failed run, and then the
	// caller must hear that it is stale, not what the rolled-back run said.
	if he, ok := errors.AsType[*handlerError](err); ok {
		// The token passed the check all the same: record it, so that
		// older leases' writes are refused from now on. A token that
		// passed is never older than the scope's highest, so this cannot
		// refuse a current writer. If it fails, the next write records
		// it; the caller hears the handler's error either way.
		_ = g.Advance(ctx, scope, w.Token)
		return he.err
	}
	if err != nil {
		return statusError(c.key, err)
	}
	return nil
}

// handlerError carries a handler's error through the store's Fence, so
// that it is told apart from the store's own answer (a stale token, a
// failed commit), whatever either says. It does not unwrap: a handler
// passing on another guard's stale rejection is no refusal of this
// guard's, for its log and metrics.
type handlerError struct{ err error }

func (e *handlerError) Error() string { return e.err.Error() }

// write reads the token and sequence number from the incoming metadata.
func (c *config) write(ctx context.Context) (guard.Write, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	vals := md.Get(c.key)
	switch len(vals) {
	case 0:
		return guard.Write{}, invalidArgument(c.key, fmt.Sprintf("missing %s metadata: want the lease's token, e.g. %s: fence:v1:SCOPE:TOKEN", c.key, c.key))
	case 1:
	default:
		return guard.Write{}, invalidArgument(c.key, fmt.Sprintf("%d %s metadata values: want exactly one", len(vals), c.key))
	}
	tok, err := fence.ParseToken(vals[0])
	if err != nil {
		return guard.Write{}, invalidArgument(c.key, fmt.Sprintf("%s metadata: %v", c.key, err))
	}
	w := guard.Write{Token: tok}
	if seqs := md.Get(SequenceKey); len(seqs) > 0 {
		seq, err := strconv.ParseUint(seqs[0], 10, 64)
		if len(seqs) > 1 || err != nil || seq == 0 {
			return guard.Write{}, invalidArgument(SequenceKey, fmt.Sprintf("%s metadata %q: want one decimal integer from 1 to %d", SequenceKey, strings.Join(seqs, ", "), uint64(1<<64-1)))
		}
		w.Seq = seq
	}
	return w, nil
}
