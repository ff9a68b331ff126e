// Package lessor is the leader's side of the lease lifecycle: it takes and
// leaves office, keeps every held lease's deadline, expires the leases whose
// deadline passes by proposing their expiry, and answers acquires (waiting
// in line included), renewals and releases. It knows nothing of RPCs,
// authorization or events shown to people: the server wires it to those.
//
// # The pipeline
//
// Every write reaches the node through one door, Lessor.submit: the
// acquires, releases and batches callers ask for (Acquire, Release, Batch,
// through propose, which takes the parked waiting acquires along), the
// promote of taking office, the expiries, and a waiter's withdrawal from
// its line. Each command is applied before submit returns; what it changed
// comes back through Applied, in log order, before its proposer is
// answered. The files follow the jobs:
//
//   - lessor.go: the Lessor, its Node and Config, and what the node tells
//     it (Applied, Restored).
//   - office.go: taking and leaving office (Lead, Stop).
//   - propose.go: the writes callers ask for, propose and submit.
//   - wait.go: a waiting acquire's life (below) and the flusher of parked
//     acquires.
//   - joins.go: the waiting acquires parked on the leader; parked.go: the
//     order they go in, a pure structure tested without goroutines.
//   - waiters.go: the grants that waiters in line wait for.
//   - deadlines.go, expiry.go: every held lease's deadline, and proposing
//     the expiry of those that pass.
//   - renew.go: renewals, which write nothing.
//
// # Renewals
//
// RenewBatch moves deadlines and then, if it renewed any, confirms that the
// node still leads (Node.ConfirmLeader) before it returns: an error means
// no renewal of the batch may be confirmed to its holder. The rule lives
// here so that no RPC path can skip it.
//
// # A waiting acquire's life
//
// Every acquire with wait goes through these states, in this order, and
// leaves by one of the answers named (Acquire, wait, carry, inLine):
//
//  1. Admitted: Config.Admit counts it against its owner until answered.
//  2. Listening: registered under its wait key (request ID, else lease
//     ID), before anything is proposed, since the grant may be applied
//     before the proposal returns.
//  3. Parked (joins): in office, from fsm.WaitBatchFormat on, it waits on
//     the leader, behind the earlier waiting acquires of its scope, for an
//     entry to carry it: the next one proposed while none that carries
//     acquires of its scope is on its way (so that the log has them in
//     the order they came), one its own caller proposes at once if its
//     scope is free and nothing of its scope is parked or on its way, or
//     the flusher's once its scope frees or after maxPark. Out of office,
//     or below that format, it skips this state and is proposed alone.
//     Leaves: its caller gives up (context error, nothing proposed); the
//     office ends (leader changed).
//  4. Carried: in an entry on its way. Leaves with the entry's result for
//     it (granted, held, refused: answered as such; queued: on to 5) or its
//     error (outcome unknown: the caller retries with its request ID).
//  5. In line: in the state machine's line, for as long as the office that
//     answered it queued lasts. Leaves: its grant (granted); its removal by
//     a new leader's promote (leader changed); the end of the office
//     (leader changed: a leader deposed and cut off never applies the next
//     one's promote, and its waiter must not hang; the line is not
//     withdrawn, the next promote drops it and a retry with the same
//     request ID finds its place if it outlived the office); its caller
//     gives up (it proposes its own withdrawal, unless another attempt of
//     the same request ID waits in that place or was answered with its
//     grant).
//
// "Leader changed" is fence.ErrUnavailable: the client retries at the next
// leader.
//
// # Lock order
//
// Five locks meet here, on four levels; whoever holds one of them takes
// only those of the levels below its own:
//
//  1. Lessor.mu, the office: taking office begins it under it, leaving
//     office ends it and cancels its work under it.
//  2. joins.mu, the parked waiting acquires.
//  3. The state machine's lock, held by Node.Read and by the writer that
//     applies commands.
//  4. deadlines.mu, and waiters.mu beside it (never both at once).
//
// The state machine's writer takes 3 and then, after releasing it, 4
// (Applied). sync.RWMutex holds new readers back behind a waiting writer, so
// a reader that held 4 and then asked for 3 would close a cycle with it.
package lessor
