// Package fsm is fence's lease state machine: scopes, leases, per-scope
// token counters and FIFO waiters, changed only by applying commands.
//
// The machine is pure. It reads no clock, draws no random numbers, does no
// I/O and starts no goroutines: the proposer stamps the time and the new
// lease ID into each Command before it is replicated, so every replica that
// applies the same commands in the same order reaches byte-identical state
// (see State.Snapshot).
//
// Lease deadlines are not part of this state. Renewals change no token, so
// they stay off the log; the leader keeps deadlines on its own monotonic
// clock and proposes Expire{Scope, Token} when one passes. Expire applies
// only if that token is still current, so an expiry that raced with a
// release or a new grant changes nothing.
//
// Invariants kept here:
//   - a scope's counter only grows; every grant takes counter+1, so tokens of
//     successive grants strictly increase and never repeat, whatever happens
//     to the lease (release, expiry, snapshot and restore);
//   - renew and release succeed only for the current lease ID;
//   - the counter refuses to pass fence.MaxToken rather than wrap.
package fsm
