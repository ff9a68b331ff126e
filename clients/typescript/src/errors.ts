// The errors of the client, the token parser and the guards. Test for them
// with instanceof: every one is a FenceError, and each carries the message
// the service (or the guard) gave.

/** FenceError is the base class of every error this package throws. */
export class FenceError extends Error {
  /** The Connect code the service answered, when the error came from it. */
  readonly code: string | undefined;

  constructor(message: string, options?: { code?: string; cause?: unknown }) {
    super(message, options?.cause === undefined ? undefined : { cause: options.cause });
    this.name = new.target.name;
    this.code = options?.code;
  }
}

/**
 * InvalidError reports a malformed request or token: a bad scope, TTL,
 * holder, lease ID or token text, or a token whose signature does not
 * verify. Nothing was changed. `field` names what was wrong ("scope",
 * "ttl", "token").
 */
export class InvalidError extends FenceError {
  readonly field: string;

  constructor(field: string, message: string, options?: { code?: string; cause?: unknown }) {
    super(message, { code: options?.code ?? "invalid_argument", cause: options?.cause });
    this.field = field;
  }
}

/**
 * HeldError reports that an acquire found the scope held by another lease:
 * its holder, its token and its time left as the service saw it.
 */
export class HeldError extends FenceError {
  readonly scope: string;
  readonly holder: string;
  readonly token: bigint;
  /** The holder's time left in milliseconds, as the service saw it. */
  readonly expiresInMs: number;

  constructor(message: string, c: { scope: string; holder: string; token: bigint; expiresInMs: number }) {
    super(message, { code: "aborted" });
    this.scope = c.scope;
    this.holder = c.holder;
    this.token = c.token;
    this.expiresInMs = c.expiresInMs;
  }
}

/**
 * LostError reports that a lease is no longer current: it expired, was
 * released or superseded, no renewal was confirmed within its TTL, or a
 * guard refused its token as stale. Its holder must stop acting on it.
 * `current` is the scope's current token when known (0n if free or
 * unknown).
 */
export class LostError extends FenceError {
  readonly scope: string;
  readonly token: bigint;
  readonly current: bigint;
  readonly reason: string;

  constructor(message: string, c: { scope: string; token: bigint; current?: bigint; reason: string; code?: string; cause?: unknown }) {
    super(message, { code: c.code, cause: c.cause });
    this.scope = c.scope;
    this.token = c.token;
    this.current = c.current ?? 0n;
    this.reason = c.reason;
  }
}

/**
 * NotHolderError reports a renew or release with a lease ID the service does
 * not know for that scope.
 */
export class NotHolderError extends FenceError {}

/**
 * UnavailableError reports that the service could not be reached, answered
 * something that is not its API, or has no leader right now. The request may
 * or may not have been applied.
 */
export class UnavailableError extends FenceError {}

/**
 * StaleError reports a write refused because its scope already accepted a
 * newer one: by a guard of this package, or by a server that answered 409
 * with the stale-token problem. The lease that wrote is lost; retrying with
 * the same token can never succeed.
 */
export class StaleError extends FenceError {
  readonly scope: string;
  readonly presented: bigint;
  readonly highest: bigint;
  /** Sequence numbers, when the write carried one (else 0n). */
  readonly presentedSeq: bigint;
  readonly highestSeq: bigint;

  constructor(c: { scope: string; presented: bigint; highest: bigint; presentedSeq?: bigint; highestSeq?: bigint }) {
    const presentedSeq = c.presentedSeq ?? 0n;
    const highestSeq = c.highestSeq ?? 0n;
    // The same words as Go's guard.StaleError, which the 409 body's detail
    // carries.
    super(
      c.presented === c.highest
        ? `stale write to "${c.scope}": token ${c.presented} sequence ${presentedSeq} is not after sequence ${highestSeq}`
        : `stale fencing token for "${c.scope}": token ${c.presented} was superseded by token ${c.highest}`,
    );
    this.scope = c.scope;
    this.presented = c.presented;
    this.highest = c.highest;
    this.presentedSeq = presentedSeq;
    this.highestSeq = highestSeq;
  }
}
