// Package guard enforces fencing tokens where the write lands: the rule
// "a token lower than the highest accepted is stale; otherwise record it as
// the highest and apply the write", atomic with the write.
//
// # Usage
//
// A Store keeps the highest accepted token per scope, durably with the
// guarded data, and applies the check and the write as one step. Wrap it in
// a Guard, which also refuses tokens of other scopes and logs rejections:
//
//	g := guard.New(store, guard.WithLogger(log))
//	err := g.Fence(ctx, "orders", guard.Write{Token: tok}, func(ctx context.Context) error {
//		return saveOrder(ctx, o) // runs only if tok is not stale
//	})
//	var stale *guard.StaleError
//	if errors.As(err, &stale) { /* the writer's lease is lost: tell it so */ }
//
// Adapters for HTTP, gRPC, SQL databases, Redis and an embedded bbolt file
// live in the packages beside this one; guardtest checks any Store.
//
// # Caveats
//
// A token orders ownership epochs, not the writes inside one. Two writes
// with the same token are both accepted unless they carry sequence numbers
// and the Guard is strict about them (WithStrictSequence).
//
// A Store may run apply more than once for one write, to commit
// concurrent writes together (a Repeater, such as boltguard's Batched
// store); only the last run's effects are kept.
//
// This package depends on the standard library and fence only.
package guard
