// Fenced writes to PostgreSQL through fence's guard inside the database:
// the function fence_advance(scope, token, seq) that
// `fencectl guard install postgres://...` puts there (guard/sqlguard/sql/
// postgres.sql). It keeps its marks in sqlguard's table fence_tokens, so Go
// and TypeScript writers of a scope share one mark. Any client with pg's
// query(text, values) shape works; this module imports no driver.

import { FenceError, InvalidError } from "./errors.js";
import type { Lease } from "./client.js";
import { presentedToken, staleFromFields, type Presented } from "./presented.js";

/** Queryable is what the guard needs of a PostgreSQL connection: pg's Client and PoolClient are ones. */
export interface Queryable {
  query(text: string, values?: unknown[]): Promise<unknown>;
}

/**
 * pgAdvance checks a write against its scope's mark and advances the mark,
 * inside the transaction open on db: call it first, then write, then
 * commit. The mark's row stays locked until the transaction ends, so the
 * writers of a scope take turns. A stale token throws a StaleError (and
 * marks a Lease lost); the transaction is then aborted, roll it back. seq
 * (1 to 2^63−1) orders the writes of one token; without it the write is
 * ordered by its token alone.
 */
export async function pgAdvance(db: Queryable, presented: Presented, seq?: bigint): Promise<void> {
  const { token, lease } = presentedToken(presented);
  try {
    await db.query("SELECT fence_advance($1::text, $2::bigint, $3::bigint)", [token.scope, token.value.toString(), (seq ?? 0n).toString()]);
  } catch (err) {
    throw pgError(err, lease);
  }
}

/**
 * pgFenced runs fn in a transaction on db that begins with pgAdvance, and
 * commits it if fn succeeds; it rolls back and throws if either fails. db
 * must be one connection (a pg Client, or a PoolClient from pool.connect()),
 * not a Pool, whose queries may each take another connection. A stale
 * answer from fn's statements too (a fence_row_token trigger) becomes a
 * StaleError.
 */
export async function pgFenced<T>(db: Queryable, presented: Presented, fn: (db: Queryable) => Promise<T>, opts: { seq?: bigint } = {}): Promise<T> {
  const { lease } = presentedToken(presented);
  await db.query("BEGIN");
  try {
    await pgAdvance(db, presented, opts.seq);
    const out = await fn(db);
    await db.query("COMMIT");
    return out;
  } catch (err) {
    // The error that matters is the first; a failed rollback adds nothing
    // the caller can act on (the connection is broken, and the server
    // rolls back anyway).
    await db.query("ROLLBACK").catch(() => undefined);
    throw pgError(err, lease);
  }
}

/**
 * pgError turns the guard's SQLSTATEs into this package's errors: FN409
 * (stale, with DETAIL "scope=S presented_token=T highest_token=H ...") and
 * FN400 (a malformed argument). Other errors pass unchanged.
 */
function pgError(err: unknown, lease: Lease | undefined): unknown {
  if (err instanceof FenceError) return err;
  const e = err as { code?: string; message?: string; detail?: string };
  if (e?.code === "FN400") {
    return new InvalidError("token", e.message ?? "malformed fenced write", { cause: err });
  }
  if (e?.code !== "FN409") return err;
  return staleFromFields(e.detail ?? "", lease);
}
