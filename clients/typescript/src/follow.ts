// Eager fencing (docs/design.md, "Eager fencing"; Go's guard/follow): a
// Follower watches fenced for the scopes under a prefix and advances a
// guard's marks to each grant's token and to each ended lease's closing
// token, so that the ended lease's late writes are refused at the resource
// before anyone else has written there.

import { delay, type Client } from "./client.js";
import { FenceError, StaleError } from "./errors.js";
import type { MarkStore } from "./guard.js";
import { MAX_TOKEN, validateScope } from "./token.js";
import type { WatchEvent } from "./watch.js";

/**
 * MarkAdvancer moves a scope's mark up to a token, with the guard's own
 * monotonic advance, the one its writers use: a mark already at or past the
 * token stays where it is (the advance may then throw a StaleError, which
 * counts as done). pgMarkAdvancer, redisMarkAdvancer and
 * markStoreAdvancer make one.
 */
export interface MarkAdvancer {
  advance(scope: string, token: bigint): Promise<void>;
  /**
   * scopes, when the store can name its scopes (Go's guard.Lister), lists
   * the scopes starting with prefix that have a mark. A Follower that
   * starts reads fenced's state of each, so that a lease that ended while
   * no follower ran is closed too. pgMarkAdvancer's and
   * redisMarkAdvancer's have it.
   */
  scopes?(prefix: string): Promise<string[]>;
}

/**
 * markStoreAdvancer advances the marks of a MarkStore (a MemoryMarkStore,
 * or one of your own) with its fence and an apply that does nothing.
 */
export function markStoreAdvancer(store: MarkStore): MarkAdvancer {
  return { advance: (scope, token) => store.fence({ token: { version: 1, scope, value: token } }, false, async () => undefined) };
}

/** FollowerOptions configure a Follower. */
export interface FollowerOptions {
  /** How many scopes' marks are advanced at once (default 8). One scope's advances never overlap. */
  concurrency?: number;
  /** Told of disconnections, resyncs and failed advances (default: a line on stderr). */
  onWarning?: (message: string, err?: unknown) => void;
}

interface Want {
  token: bigint;
  /** When fenced recorded the event that named it (Date.now() scale). */
  at: number;
}

/**
 * Follower advances a guard's marks from fenced's watch stream, for the
 * scopes starting with a prefix: to each grant's token (and each held
 * lease's, when it starts or reads the state again) and, when a lease is
 * released or expires, to its closing token, the value fenced consumed and
 * granted to nobody (log format 8). A mark advanced to the closing refuses
 * the ended lease's token, and every later grant is above it. Marks of a
 * scope are coalesced: only the highest waiting is written. It never moves
 * a mark back: it uses the guard's own advance, as writers do, and a mark
 * already past counts as done; a failed advance is retried, never dropped.
 *
 * Cut off from fenced, it resumes the watch after the last response it
 * read; when fenced no longer holds those events (out_of_range: a new
 * leader, a restart, a long absence) or the watch never started, it watches
 * again from now with the held leases and reads (Client.get) each scope
 * whose lease it saw begin and not end, advancing to its lease's token or
 * its last token, the closing it missed: every lease whose grant it
 * received is closed, gap or not; one granted and ended inside the gap
 * stays open until its scope's next event. It keeps in memory only those
 * leases and the marks not yet recorded: a scope whose closing it received
 * is forgotten once recorded, so a follower over short-lived scopes (one
 * per job) stays as small as the leases held at once. When its
 * MarkAdvancer names the scopes that have a mark (scopes), a follower that
 * starts reads each under its prefix too, that once, when its first watch
 * has started, closing the leases that ended while no follower ran. A
 * follower that is behind or stopped costs only the window it closes,
 * never safety: the guard's rule still refuses every token older than one
 * it accepted.
 *
 * Run it with run(signal). lagMs, advanced and resyncs say how it does.
 * Its methods are safe to call at any time; run runs once.
 */
export class Follower {
  readonly prefix: string;
  readonly #client: Client;
  readonly #marks: MarkAdvancer;
  readonly #par: number;
  readonly #warn: (message: string, err?: unknown) => void;
  readonly #pending = new Map<string, Want>();
  readonly #inflight = new Map<string, Want>();
  /**
   * By scope, the token of the newest lease an event or a read of the state
   * showed held and no event has shown ended: the scopes a resync reads.
   */
  readonly #open = new Map<string, bigint>();
  /** That the store's own scopes (MarkAdvancer.scopes) were read, at the first start of the watch. */
  #listed = false;
  /** While the watch is broken or the state is read again: since when (Date.now()); 0 otherwise. */
  #behind = 0;
  #signal: AbortSignal | undefined;
  #started = false;
  #advanced = 0;
  #resyncs = 0;
  #idle: (() => void) | undefined;

  constructor(client: Client, marks: MarkAdvancer, prefix = "", opts: FollowerOptions = {}) {
    this.#client = client;
    this.#marks = marks;
    this.prefix = prefix;
    this.#par = Math.max(Math.floor(opts.concurrency ?? 8), 1);
    this.#warn =
      opts.onWarning ?? ((msg, err) => process.stderr.write(`fence: follow "${prefix}": ${msg}${err === undefined ? "" : `: ${(err as Error)?.message ?? err}`}\n`));
  }

  /**
   * lagMs is how far behind fenced the follower is, in milliseconds: the age
   * of the oldest grant or closing it received and has not yet recorded in
   * the guard, by the time fenced recorded it (so it includes the watch's
   * delivery and the two clocks' difference), or, while its watch is broken
   * or it reads the state again, the time since it lost the stream. 0 when
   * it has recorded everything it received.
   */
  get lagMs(): number {
    const now = Date.now();
    let lag = this.#behind === 0 ? 0 : now - this.#behind;
    for (const set of [this.#pending, this.#inflight]) {
      for (const w of set.values()) lag = Math.max(lag, now - w.at);
    }
    return Math.max(lag, 0);
  }

  /** advanced is how many marks it has advanced (including advances the guard found already done). */
  get advanced(): number {
    return this.#advanced;
  }

  /** resyncs is how many times it read the state again because fenced no longer held the events to resume from. */
  get resyncs(): number {
    return this.#resyncs;
  }

  /**
   * run follows fenced until signal aborts, then waits for the advances
   * under way and resolves. It rejects earlier only for a failure that
   * retrying cannot mend: an invalid prefix, or credentials that may not
   * watch it. While it runs, its open watch keeps Node running.
   */
  async run(signal: AbortSignal): Promise<void> {
    if (this.#started) throw new FenceError(`follow "${this.prefix}": run was called before`);
    this.#started = true;
    const ac = new AbortController();
    const stop = () => ac.abort(signal.reason);
    if (signal.aborted) stop();
    signal.addEventListener("abort", stop, { once: true });
    this.#signal = ac.signal;
    try {
      await this.#watch(ac.signal);
    } finally {
      signal.removeEventListener("abort", stop);
      ac.abort();
      // Let the advances under way finish: none is left half done.
      while (this.#inflight.size > 0) await new Promise<void>((resolve) => (this.#idle = resolve));
    }
  }

  /** #watch consumes the watch stream, resuming after disconnections and reading the state again when it cannot resume. */
  async #watch(signal: AbortSignal): Promise<void> {
    let pos = 0n; // the position to resume from; 0n: start afresh
    // A store that names its scopes lets a follower that starts afresh
    // close the leases that ended while none ran: it reads their state once
    // the watch has started, as after missed events.
    let resync = this.#marks.scopes !== undefined;
    let backoff = 50;
    while (!signal.aborted) {
      if (resync) pos = 0n;
      let err: unknown;
      try {
        for await (const resp of this.#client.watch(this.prefix, { startPosition: pos, includeHeld: pos === 0n, signal })) {
          for (const e of resp.events) {
            if (e.position !== 0n && !resync) pos = e.position + 1n;
            this.#event(e);
          }
          // fenced has taken the watch's start: whatever happens from here
          // on is in the stream, so a state read now misses nothing.
          backoff = 50;
          if (resync) {
            try {
              await this.#resync(signal);
            } catch (rerr) {
              if (signal.aborted) return;
              // Watch again from now and read the state again then.
              throw new FenceError(`could not read the state again: ${(rerr as Error)?.message ?? rerr}`, { code: "unavailable", cause: rerr });
            }
            resync = false;
          }
          pos = resp.nextPosition;
          this.#behind = 0;
        }
        err = new FenceError("the watch stream ended", { code: "unavailable" });
      } catch (e) {
        err = e;
      }
      if (signal.aborted) return;
      if (this.#behind === 0) this.#behind = Date.now();
      const code = err instanceof FenceError ? err.code : undefined;
      if (code === "out_of_range") {
        this.#warn("fenced no longer holds the events to resume from; reading the state again", err);
        resync = true;
      } else if (code === "invalid_argument" || code === "permission_denied" || code === "unauthenticated") {
        throw err;
      } else {
        // Node's fetch ends a body quiet for 300 s (undici's bodyTimeout),
        // and a watch is quiet while nothing happens: resume, unannounced.
        if (!quietTimeout(err)) this.#warn(`the watch broke at position ${pos}; resuming`, err);
        // It never started: what ended meanwhile is known only from the state.
        if (pos === 0n) resync = true;
      }
      await delay(Math.random() * backoff + 1, signal);
      backoff = Math.min(2 * backoff, 2000);
    }
  }

  /**
   * #resync reads the state of the scopes whose lease it saw begin and not
   * end, and the first time, for a store that names its scopes
   * (MarkAdvancer.scopes), of every scope under the prefix the store has a
   * mark for (not counted in resyncs): a held scope advances to its lease's
   * token, a free one to its last token (its closing, from log format 8
   * on). A held scope's last token may be above its lease's (a token
   * floor), so it is not used. The leases held now that it did not see
   * begin come as the watch's held events. Up to concurrency scopes are
   * read at once.
   */
  async #resync(signal: AbortSignal): Promise<void> {
    const read = new Set(this.#open.keys());
    const scopesOf = this.#listed ? undefined : this.#marks.scopes?.bind(this.#marks);
    if (scopesOf !== undefined) {
      let listed: string[];
      try {
        listed = await scopesOf(this.prefix);
      } catch (err) {
        throw new FenceError(`list the store's scopes: ${(err as Error)?.message ?? err}`, { code: "unavailable", cause: err });
      }
      for (const scope of listed) {
        // A name that is no scope (a key another program made) would fail
        // every read; the store's answer is only a hint.
        if (typeof scope === "string" && scope.startsWith(this.prefix) && isScope(scope)) read.add(scope);
      }
    } else {
      this.#resyncs++;
    }
    const now = Date.now();
    const scopes = [...read];
    let next = 0;
    const worker = async () => {
      while (next < scopes.length && !signal.aborted) {
        const scope = scopes[next++]!;
        const st = await this.#client.get(scope, { signal });
        const token = st.lease?.token ?? st.lastToken;
        this.#want(scope, token, now);
        this.#track(scope, token, st.lease !== undefined);
      }
    };
    // The first failure rejects; the other readers stop at their next scope.
    const workers = Array.from({ length: Math.min(this.#par, scopes.length) }, worker);
    try {
      await Promise.all(workers);
    } finally {
      next = scopes.length;
      await Promise.allSettled(workers);
    }
    // Only now: after a failed read the next try reads all again, the
    // store's scopes too.
    if (scopesOf !== undefined) this.#listed = true;
  }

  #event(e: WatchEvent): void {
    const at = e.time?.getTime() ?? Date.now();
    switch (e.kind) {
      case "granted":
      case "held":
        this.#want(e.scope, e.token, at);
        this.#track(e.scope, e.token, true);
        break;
      case "released":
      case "expired":
        // Under a log format before 8 nothing is closed: the token itself
        // still refuses every older one.
        this.#want(e.scope, e.closingToken > e.token ? e.closingToken : e.token, at);
        this.#track(e.scope, e.token, false);
        break;
      case "lost":
        if (e.currentToken !== 0n) this.#want(e.scope, e.currentToken, at);
        break;
    }
  }

  /** #want records that scope's mark should be at least token. */
  #want(scope: string, token: bigint, at: number): void {
    if (token <= 0n || token > MAX_TOKEN || scope === "") return;
    const now = Date.now();
    if (!Number.isFinite(at) || at > now) at = now;
    const p = this.#pending.get(scope);
    if (p === undefined || token > p.token) {
      // The oldest wait counts.
      this.#pending.set(scope, { token, at: p === undefined ? at : p.at });
    }
    this.#pump();
  }

  /**
   * #track records that the lease with token began (held) or that every
   * lease of scope up to token ended (!held): a scope is read at a resync
   * while a lease it saw begin has not been seen to end.
   */
  #track(scope: string, token: bigint, held: boolean): void {
    const t = this.#open.get(scope);
    if (held && token > (t ?? 0n) && token <= MAX_TOKEN) this.#open.set(scope, token);
    else if (!held && t !== undefined && t <= token) this.#open.delete(scope);
  }

  /** #pump starts advances for pending scopes, up to the concurrency, one per scope at a time. */
  #pump(): void {
    if (this.#signal?.aborted) return;
    for (const [scope, w] of this.#pending) {
      if (this.#inflight.size >= this.#par) return;
      if (this.#inflight.has(scope)) continue;
      this.#pending.delete(scope);
      this.#inflight.set(scope, w);
      void this.#advanceOne(scope, w);
    }
  }

  /** #advanceOne records w in the guard, then lets the scope's next mark go; a failed one goes back in line after a pause. */
  async #advanceOne(scope: string, w: Want): Promise<void> {
    let failed = false;
    try {
      await this.#marks.advance(scope, w.token);
      this.#advanced++;
    } catch (err) {
      if (err instanceof StaleError) {
        this.#advanced++; // the mark is past it already
      } else {
        failed = true;
        if (!this.#signal?.aborted) this.#warn(`could not advance the mark of "${scope}" to ${w.token}; retrying`, err);
      }
    }
    if (failed && this.#signal !== undefined) await delay(100 + Math.random() * 100, this.#signal);
    this.#inflight.delete(scope);
    if (failed) {
      // Back in line, merged with what came meanwhile; the oldest wait counts.
      const p = this.#pending.get(scope);
      this.#pending.set(scope, p === undefined || p.token < w.token ? w : { token: p.token, at: w.at });
    }
    if (this.#inflight.size === 0) this.#idle?.();
    this.#pump();
  }
}

/** isScope tells whether s is a scope fenced accepts. */
function isScope(s: string): boolean {
  try {
    validateScope(s);
    return true;
  } catch {
    return false;
  }
}

/** quietTimeout tells whether err is, or was caused by, undici's body timeout. */
function quietTimeout(err: unknown): boolean {
  for (let e: any = err, i = 0; e !== undefined && e !== null && i < 5; e = e.cause, i++) {
    if (e.code === "UND_ERR_BODY_TIMEOUT") return true;
  }
  return false;
}
