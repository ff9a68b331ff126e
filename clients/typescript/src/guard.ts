// The resource side: the stale rule (docs/protocol.md, "Comparing tokens")
// and the store of each scope's highest accepted mark.

import { StaleError } from "./errors.js";
import { report, type RejectionReporter } from "./report.js";
import type { Token } from "./token.js";

/** Write is what a writer presents: its token and, optionally, a sequence number (0n: none). */
export interface Write {
  token: Token;
  seq?: bigint;
}

/** Mark is the highest write a scope has accepted. */
export interface Mark {
  token: bigint;
  seq: bigint;
}

/**
 * check applies the rule to a scope's highest mark: it returns a StaleError
 * if w is older than highest, and undefined if w may be applied (after which
 * next(highest, w) becomes the highest). An equal token is accepted, unless
 * it carries a sequence below the highest (or equal, when strict).
 */
export function check(scope: string, highest: Mark, w: Write, strict = false): StaleError | undefined {
  const t = w.token.value;
  const seq = w.seq ?? 0n;
  let stale = t < highest.token;
  if (t === highest.token && seq !== 0n) {
    stale = seq < highest.seq || (strict && seq === highest.seq);
  }
  return stale ? new StaleError({ scope, presented: t, highest: highest.token, presentedSeq: seq, highestSeq: highest.seq }) : undefined;
}

/** next returns the mark after accepting w over highest. */
export function next(highest: Mark, w: Write): Mark {
  const seq = w.seq ?? 0n;
  if (w.token.value > highest.token) {
    return { token: w.token.value, seq };
  }
  return { token: highest.token, seq: seq > highest.seq ? seq : highest.seq };
}

/**
 * MarkStore is the record of each scope's highest accepted mark. fence
 * checks w against its scope's mark with check; if w is stale it throws the
 * StaleError and does not call apply. Otherwise it calls apply and, if apply
 * succeeds, records next(highest, w). Check, apply and record are one atomic
 * step for the scope: fence calls of one scope never interleave, and if
 * apply throws the record is unchanged. Implementations must be safe for
 * concurrent calls.
 */
export interface MarkStore {
  fence<T>(w: Write, strict: boolean, apply: () => Promise<T>): Promise<T>;
}

/**
 * MemoryMarkStore keeps the marks in this process's memory. It is correct
 * only when the guarded data lives in the same process and dies with it:
 * data that survives a restart needs a store that survives with it (a
 * database, with the PostgreSQL or Redis guard). Scopes do not contend; the
 * writes of one scope run one at a time.
 */
export class MemoryMarkStore implements MarkStore {
  readonly #scopes = new Map<string, { highest: Mark; tail: Promise<unknown> }>();
  readonly #reporter: RejectionReporter | undefined;

  /** opts.reporter is told of every write the store refuses as stale (a Reporter sends them to fenced). */
  constructor(opts: { reporter?: RejectionReporter } = {}) {
    this.#reporter = opts.reporter;
  }

  fence<T>(w: Write, strict: boolean, apply: () => Promise<T>): Promise<T> {
    const scope = w.token.scope;
    let s = this.#scopes.get(scope);
    if (s === undefined) {
      s = { highest: { token: 0n, seq: 0n }, tail: Promise.resolve() };
      this.#scopes.set(scope, s);
    }
    const st = s;
    // A promise chain per scope is its lock: each write waits for the one
    // before it, whatever that one's outcome.
    const run = st.tail.then(async () => {
      const stale = check(scope, st.highest, w, strict);
      if (stale) {
        report(this.#reporter, stale);
        throw stale;
      }
      const out = await apply();
      st.highest = next(st.highest, w);
      return out;
    });
    st.tail = run.catch(() => undefined);
    return run;
  }

  /** highest returns the highest mark accepted for scope. */
  highest(scope: string): Mark {
    return { ...(this.#scopes.get(scope)?.highest ?? { token: 0n, seq: 0n }) };
  }
}
