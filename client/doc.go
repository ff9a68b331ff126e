// Package client is the Go client of fenced, the fence lease service. It
// acquires, renews and releases leases, and keeps a [Lease] alive in the
// background while telling its holder as soon as it can no longer be sure
// it holds its scope.
//
// A lease decides who owns a scope for a bounded time; the fencing token
// that comes with it is what makes writes safe. Expiry does not stop a
// paused process or a delayed packet, so a lease on its own cannot keep an
// old holder from writing. Present [Lease.Token] with every write to the
// protected resource, where a guard refuses any token older than the newest
// it has accepted.
//
// # Usage
//
// Create one [Client] per service (one per cluster, listing all its nodes)
// and share it; it is safe for concurrent
// use. Acquire a lease, do the work under its context, send its token with
// every write, and release it when done:
//
//	c, err := client.New("127.0.0.1:7480", client.WithHolder("worker-3@host"))
//	if err != nil {
//		return err
//	}
//	defer c.Close() // ends and releases the leases it still keeps alive
//
//	lease, err := c.Acquire(ctx, "orders/shard-7", client.WithTTL(10*time.Second))
//	var held *fence.HeldError
//	if errors.As(err, &held) {
//		return fmt.Errorf("%s holds it with token %d", held.Holder, held.Token)
//	} else if err != nil {
//		return err
//	}
//	defer lease.Release(context.WithoutCancel(ctx))
//
//	err = writeOrder(lease.Context(), lease.Token(), order)
//	if errors.Is(err, fence.ErrStale) {
//		lease.MarkLost(err) // a newer holder exists: stop, never retry with this token
//	}
//
// [Client.Acquire] returns a *[Lease] that keeps itself alive: it renews at
// about a third of its TTL and watches its own validity. The leases of one
// Client renew together: while one renewal call is out, those that come
// due wait and go in the next, so thousands of leases cost a few calls. [Client.Grant]
// acquires once and returns a plain [fence.Lease]; nothing renews it, so
// the caller must call [Client.Renew] (or [Client.RenewBatch], for many
// leases in one call) within each TTL and [Client.Release] at the end, by
// scope and lease ID. Grant suits programs that run their
// own timers or hand the lease ID to another process; most programs want
// Acquire. Both answer a held scope with a *[fence.HeldError] naming the
// holder, its token and its time left, unless [WithWait] is given: then
// the acquire waits in line behind the holder, first come first served,
// until it is granted or its context ends. A waiter whose context ends
// leaves the queue and gets an error that matches the context's error
// (context.DeadlineExceeded or context.Canceled); give waits a deadline.
//
// # What a Lease guarantees
//
// A Lease counts itself valid until the send time of its last confirmed
// renewal (at first, of its acquire) plus the TTL, minus a drift margin
// ([WithDriftMargin], by default a twentieth of the TTL and at least 5ms),
// measured on this process's monotonic clock; [Lease.ValidUntil] reports
// that instant. The service starts a lease's deadline when it processes the
// request, after it was sent, so the lease gives up its authority before
// the service can expire it and grant the scope to someone else, as long as
// the two clocks advance at rates that differ by less than the margin.
// A grant that an earlier attempt may have obtained (an acquire retried
// after a lost answer, or one that carries the request ID the caller chose
// with [WithRequestID], which an earlier call may have used) started its
// deadline before this send, so Acquire renews it once before returning, and
// the lease counts from that renewal. So it does when a wait in line took
// more than a third of the TTL; a shorter wait counts from the acquire's
// send time, before the grant.
//
// The lease reports itself lost, once and for good, when the first of these
// happens: its local validity runs out without a newer confirmed renewal
// (for example because the service cannot be reached); the service answers
// that it is no longer the current lease (it expired, or was released or
// superseded); its holder calls [Lease.MarkLost]; or it is released. Then
// [Lease.Done] is closed, [Lease.Context] is cancelled with the reason as
// its cause (context.Cause), and [Lease.Err] returns that reason, an error
// that matches [fence.ErrLeaseLost]. A lost lease never comes back: acquire
// a new one, which starts a new epoch with a greater token.
//
// Run the lease's work under [Lease.Context] so it stops when authority
// ends, and call [Lease.MarkLost] when a guard rejects the token as stale:
// a newer holder has written, and this lease must stop acting. MarkLost
// does not release the scope at the service, because a newer holder may
// already own it; the lease simply stops renewing. Never retry a write that
// a guard rejected with the same token: it can never succeed, and this
// package never does it for you. Acquire again and write with the new,
// greater token.
//
// # The holder's rules
//
// These are the rules of docs/protocol.md, "The holder's rules", which the
// TypeScript and Python clients follow too; a Lease keeps the first four
// for its holder, and the holder keeps the rest:
//
//  1. Renew every third of the TTL, counted from the send time of the last
//     confirmed renewal (at first, of the acquire). A renewal that fails
//     for a transient reason is sent again after a twentieth of the TTL (at
//     least 10ms), at the next address if the node seems down, for as long
//     as the lease is valid.
//  2. Count validity on a monotonic clock, from the send time: until the
//     send time of the last confirmed renewal plus the TTL, minus a drift
//     margin of a twentieth of the TTL and at least 5ms ([WithDriftMargin]),
//     on Go's monotonic clock, never the wall clock, the service's
//     expiresIn, or the time the answer arrived ([Lease.ValidUntil]).
//  3. A grant obtained by a retry started earlier: an acquire retried with
//     its request ID, or one that waited in line more than a third of the
//     TTL, renews it once before returning and counts from that renewal.
//  4. The lease is lost, for good, when a renewal is refused, when its
//     validity passes without a confirmed renewal (it is then released, in
//     case a late renewal was granted), or when its holder calls
//     [Lease.MarkLost] because a guard refused its token as stale:
//     [Lease.Done] closes and [Lease.Context] is cancelled. Stop every write under its token then; acquire anew for
//     a greater token.
//  5. Never retry a write a guard refused as stale with the same token: a
//     newer holder exists. Do not release to free the scope: it is someone
//     else's.
//  6. Send the newest [Lease.Token] with every write: each renewal signs it
//     with the key that signs then, and after a key rotation's grace period
//     guards refuse the old key's signature.
//  7. Keep the lease ID and the request ID secret: they renew, release and
//     fetch the grant. Log the token, never [Lease.ID]; give a child process
//     the token, not the lease ID.
//  8. Release when done ([Lease.Release], or [Client.Close]), so the next
//     holder need not wait for the TTL.
//
// # Errors
//
// Errors match fence's sentinels with errors.Is: [fence.ErrHeld] (a
// *[fence.HeldError]), [fence.ErrLeaseLost] (often a *[fence.LostError] with
// the scope's current token), [fence.ErrNotHolder] (a lease ID the service
// does not know for that scope), [fence.ErrInvalid] (a *[fence.InvalidError] naming the
// rejected field), [fence.ErrTokensExhausted] and [fence.ErrUnavailable];
// a call the service refuses before it looks at leases, with
// [fence.ErrUnauthenticated] (no valid credentials),
// [fence.ErrPermissionDenied] (the auth file's rules do not allow it) or
// [fence.ErrUnimplemented] (a service older than the call). A call whose
// context ends returns that context's error, and never a success it
// learned of afterwards.
//
// # Retries
//
// Every call is retried while the service is unreachable or has no leader
// ([fence.ErrUnavailable]), with exponential backoff and jitter (20ms
// doubling to 100ms, so that a call finds a new leader soon after it
// serves), until it succeeds, its context ends, or [WithRetryTimeout]
// (10s by default) passes. Retries of one acquire carry the same request ID, so the service
// answers a retry with the grant of an earlier attempt instead of issuing a
// second token. [WithRequestID] sets the ID, so that a caller's own retry
// of an acquire is recognised as well: while that grant is current the
// same request ID returns it again (same token, same lease ID), and once it
// has ended the request ID answers [fence.ErrLeaseLost] for as long as the
// grant is among the scope's four most recent grants.
// Renewals and releases are retried too: renewing is idempotent, and a
// release retried after an attempt whose answer was cut off reports
// success if the lease turns out to be no longer current.
//
// # Batching
//
// Concurrent calls on one Client share calls to the service: an Acquire
// (or Grant) without [WithWait], a Renew or a Release that finds none of
// its kind in flight goes out at once, alone; the ones made while it is in
// flight wait for it and then leave together, up to 256 in one batch call
// (AcquireBatch, RenewBatch, ReleaseBatch), which the service writes as one
// log entry. There is no timer, so a lone caller waits for nothing; under
// load each batch carries the calls made during the last one. Each caller
// gets its own answer and its own error, the one the single call would
// have given, and a batch is retried as a whole with the same request IDs,
// so the retry rules above hold for every acquire in it. Each caller
// returns when its own context ends, whatever the others of its batch wait
// for: a call not sent yet is dropped, and the answer to one sent is. A waiting acquire
// always goes alone: its wait would hold back the rest of a batch. A
// service too old for the batch calls is called once per caller.
//
// # Several addresses
//
// A replicated fenced runs as a cluster of three or five nodes. Give New
// every node's address, comma-separated, in the order to try them:
//
//	c, err := client.New("10.0.0.1:7480,10.0.0.2:7480,10.0.0.3:7480")
//
// Any live node takes any call: followers forward lease calls and
// membership changes to the leader. The client sends its calls to one
// address at a time, the first at the start. When a call finds that node
// unavailable (refused or reset connections, answers cut off, or a node
// that knows no leader), the client moves to the next address in the list,
// wrapping around, and retries there after the usual backoff (at once
// after a refused connection, once around the list); it stays on
// the new address for later calls, including the renewals of every
// [Lease]. The retry budget of [WithRetryTimeout] is for the whole call,
// across every address it tries: with a budget of 0 a call makes one
// attempt, at one address. An acquire keeps its request ID across
// addresses, so an acquire whose answer was lost in a failover gets the
// grant that answer carried, never a second token.
//
// [Client.ClusterStatus] reports the cluster as the node the client is
// talking to sees it; [Client.AddNode] and [Client.RemoveNode] change its
// membership.
//
// # Connections
//
// A call goes over an HTTP/1.1 connection of its own, kept open for the
// next call, while fewer than 64 of the client's calls to the node are
// under way that way; the calls beyond those, and every watch, share one
// HTTP/2 connection a node. fenced answers an HTTP/1.1 call on the
// goroutine that read it, and a lone caller's calls take about a quarter
// less time than over HTTP/2. fenced closes a connection beyond its limits
// (--max-conns, --max-conns-per-addr) as it accepts it: a call whose own
// connection breaks before it is answered goes again at once over the
// HTTP/2 connection, the client closes its idle connections of their own,
// and its calls to that node share the HTTP/2 connection for a minute. A
// call under way for two seconds has its node probed (GET /healthz, over
// the HTTP/2 connection) every two seconds while it lasts: a node that does
// not answer a probe within two seconds (paused, frozen, cut off) has the
// call cancelled, and the call fails over to the next address as one on a
// broken connection does. Watches and the calls on the HTTP/2 connection
// are covered by its pings as well. [WithHTTPClient] replaces both
// connections with one client of your own.
//
// # Watching and electing
//
// [Client.Watch] follows the lease events of the scopes under a prefix as
// the service's leader records them (grants, renewals, releases, expiries,
// renewals answered lost, stale rejections reported by guards), and
// reconnects and resumes by itself. [Election] elects one leader per scope
// on top of Acquire with WithWait and Watch: [Election.Campaign] waits in
// line and returns the leader's [Lease], whose token fences the leader's
// writes; [Election.Observe] follows who leads.
//
// # Caveats
//
// A valid Lease does not make a write safe on its own: authority can end
// between a check of [Lease.Err] and the write reaching the resource. Only
// a guard that compares tokens next to the side effect makes it safe;
// checking the lease first only saves work that would be refused.
//
// A process that is paused (garbage collection, SIGSTOP, a frozen virtual
// machine) notices a lost lease only when it runs again; until its next
// timer fires, Err may still return nil after the deadline has passed. Its
// stale writes are stopped by the guard, not by the lease.
//
// The service remembers request IDs only for a scope's four most recent
// grants; after that a request ID is forgotten and an acquire carrying it is
// a new acquire. Use a request ID for the retries of one acquire, never as a
// standing name for a holder.
//
// Releasing a lease that is already lost, including after MarkLost, does
// not contact the service and returns the reason it was lost at once. If
// the service still counts that lease current, the scope stays held until
// its TTL runs out; except after the lease's local validity ran out, when
// the keep-alive itself releases it, since a renewal the service granted
// may have been answered too late (a release frees the scope only while the
// lease is current, so it takes nothing from a newer holder). That release
// is best effort and bounded by the TTL; Release does not wait for it, so a
// deferred Release returns at once in a partition too.
//
// With signed tokens, [Lease.Token] follows the service's signing key: each
// renewal brings the token signed with the key that signs then, with the
// same value. Read the token for each write rather than once per lease, so
// that guards still accept it after a key rotation and the old key's grace
// period.
//
// Every acquire asks for a TTL: 10s unless [WithTTL] says otherwise. A
// service whose maximum TTL is lower refuses an acquire without WithTTL
// with a *[fence.InvalidError] for the field "ttl".
//
// A client moves to another address only when the one it uses fails; it
// neither spreads its calls over the nodes nor goes back to an earlier
// address once that node recovers. Clients that list the nodes in the same
// order all send their calls to the same node while it lives.
//
// A RemoveNode whose answer was cut off is retried like any call; if the
// lost attempt did remove the node, the retry may fail although the node
// is gone. [Client.ClusterStatus] shows the outcome.
package client
