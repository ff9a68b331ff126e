// Reporting stale rejections to fenced (ReportRejections), as Go's
// guard/guardreport and Python's Reporter do, so that fenced's status page,
// metrics and watchers show which holders kept writing after losing their
// lease, whatever the language of the guard that refused them.

import type { Client } from "./client.js";
import type { StaleError } from "./errors.js";

/** MAX_REPORT is the most rejections one ReportRejections call carries. */
export const MAX_REPORT = 1000;

/** Rejection is one stale write a guard refused. */
export interface Rejection {
  scope: string;
  /** The token the refused write presented. */
  presented: bigint;
  /** The highest token the guard had accepted for the scope. */
  highest: bigint;
  /** When it was refused (absent: when fenced receives it). */
  time?: Date;
}

/**
 * RejectionReporter is what a guard's reporter option takes: a Reporter, or
 * anything else that wants to hear of stale rejections. rejected must
 * return at once and never throw.
 */
export interface RejectionReporter {
  rejected(err: StaleError): void;
}

/** ReporterOptions configure a Reporter. */
export interface ReporterOptions {
  /** How often buffered rejections are sent, in milliseconds (default 1000). */
  intervalMs?: number;
  /** How many rejections wait to be sent at most (default 1000); more are dropped and counted. */
  buffer?: number;
  /** Told of a failed send once per run of failures (default: a line on stderr). */
  onError?: (err: unknown) => void;
}

// The stale errors some reporter was told of: a refusal passed through two
// layers (a store inside the HTTP middleware, pgAdvance inside pgFenced)
// is reported once.
const reported = new WeakSet<object>();

/**
 * report tells reporter of err, once per error object whichever guard
 * layer calls it; a reporter that throws changes nothing for the write.
 */
export function report(reporter: RejectionReporter | undefined, err: StaleError): void {
  if (reporter === undefined || reported.has(err)) return;
  reported.add(err);
  try {
    reporter.rejected(err);
  } catch {
    // Reporting is best effort: the guard's decision never depends on it.
  }
}

// The reporters with something to send when the event loop empties: Node
// emits beforeExit then, and a flush started there runs before the exit.
const live = new Set<Reporter>();
let exitHook = false;

/**
 * Reporter batches a guard's stale rejections and sends them to fenced. It
 * never slows or fails the guarded write: rejected puts the rejection in a
 * bounded buffer and returns, and a timer sends the buffer every
 * intervalMs. When the buffer is full, rejections are dropped and counted,
 * and the count is sent with the next batch. A failed send keeps what fits
 * for the next one. Its timer does not keep Node running: what is still
 * buffered when the process has nothing else to do is sent then (Node's
 * beforeExit), once, before it exits. Safe to share between guards.
 */
export class Reporter implements RejectionReporter {
  /** The guarded resource's name, for people ("orders-db"). */
  readonly guard: string;
  readonly #client: Client;
  readonly #intervalMs: number;
  readonly #limit: number;
  readonly #onError: (err: unknown) => void;
  #buf: Rejection[] = [];
  #dropped = 0n;
  #timer: NodeJS.Timeout | undefined;
  #sending: Promise<void> | undefined;
  #failing = false;
  #closed = false;
  #exitTried = false;

  constructor(client: Client, guard: string, opts: ReporterOptions = {}) {
    this.#client = client;
    this.guard = guard;
    this.#intervalMs = Math.max(opts.intervalMs ?? 1000, 1);
    this.#limit = Math.max(Math.floor(opts.buffer ?? 1000), 1);
    this.#onError =
      opts.onError ?? ((err) => process.stderr.write(`fence: reporting stale rejections of "${guard}" to fenced failed; will retry: ${(err as Error)?.message ?? err}\n`));
  }

  /**
   * rejected buffers a stale rejection for the next batch, or counts it as
   * dropped when the buffer is full. It returns at once.
   */
  rejected(err: StaleError | Rejection): void {
    if (this.#buf.length < this.#limit) {
      this.#buf.push({ scope: err.scope, presented: err.presented, highest: err.highest, time: "time" in err && err.time ? err.time : new Date() });
    } else {
      this.#dropped++;
    }
    this.#exitTried = false;
    if (this.#closed) return; // close() sent what it had; flush() sends the rest
    live.add(this);
    if (!exitHook) {
      exitHook = true;
      process.on("beforeExit", flushAtExit);
    }
    if (this.#timer === undefined) {
      this.#timer = setInterval(() => this.#tick(), this.#intervalMs);
      this.#timer.unref();
    }
  }

  /** pending is how many rejections wait to be sent. */
  get pending(): number {
    return this.#buf.length;
  }

  /** dropped is how many rejections were dropped since the last batch sent. */
  get dropped(): bigint {
    return this.#dropped;
  }

  /**
   * flush sends what is buffered now and resolves when fenced has it; on
   * failure what was not sent goes back in the buffer, as far as it fits
   * (the rest counts as dropped), and the error is thrown. Sends do not
   * overlap: a flush waits for the one under way.
   */
  async flush(opts: { signal?: AbortSignal } = {}): Promise<void> {
    while (this.#sending !== undefined) await this.#sending.catch(() => undefined);
    const run = this.#send(opts.signal);
    this.#sending = run;
    try {
      await run;
    } finally {
      if (this.#sending === run) this.#sending = undefined;
    }
  }

  /** close stops the timer and sends what is left. */
  async close(opts: { signal?: AbortSignal } = {}): Promise<void> {
    this.#closed = true;
    clearInterval(this.#timer);
    this.#timer = undefined;
    live.delete(this);
    await this.flush(opts);
  }

  async #send(signal?: AbortSignal): Promise<void> {
    for (;;) {
      const batch = this.#buf.splice(0, MAX_REPORT);
      const dropped = this.#dropped;
      this.#dropped = 0n;
      if (batch.length === 0 && dropped === 0n) {
        if (this.#timer === undefined) live.delete(this);
        return;
      }
      try {
        await this.#client.reportRejections(this.guard, batch, dropped, { signal });
      } catch (err) {
        // Put the batch back in front of what came since, as far as it
        // fits; the rest counts as dropped.
        const keep = Math.min(batch.length, Math.max(this.#limit - this.#buf.length, 0));
        this.#buf = [...batch.slice(0, keep), ...this.#buf];
        this.#dropped += dropped + BigInt(batch.length - keep);
        throw err;
      }
    }
  }

  #tick(): void {
    if (this.#buf.length === 0 && this.#dropped === 0n) {
      // Idle: no timer until the next rejection.
      clearInterval(this.#timer);
      this.#timer = undefined;
      return;
    }
    if (this.#sending !== undefined) return;
    this.flush({ signal: AbortSignal.timeout(Math.max(this.#intervalMs, 5000)) }).then(
      () => {
        this.#failing = false;
      },
      (err) => {
        if (!this.#failing) this.#onError(err);
        this.#failing = true;
      },
    );
  }

  /** @internal The beforeExit flush: once per batch of rejections, at most 2 s. */
  exitFlush(): void {
    if (this.#exitTried || (this.#buf.length === 0 && this.#dropped === 0n)) {
      live.delete(this);
      return;
    }
    this.#exitTried = true;
    this.flush({ signal: AbortSignal.timeout(2000) }).catch((err) => this.#onError(err));
  }
}

function flushAtExit(): void {
  for (const r of [...live]) r.exitFlush();
}
