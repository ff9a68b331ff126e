// The client of fenced, over Connect's JSON protocol: POST
// /fence.v1.LeaseService/<Method> with a JSON body, with nothing but fetch.
// The API is small enough that hand-written request and response shapes
// cost less than generated code and a Connect runtime as dependencies.

import { randomUUID } from "node:crypto";
import { hostname } from "node:os";
import { basename } from "node:path";

import { FenceError, HeldError, InvalidError, LostError, NotHolderError, UnavailableError } from "./errors.js";
import { MAX_REPORT, Reporter, type Rejection, type RejectionReporter, type ReporterOptions } from "./report.js";
import { watchStream, type WatchOptions, type WatchResponse } from "./watch.js";

const SERVICE = "fence.v1.LeaseService";

/** ClientOptions configure a Client. */
export interface ClientOptions {
  /** The holder name sent with acquires (default: program-pid@host). At most 128 bytes. */
  holder?: string;
  /** A bearer token for a fenced that runs with --auth-file. */
  bearer?: string;
  /**
   * How long one call keeps retrying while the service is unreachable or has
   * no leader, in milliseconds (default 10,000). 0 makes a single attempt.
   */
  retryTimeoutMs?: number;
  /**
   * Makes the guards of this package (pgAdvance, pgFenced, the redis
   * writes) send the stale rejections they see for this client's leases to
   * fenced, through reporter(guard) named after the guard, when the write
   * gives no reporter of its own, as the Python client does (default true).
   */
  reportRejections?: boolean;
}

/** AcquireOptions configure one acquire. */
export interface AcquireOptions {
  /** Who holds the lease, for people; overrides the client's holder. */
  holder?: string;
  /** The lease's time to live in milliseconds (default 10,000; fenced allows 100 to its --max-ttl). */
  ttl?: number;
  /**
   * Queue behind the current holder instead of failing with a HeldError.
   * Give the wait an end with signal (AbortSignal.timeout(ms)).
   */
  wait?: boolean;
  /** Ends the acquire (and a wait in line) when aborted. */
  signal?: AbortSignal;
  /**
   * Makes a retried acquire return the grant of an earlier attempt, even
   * one made by another call or process, instead of a second token. At most
   * 64 bytes. By default each acquire makes a fresh one, which its own
   * retries share.
   */
  requestId?: string;
  /**
   * How much earlier than its TTL the lease gives up its authority, to
   * cover clock-rate differences between this process and fenced, in
   * milliseconds (default: a twentieth of the TTL, at least 5).
   */
  driftMarginMs?: number;
}

/** ScopeState is a scope as Client.get reports it. */
export interface ScopeState {
  scope: string;
  /** The current lease, as anyone may see it; undefined when the scope is free. */
  lease: { scope: string; token: bigint; holder: string; ttlMs: number; expiresInMs: number } | undefined;
  /** At or above every token the scope was issued, below its next. */
  lastToken: bigint;
  waiters: number;
}

/** LeaseInfo is a lease as fenced answers it. */
interface LeaseInfo {
  scope: string;
  token: bigint;
  tokenText: string;
  leaseId: string;
  holder: string;
  ttlMs: number;
}

/**
 * Client talks to fenced: one node, or the nodes of a cluster (any node
 * takes any call, forwarding to the leader). It sends its calls to one
 * address at a time, and moves to the next, wrapping around, when a call
 * finds that node unavailable, as the Go client does. It is safe to share;
 * make one per service.
 */
export class Client {
  readonly #bases: string[];
  #cur = 0;
  readonly #holder: string;
  readonly #headers: Record<string, string>;
  readonly #retryTimeoutMs: number;
  readonly #leases = new Set<Lease>();
  readonly #reporters = new Map<string, Reporter>();
  readonly #report: boolean;
  #closed = false;

  /**
   * baseUrl is fenced's API address, such as "http://127.0.0.1:7480", or
   * the addresses of a cluster's nodes, in the order to try them (an array,
   * or comma-separated).
   */
  constructor(baseUrl: string | string[], opts: ClientOptions = {}) {
    const list = (Array.isArray(baseUrl) ? baseUrl : baseUrl.split(",")).map((a) => a.trim()).filter((a) => a !== "");
    if (list.length === 0) {
      throw new InvalidError("address", "no fenced address given");
    }
    // new URL throws on a malformed address.
    this.#bases = list.map((a) => new URL(a).href.replace(/\/+$/, ""));
    this.#holder = opts.holder ?? `${basename(process.argv[1] ?? "node")}-${process.pid}@${hostname()}`.slice(0, 128);
    this.#headers = {
      "content-type": "application/json",
      "connect-protocol-version": "1",
      ...(opts.bearer === undefined ? {} : { authorization: `Bearer ${opts.bearer}` }),
    };
    this.#retryTimeoutMs = opts.retryTimeoutMs ?? 10_000;
    this.#report = opts.reportRejections ?? true;
  }

  /**
   * acquire acquires a lease on scope and keeps it alive in the background
   * until it is released or lost (see Lease). A held scope throws a
   * HeldError unless wait is given. Transient failures are retried with the
   * same request ID, so one acquire never takes two tokens.
   */
  async acquire(scope: string, opts: AcquireOptions = {}): Promise<Lease> {
    if (this.#closed) {
      throw new FenceError(`acquire "${scope}": the client is closed`);
    }
    const ttl = opts.ttl ?? 10_000;
    if (!Number.isFinite(ttl) || ttl <= 0) {
      throw new InvalidError("ttl", `acquire "${scope}": ttl ${ttl} is not a positive number of milliseconds`);
    }
    const req = {
      scope,
      holder: opts.holder ?? this.#holder,
      ttl: durationText(ttl),
      wait: opts.wait ?? false,
      requestId: opts.requestId ?? randomUUID().replaceAll("-", ""),
    };
    const { body, sent: first, retried } = await this.#call("acquire", scope, "Acquire", req, opts.signal);
    const info = leaseInfo(body);
    let sent = first;
    // The local validity counts from the send time, which precedes the
    // service's deadline: the service starts it when it grants, after the
    // request was sent. Not so a grant that an earlier attempt obtained,
    // whose deadline started before this send: a retry, or an earlier call
    // with the request ID the caller chose. Then one renewal gives the
    // validity a send time of its own. So does a wait in line longer than a
    // third of the TTL, so that a lease starts with at least the validity a
    // keep-alive leaves it.
    if (retried || opts.requestId !== undefined || performance.now() - sent > info.ttlMs / 3) {
      sent = performance.now();
      try {
        const { body: renewed } = await this.#call("acquire", scope, "Renew", { scope, leaseId: info.leaseId }, opts.signal);
        info.tokenText = leaseInfo(renewed).tokenText;
      } catch (err) {
        await this.#releaseQuietly(info);
        throw err;
      }
    }
    const margin = opts.driftMarginMs ?? Math.max(info.ttlMs / 20, 5);
    const lease = new Lease(info, sent, margin, {
      renew: (signal) => this.#call("renew", scope, "Renew", { scope, leaseId: info.leaseId }, signal, 0).then(({ body }) => leaseInfo(body).tokenText),
      release: () => this.#release(info),
      // Bounded by the TTL, after which fenced expires the lease anyway.
      releaseLost: () => void this.#call("release", scope, "Release", { scope, leaseId: info.leaseId }, AbortSignal.timeout(info.ttlMs), info.ttlMs, true).catch(() => undefined),
      forget: (l) => this.#leases.delete(l),
      reporter: (guard) => (this.#report && !this.#closed ? this.reporter(guard) : undefined),
    });
    if (this.#closed) {
      // close() overtook this acquire: it must not outlive the client.
      lease.markLost("the client was closed");
      await this.#releaseQuietly(info);
      throw new FenceError(`acquire "${scope}": the client is closed`);
    }
    this.#leases.add(lease);
    return lease;
  }

  /**
   * close ends every lease the client keeps alive (their lost signals fire)
   * and releases them, best effort, and sends what the reporters of
   * reporter() still hold. Later acquires fail.
   */
  async close(): Promise<void> {
    this.#closed = true;
    const held = [...this.#leases];
    const reporters = [...this.#reporters.values()];
    await Promise.allSettled([...held.map((l) => l.release()), ...reporters.map((r) => r.close())]);
  }

  /**
   * get reports a scope: its current lease (without the lease ID; absent
   * when free), lastToken (at or above every token the scope was issued:
   * for a free scope, the closing token of its last lease, from log format
   * 8 on) and how many acquires wait in its line.
   */
  async get(scope: string, opts: { signal?: AbortSignal } = {}): Promise<ScopeState> {
    const { body } = await this.#call("get", scope, "Get", { scope }, opts.signal);
    const l = body?.lease;
    return {
      scope: body?.scope ?? scope,
      lease:
        l === undefined
          ? undefined
          : { scope: l.scope ?? scope, token: BigInt(l.token ?? "0"), holder: l.holder ?? "", ttlMs: parseDuration(l.ttl), expiresInMs: parseDuration(l.expiresIn) },
      lastToken: BigInt(body?.lastToken ?? "0"),
      waiters: Number(body?.waiters ?? 0),
    };
  }

  /**
   * reportRejections sends stale rejections a guard saw to fenced
   * (ReportRejections), at most MAX_REPORT a call, and dropped, how many it
   * could not keep: fenced's status page, metrics and watchers show them.
   * guard names the guarded resource for people ("orders-db"). Guards report
   * through a Reporter, which batches them off the write path.
   */
  async reportRejections(guard: string, rejections: Rejection[], dropped = 0n, opts: { signal?: AbortSignal } = {}): Promise<void> {
    if (rejections.length > MAX_REPORT) {
      throw new InvalidError("rejections", `report for "${guard}": ${rejections.length} rejections, at most ${MAX_REPORT} a call`);
    }
    const req: Record<string, unknown> = {
      guard,
      rejections: rejections.map((r) => ({
        scope: r.scope,
        presentedToken: r.presented.toString(),
        highestToken: r.highest.toString(),
        ...(r.time === undefined ? {} : { time: r.time.toISOString() }),
      })),
    };
    if (dropped > 0n) req.dropped = dropped.toString();
    await this.#call("report", guard, "ReportRejections", req, opts.signal);
  }

  /**
   * reporter returns the client's Reporter for the guard name, made on first
   * use (with opts then) and flushed by close(): give it to the guards as
   * their reporter option.
   */
  reporter(guard: string, opts: ReporterOptions = {}): Reporter {
    let r = this.#reporters.get(guard);
    if (r === undefined) {
      r = new Reporter(this, guard, opts);
      this.#reporters.set(guard, r);
    }
    return r;
  }

  /**
   * watch streams the lease events of the scopes under prefix ("" for all),
   * one response at a time, from opts.startPosition (absent: from now), with
   * the held leases first if opts.includeHeld. The leader records a renewal
   * of a lease a quarter of its TTL apart at least, one loss a lease and one
   * rejection a stale token of a scope, rejections in a tenth of the events
   * it keeps at most (docs/protocol.md, "Watch"). It is one stream: it throws
   * when the stream ends, an UnavailableError when the node could not be
   * reached or the stream was cut off (the next watch goes to the next
   * node), a FenceError with code "out_of_range" when the start position is
   * no longer kept (read the state again and watch from now), and the
   * signal's reason once opts.signal aborts. Resume from the nextPosition of
   * the last response read. Follower does all of that.
   */
  async *watch(prefix: string, opts: WatchOptions = {}): AsyncGenerator<WatchResponse, void, undefined> {
    const node = this.#cur;
    try {
      yield* watchStream(this.#bases[node]!, this.#headers, prefix, opts, fromConnect);
    } catch (err) {
      if (err instanceof UnavailableError && this.#cur === node) this.#cur = (node + 1) % this.#bases.length;
      throw wrap("watch", prefix, err);
    }
  }

  async #release(info: LeaseInfo): Promise<bigint> {
    const { body } = await this.#call("release", info.scope, "Release", { scope: info.scope, leaseId: info.leaseId }, undefined, undefined, true);
    return BigInt(body?.token ?? "0");
  }

  async #releaseQuietly(info: LeaseInfo): Promise<void> {
    // Best effort: the lease would expire on its TTL anyway.
    await this.#release(info).catch(() => undefined);
  }

  /**
   * #call makes one API call, retrying while the service is unavailable,
   * for at most retryTimeoutMs. It returns the answer, the send time of the
   * attempt that succeeded (performance.now()), and whether earlier attempts
   * were made. A release whose earlier attempt may have been applied takes
   * a "lost" answer as done.
   */
  async #call(
    op: string,
    scope: string,
    method: string,
    req: unknown,
    signal?: AbortSignal,
    retryTimeoutMs = this.#retryTimeoutMs,
    releasing = false,
  ): Promise<{ body: any; sent: number; retried: boolean }> {
    const give = performance.now() + retryTimeoutMs;
    let backoff = 20;
    // Bounded by retryTimeoutMs: each attempt is followed by a sleep of at
    // least 1ms, and the loop gives up once the budget would be passed.
    for (let attempt = 0; ; attempt++) {
      const sent = performance.now();
      const node = this.#cur;
      try {
        const body = await this.#post(this.#bases[node]!, method, req, signal);
        return { body, sent, retried: attempt > 0 };
      } catch (err) {
        if (releasing && attempt > 0 && (err instanceof LostError || err instanceof NotHolderError)) {
          // An earlier attempt may have released it: either way the lease
          // is no longer ours, which is what release asks.
          return { body: {}, sent, retried: true };
        }
        const sleep = Math.random() * backoff + 1;
        if (!(err instanceof UnavailableError) || signal?.aborted) {
          throw wrap(op, scope, err);
        }
        // Only the call that saw the failure moves on: concurrent calls
        // failing on the same node must not skip the next one.
        if (this.#cur === node) this.#cur = (node + 1) % this.#bases.length;
        if (performance.now() + sleep > give) {
          throw wrap(op, scope, err);
        }
        await delay(sleep, signal);
        backoff = Math.min(2 * backoff, 100); // as the Go client: a new leader is found soon after it serves
      }
    }
  }

  /** #post sends one Connect unary call and decodes its answer or error. */
  async #post(base: string, method: string, req: unknown, signal?: AbortSignal): Promise<any> {
    const url = `${base}/${SERVICE}/${method}`;
    let res: Response;
    try {
      res = await fetch(url, { method: "POST", headers: this.#headers, body: JSON.stringify(req), signal });
    } catch (err) {
      if (signal?.aborted) {
        throw signal.reason;
      }
      throw new UnavailableError(`${url}: ${causeText(err)}`, { cause: err });
    }
    let text: string;
    try {
      text = await res.text();
    } catch (err) {
      if (signal?.aborted) {
        throw signal.reason;
      }
      throw new UnavailableError(`${url}: answer cut off: ${causeText(err)}`, { cause: err });
    }
    let body: any;
    try {
      body = JSON.parse(text);
    } catch {
      body = undefined;
    }
    if (res.ok && body !== undefined) {
      return body;
    }
    if (body === undefined || typeof body.code !== "string") {
      // Not fenced's answer: a proxy, or a node going down.
      const msg = `${url}: ${res.status} ${res.statusText}: ${text.slice(0, 200)}`;
      throw res.status >= 502 && res.status <= 504 ? new UnavailableError(msg) : new FenceError(msg);
    }
    throw fromConnect(body, signal);
  }
}

/**
 * fromConnect turns a Connect error body into this package's errors, as
 * Go's wire.FromConnect does. fenced (connect-go) sends each detail's
 * fields in JSON under "debug", beside the protobuf bytes.
 */
export function fromConnect(body: { code: string; message?: string; details?: { type?: string; debug?: any }[] }, signal?: AbortSignal): FenceError {
  const msg = body.message ?? body.code;
  let conflict: any;
  let violation: any;
  for (const d of body.details ?? []) {
    if (d.type === "fence.v1.LeaseConflict") conflict = d.debug ?? {};
    if (d.type === "fence.v1.FieldViolation") violation = d.debug ?? {};
  }
  switch (body.code) {
    case "invalid_argument":
      return new InvalidError(violation?.field ?? "", msg);
    case "aborted":
      return new HeldError(msg, {
        scope: conflict?.scope ?? "",
        holder: conflict?.holder ?? "",
        token: BigInt(conflict?.token ?? "0"),
        expiresInMs: parseDuration(conflict?.expiresIn),
      });
    case "failed_precondition":
      return new LostError(msg, {
        scope: conflict?.scope ?? "",
        token: BigInt(conflict?.lostToken ?? "0"),
        current: BigInt(conflict?.token ?? "0"),
        reason: conflict?.reason || "no longer the current lease",
        code: body.code,
      });
    case "not_found":
      return new NotHolderError(msg, { code: body.code });
    case "unavailable":
      return new UnavailableError(msg, { code: body.code });
    case "canceled":
    case "unknown":
      // connect-go calls a reset stream "canceled" and an answer cut off by
      // a crash "unknown"; while our own signal is alive, that is the
      // service going away.
      if (!signal?.aborted) return new UnavailableError(msg, { code: body.code });
  }
  return new FenceError(msg, { code: body.code });
}

/** wrap names the operation and scope in err's message, keeping its class and fields. */
function wrap(op: string, scope: string, err: unknown): unknown {
  if (err instanceof FenceError && !err.message.startsWith(`${op} "`)) {
    err.message = `${op} "${scope}": ${err.message}`;
  }
  return err;
}

function leaseInfo(body: any): LeaseInfo {
  const l = body?.lease;
  if (l === undefined || typeof l.leaseId !== "string" || l.token === undefined) {
    throw new FenceError(`fenced answered no lease: ${JSON.stringify(body).slice(0, 200)}`);
  }
  return {
    scope: l.scope,
    token: BigInt(l.token), // a decimal string in JSON: exact beyond 2^53
    tokenText: l.tokenText ?? `fence:v1:${l.scope}:${l.token}`,
    leaseId: l.leaseId,
    holder: l.holder ?? "",
    ttlMs: parseDuration(l.ttl),
  };
}

/** durationText writes milliseconds as a protobuf JSON duration ("0.5s"). */
function durationText(ms: number): string {
  return `${(ms / 1000).toFixed(3).replace(/\.?0+$/, "")}s`;
}

/** parseDuration reads a protobuf JSON duration ("1.999893167s") as milliseconds. */
function parseDuration(d: unknown): number {
  if (typeof d !== "string" || !d.endsWith("s")) return 0;
  const s = Number(d.slice(0, -1));
  return Number.isFinite(s) ? s * 1000 : 0;
}

function causeText(err: unknown): string {
  const e = err as Error & { cause?: Error };
  return e.cause?.message ? `${e.message}: ${e.cause.message}` : String(e?.message ?? err);
}

/** delay resolves after ms, or at once when signal aborts. */
export function delay(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal?.aborted) return resolve();
    const done = () => {
      clearTimeout(t);
      signal?.removeEventListener("abort", done);
      resolve();
    };
    const t = setTimeout(done, Math.max(ms, 0));
    signal?.addEventListener("abort", done, { once: true });
  });
}

interface LeaseHooks {
  /** renew renews the lease and returns its token's text as signed now. */
  renew(signal: AbortSignal): Promise<string>;
  release(): Promise<bigint>;
  releaseLost(): void;
  forget(l: Lease): void;
  reporter(guard: string): RejectionReporter | undefined;
}

/**
 * Lease is a held lease that keeps itself alive: it renews in the background
 * at about a third of its TTL and reports itself lost, aborting its `lost`
 * signal, as soon as it can no longer be sure it holds the scope:
 *   - fenced answers that it is not the current lease;
 *   - its local validity runs out: the send time of its last confirmed
 *     renewal (at first, of its acquire) plus the TTL, minus the drift
 *     margin, on this process's monotonic clock (performance.now()), passes
 *     without a newer confirmation;
 *   - its holder calls markLost, for example after a guard refused its
 *     token as stale;
 *   - it is released, or its Client is closed.
 * A lost lease stays lost; acquire a new one, with a greater token.
 */
export class Lease {
  readonly scope: string;
  /** The fencing token, exact: compare it as bigint, never as number. */
  readonly token: bigint;
  /** The lease ID, which renews and releases the lease: keep it to the holder. */
  readonly leaseId: string;
  readonly holder: string;
  /** The TTL fenced granted, in milliseconds. */
  readonly ttlMs: number;

  readonly #margin: number;
  readonly #hooks: LeaseHooks;
  #tokenText: string;
  readonly #ac = new AbortController();
  #validUntil: number;
  #keeper: Promise<void>;
  #wake: (() => void) | undefined;

  /** @internal Leases come from Client.acquire. */
  constructor(info: LeaseInfo, sent: number, margin: number, hooks: LeaseHooks) {
    this.scope = info.scope;
    this.token = info.token;
    this.#tokenText = info.tokenText;
    this.leaseId = info.leaseId;
    this.holder = info.holder;
    this.ttlMs = info.ttlMs;
    this.#margin = margin;
    this.#hooks = hooks;
    this.#validUntil = sent + info.ttlMs - margin;
    this.#keeper = this.#keepAlive(sent);
  }

  /**
   * tokenText is the token's text form, to send in the Fencing-Token header:
   * read it at each write, as each renewal signs the token again with the
   * key that signs then, and guards refuse an old key's signature once its
   * grace period after a rotation is over.
   */
  get tokenText(): string {
    return this.#tokenText;
  }

  /**
   * lost is aborted, with a LostError as its reason, when the lease is lost
   * or released. Reading it also checks the local validity against the
   * clock, so that a holder whose event loop was blocked past its validity
   * finds it aborted at once, before any timer had the chance to run.
   */
  get lost(): AbortSignal {
    this.#checkClock();
    return this.#ac.signal;
  }

  /** error is undefined while the lease is held, then why it ended. */
  get error(): LostError | undefined {
    this.#checkClock();
    return this.#ac.signal.aborted ? (this.#ac.signal.reason as LostError) : undefined;
  }

  /**
   * validUntil is the local deadline of the lease's authority on the
   * performance.now() clock: later than performance.now() while it is valid.
   */
  get validUntil(): number {
    return this.#validUntil;
  }

  /** throwIfLost throws the LostError if the lease is lost or released. */
  throwIfLost(): void {
    this.lost.throwIfAborted();
  }

  /**
   * markLost ends the lease's authority locally: call it when a guard
   * refuses the lease's token as stale. The lease stops renewing; it is not
   * released, as a newer holder may already own the scope. Retrying the
   * refused write with this token can never succeed.
   */
  markLost(reason: unknown): void {
    this.#lose(`marked lost by its holder: ${reason instanceof Error ? reason.message : String(reason)}`);
  }

  /**
   * @internal reporterFor is where a guard of this package reports a stale
   * rejection of this lease's token when the write gave no reporter: the
   * client's reporter(guard), or nowhere with reportRejections false.
   */
  reporterFor(guard: string): RejectionReporter | undefined {
    return this.#hooks.reporter(guard);
  }

  /**
   * release stops renewing and frees the scope at fenced. Releasing a lease
   * that is already lost only stops it, and rejects with why it was lost.
   */
  async release(): Promise<void> {
    const err = this.error;
    if (err !== undefined) {
      await this.#keeper;
      throw err;
    }
    this.#lose("released by its holder");
    await this.#keeper;
    await this.#hooks.release();
  }

  #checkClock(): void {
    if (!this.#ac.signal.aborted && performance.now() >= this.#validUntil) {
      this.#lose(`no renewal confirmed within the TTL of ${this.ttlMs}ms (local validity ran out)`);
      // fenced may still count the lease current (a renewal it granted was
      // answered too late) and hold the scope for up to a TTL; a release
      // frees it only while this lease is current, so it takes nothing from
      // a newer holder. Best effort, as Go's and Python's clients do.
      this.#hooks.releaseLost();
    }
  }

  /** #lose records the first reason the lease ended and stops it. */
  #lose(reason: string | LostError): void {
    if (this.#ac.signal.aborted) return;
    const err =
      typeof reason === "string"
        ? new LostError(`lease on "${this.scope}" with token ${this.token} is lost: ${reason}`, { scope: this.scope, token: this.token, reason })
        : reason;
    this.#hooks.forget(this);
    this.#ac.abort(err);
    this.#wake?.();
  }

  /**
   * #keepAlive renews the lease every third of its TTL, counted from start,
   * the send time its validity counts from, and ends the lease when fenced
   * says it is lost or its local validity runs out. It runs until the lease
   * ends, which it does by the validity deadline at the latest.
   */
  async #keepAlive(start: number): Promise<void> {
    const signal = this.#ac.signal;
    const every = this.ttlMs / 3;
    let next = start + every;
    while (!signal.aborted) {
      const valid = this.#validUntil;
      await new Promise<void>((resolve) => {
        const t = setTimeout(resolve, Math.max(Math.min(next, valid) - performance.now(), 0));
        this.#wake = () => {
          clearTimeout(t);
          resolve();
        };
      });
      this.#wake = undefined;
      if (signal.aborted) return;
      const now = performance.now();
      if (now >= valid) {
        this.#checkClock();
        return;
      }
      if (now < next) continue;
      const sent = performance.now();
      try {
        // An answer after the validity ends would come too late to extend it.
        this.#tokenText = await this.#hooks.renew(AbortSignal.any([signal, AbortSignal.timeout(Math.max(Math.ceil(valid - sent), 1))]));
        this.#validUntil = Math.max(this.#validUntil, sent + this.ttlMs - this.#margin);
        next = sent + every;
      } catch (err) {
        if (signal.aborted) return;
        if (err instanceof LostError || err instanceof NotHolderError) {
          this.#lose(
            new LostError(`lease on "${this.scope}" with token ${this.token} is lost: ${err.message}`, {
              scope: this.scope,
              token: this.token,
              current: err instanceof LostError ? err.current : 0n,
              reason: err instanceof LostError ? err.reason : err.message,
              code: err.code,
              cause: err,
            }),
          );
          return;
        }
        // Transient: try again soon, while the lease is still valid.
        next = performance.now() + Math.max(this.ttlMs / 20, 10);
      }
    }
  }
}
