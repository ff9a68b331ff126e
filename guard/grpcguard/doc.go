// Package grpcguard enforces fencing tokens on gRPC services, and presents
// them from gRPC clients.
//
// # Usage
//
// Server side, fence the methods that write:
//
//	g := guard.New(store, guard.WithObserver(metrics.Observer("grpc")))
//	orders := grpcguard.Methods("orders", "/shop.v1.Orders/Put", "/shop.v1.Orders/Import")
//	unary, err := grpcguard.UnaryServerInterceptor(g, orders)
//	if err != nil {
//		return err
//	}
//	stream, err := grpcguard.StreamServerInterceptor(g, orders)
//	if err != nil {
//		return err
//	}
//	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(unary), grpc.ChainStreamInterceptor(stream))
//
// A store that may run a handler more than once (boltguard's Batched
// store, which commits concurrent writes together) is refused unless the
// unary interceptor is given WithRepeats, and always by the stream
// interceptor.
//
// A call carries its lease's token in the fencing-token metadata (the
// token's text form, "fence:v1:orders:42") and optionally a sequence
// number in fencing-sequence. The handler runs inside the scope's fenced
// section, so the check and the handler's effect are one atomic step. The
// answers:
//
//   - a stale token: FAILED_PRECONDITION with a google.rpc.ErrorInfo detail
//     of reason STALE_FENCING_TOKEN and domain fence.dev, whose metadata
//     holds scope, presented_token and highest_token (and
//     presented_sequence and highest_sequence for a write that carried
//     one). FromError reads it back.
//   - a missing or malformed token, or one of another scope:
//     INVALID_ARGUMENT with a google.rpc.BadRequest detail whose field
//     violation names the metadata key.
//   - otherwise the handler's own answer, unchanged.
//
// Methods the ScopeFunc does not fence pass unchecked.
//
// Client side, intercept the connection with the lease:
//
//	conn, err := grpc.NewClient(addr, creds,
//		grpc.WithUnaryInterceptor(grpcguard.UnaryClientInterceptor(lease)),
//		grpc.WithStreamInterceptor(grpcguard.StreamClientInterceptor(lease)),
//	)
//
// Each call then carries the lease's token. A stale answer to it marks the
// lease lost and comes back as an error that matches fence.ErrStale and
// reads as a *guard.StaleError with errors.As; later calls fail without
// being sent, with an error that matches fence.ErrLeaseLost. Both keep a
// gRPC status: status.Code reports FAILED_PRECONDITION.
//
// Rejections are counted by the Guard's observer, as for every adapter:
// give the Guard guardmetrics' Observer("grpc").
//
// # Caveats
//
// A fenced stream holds its scope's fenced section from its start to its
// end, so every message of it is applied under the token it opened with,
// and writes with a newer token wait until it ends. Keep fenced streams
// short; a long-lived stream that writes now and then is better served by
// unary calls. Checking each message instead would not be atomic: the
// interceptor sees a message arrive, not the handler apply it.
//
// The stream's message receives run inside that section too: the handler
// receives them, so the interceptor cannot read them first, as httpguard
// reads a request body. A store's fenced section is a write transaction
// (bbolt's and SQLite's take the whole database; PostgreSQL's holds the
// scope's row and a pooled connection), so a client that opens a fenced
// stream, sends part of it and stalls holds every other scope's writes on
// bbolt or SQLite, and its own scope's everywhere, for as long as it
// stalls. gRPC has no per-message receive timeout, a deadline the server
// puts on the handler's context does not end a receive, and the client's
// own deadline is the client's to choose. Bound fenced streams from the
// server: keepalive.ServerParameters' MaxConnectionAge with
// MaxConnectionAgeGrace closes a connection, and so ends its stalled
// streams and rolls back their writes, after at most their sum; or fence
// only unary methods over such a store.
//
// A handler that returns an error has failed: the store rolls back the
// writes it made in the fenced section's transaction (boltguard's and
// sqlguard's TxFromContext), and the call gets the handler's error. Its
// token still becomes the scope's highest (guard.Advance), since it was
// granted and so every older lease is over; its sequence number does not,
// so a retry may present it again. Effects outside the store's
// transaction cannot be rolled back: a store without transactions
// (guard.MemoryStore, redisguard.Store) keeps whatever the handler
// changed, and the advanced mark then at least refuses older writers
// after it. A failed stream's messages have gone out already; its error
// status says its writes were rolled back.
//
// With a store that commits the handler's writes together with the mark
// (boltguard, sqlguard), a unary call's answer is sent only after that
// commit, and a failed commit answers the call with its error instead. The
// messages a fenced stream sends go out as it sends them, before the
// commit: the stream's final status is what says whether its writes were
// committed.
//
// The client marks its lease lost only for a stale answer naming its own
// scope and token, so a server that passes on a downstream rejection of
// another lease does not end this one.
//
// The scope of a call comes from its method, metadata or peer
// (ScopeFunc). A scope named in the request message is beyond an
// interceptor's reach: such a handler reads the token and calls
// guard.Fence itself.
package grpcguard
