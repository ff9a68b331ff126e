// Package follow keeps a guard's marks in step with the lease service: a
// Follower watches the service for the scopes under a prefix and advances
// a guard.Store's mark at each grant and at each closing, the token value
// the service consumes when a lease is released or expires (log format 8,
// docs/design.md, "Eager fencing"). A lease that ended is then refused at
// the resource before anyone else writes there, instead of when the next
// holder first writes.
//
// # Usage
//
//	f := follow.New(c, store, "orders/")
//	go f.Run(ctx) // until ctx ends
//	...
//	lag := f.Lag() // how far behind the service it is
//
// Lag, Advanced, Resyncs, Position and LastError report its progress;
// guardmetrics.NewFollowerCollector exports them to Prometheus.
//
// The store is the one the writers' guard uses (guard.MemoryStore,
// boltguard, sqlguard, pgxguard's, redisguard's or s3guard's): the follower moves its
// marks with the store's own Fence and an apply that does nothing, the
// monotonic advance every writer uses, so it never moves a mark backwards
// and never races a writer.
//
// # Caveats
//
// A follower shortens the window in which an ended lease's late write is
// accepted; it is not what makes fencing safe. A follower that is stopped,
// slow or cut off costs the window, never safety: the next holder's first
// write still refuses the old token, as without a follower. The window is
// the time from the end of a lease to the mark's advance: the service's
// commit, the watch's delivery and one Fence of the store (Lag reports it).
//
// After a disconnection the follower resumes the watch where it was. When
// the service no longer holds the events to resume from (a change of
// leader, or a follower that fell ten thousand events behind), it reads
// the current state instead: the held leases under the prefix, and by Get
// each scope whose lease it saw begin and not end, whose last token, for
// a scope now free, is the closing it missed. So every lease whose grant
// (or hold) it received is closed, gap or not. A lease granted and ended
// inside such a gap, which it never saw, is not advanced until the
// scope's next event. In memory it keeps those leases it knows held, and
// the marks not yet recorded: a scope whose closing is recorded and that
// is free again is forgotten, so a follower over short-lived scopes (one
// per job) stays as small as the leases held at once, and a resync reads
// no more. When it starts, a follower of a store that names its
// scopes (a guard.Lister: boltguard, sqlguard, pgxguard, redisguard and
// s3guard's stores) reads, that once, the state of each scope under the prefix that
// the store has a mark for, so that a lease that ended while no follower ran is
// closed too; over another store such a lease stays open until the
// scope's next event. Events reach a follower from the moment the service
// takes its watch, when Position turns non-zero: a program that must know
// its follower sees a grant (a test, a demo) waits for that first.
//
// The service's tokens are signed; closing tokens are not, being granted
// to nobody. The follower writes to the store directly, so a Guard's
// Verifier does not see them.
package follow
