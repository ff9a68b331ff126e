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
//   - a scope whose record was dropped starts again at the floor, which is
//     at least every counter ever dropped, so its tokens stay above every
//     token it had before;
//   - renew and release succeed only for the current lease ID;
//   - the counter refuses to pass fence.MaxToken rather than wrap.
//
// # Log formats
//
// What a command does is fixed by the cluster's log format (State.Format,
// LogFormat), which only an OpSetFormat entry raises, so every replica
// switches at the same entry, whichever build it runs. Under format 1 every
// scope record is kept for good. From format 2 on, a scope with no lease,
// no waiter and tokens left is idle; the idle records beyond the newest few
// thousand are dropped, oldest first, and their counters go into the
// floor. The records kept are then the held scopes, the scopes with
// waiters, and those few thousand, however many scopes were ever used.
//
// The idle records are kept for the answers that need a scope's recent
// grants: a retried acquire with a request ID whose grant has ended
// answers Lost, and a renew or release with a superseded lease ID answers
// Lost. Once a scope's record is dropped, the retried acquire is granted
// anew (a token above the floor) and the renew or release answers
// NotHolder: either way the caller learns that its old lease is gone. Get
// reports the floor as the Last token of a scope without a record: at
// least every token it had, below every token it will have.
//
// From format 3 on, an OpBatch entry carries acquires (without wait) and
// releases of many callers; each applies exactly as it would as an entry
// of its own, with its own Result, so one log entry and one fsync serve
// them all. Below format 3 a batch is refused whole: the leader proposes
// one entry per command there, since a build that knew no batch would
// stop at it.
//
// From format 4 on, an OpAddKey may carry ActivateAt: the new key is
// published (SigningKeys) at once and signs from that time on (SignerAt),
// so guards fetch it before the first token carries it. Below format 4 a
// key that signs later is refused, and a new key signs from its entry on,
// as before: a build that ignored the field would sign with it at once,
// and builds before format 4 refuse unknown fields and stop.
//
// From format 5 on, an OpBatch may carry waiting acquires: the leader puts
// the acquires waiting for a held scope into the next entry it proposes,
// a release's included, so that joining a line costs no fsync of its own.
// A waiting acquire applies in a batch as it would alone (queued, or
// granted). Below format 5 such a batch is refused whole, as the builds
// before it refuse it.
//
// Format 6 changes no command, only how entries are written: the proposer
// encodes them in protobuf (Command.EncodeFor, api/fence/log/v1) rather
// than JSON, which the goroutine that applies the log decodes about four
// times faster. DecodeCommand reads both forms at every format, and they
// decode to the same Command. A binary entry starts with a byte no JSON
// text starts with, so builds before format 6 stop at it.
//
// # Caveats
//
// The floor is shared: a scope created after a busy scope was dropped
// starts above that scope's tokens. Tokens are only compared within a
// scope, so this costs nothing but the numbers' size; a counter climbs by
// at most the grants of the busiest scope, far from fence.MaxToken. A
// scope that reached fence.MaxToken is never dropped, lest the floor
// leave no token for any new scope.
//
// An entry this build cannot decode (DecodeCommand's ErrUnknownEntry) was
// written by a newer build or is corrupt. Applying it as a no-op would make
// this replica differ from those that understand it, so the caller must
// stop applying (see package raftnode).
package fsm
