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
// Adapters for HTTP, gRPC, SQL databases, Redis, S3 buckets and an
// embedded bbolt file live in the packages beside this one; guardtest
// checks any Store.
//
// # Caveats
//
// A token orders ownership epochs, not the writes inside one. Two writes
// with the same token are both accepted unless they carry sequence numbers
// and the Guard is strict about them (WithStrictSequence).
//
// When apply fails, the Store rolls back what apply wrote in its
// transaction and leaves the mark as it was. The HTTP and gRPC adapters
// treat a handler that answers an error as a failed apply, and then call
// Guard.Advance: the token was granted, so it still becomes the scope's
// highest and refuses every older lease's late writes; only its sequence
// number is not recorded, so that a retry can present it again. Advancing
// cannot refuse a current writer, since the token passed the check. Not
// advancing would leave the scope open to the older lease until the next
// successful write, and whatever the failed handler did outside the
// transaction exposed to it.
//
// A Store may run apply more than once for one write, to commit
// concurrent writes together (a Repeater, such as boltguard's Batched
// store); only the last run's effects are kept. The HTTP and gRPC
// adapters, which run a caller's handler as apply, accept such a store
// only when told the handlers allow it (their WithRepeats options).
//
// This package depends on the standard library and fence only.
package guard
