// Package fence holds the vocabulary shared by every part of fence: scopes,
// fencing tokens and their text form, lease records, and the sentinel errors.
//
// A lease decides who owns a scope for a bounded time. Expiry does not stop
// the former holder: a paused process or a delayed packet can still reach
// the protected resource after a newer holder took over. Every grant
// therefore carries a [Token], an integer that is strictly greater for every
// new grant of the same scope. A guard at the resource keeps the greatest
// token it has accepted and refuses older ones.
//
// # Usage
//
// Tokens travel as text (in headers, environment variables and logs):
//
//	tok := fence.Token{Scope: "orders/shard-7", Value: 42}
//	s := tok.String() // "fence:v1:orders/shard-7:42"
//	back, err := fence.ParseToken(s)
//
// # Caveats
//
// A version 1 token is not signed: a guard that accepts it trusts whoever
// presents it. Tokens order ownership epochs, not the writes inside one epoch.
//
// This package depends on the standard library only.
package fence
