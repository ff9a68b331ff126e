// Fenced writes to PostgreSQL through fence's guard inside the database:
// the function fence_advance(scope, token, seq) that
// `fencectl guard install postgres://...` puts there (guard/sqlguard/sql/
// postgres.sql). It keeps its marks in sqlguard's table fence_tokens, so Go
// and TypeScript writers of a scope share one mark. Any client with pg's
// query(text, values) shape works; this module imports no driver.

import { FenceError, InvalidError } from "./errors.js";
import type { Lease } from "./client.js";
import type { MarkAdvancer } from "./follow.js";
import { presentedToken, staleFromFields, type Presented } from "./presented.js";
import { report, type RejectionReporter } from "./report.js";

/** Queryable is what the guard needs of a PostgreSQL connection: pg's Client and PoolClient are ones. */
export interface Queryable {
  query(text: string, values?: unknown[]): Promise<unknown>;
}

/**
 * PgOptions say where the guard's functions are. schema names the schema
 * `fencectl guard install` put them in (docs/protocol.md installs into a
 * schema of their own, "fence"): the call is then qualified, so a function
 * of the same name in a schema earlier in the connection's search_path
 * cannot answer it. Without schema the call is unqualified, as before, and
 * found through the search_path: safe only if no role the guard does not
 * trust may create objects in a schema on it. The guard cannot check who
 * may create in the schema named; keep CREATE on it to its owner.
 */
export interface PgOptions {
  schema?: string;
  /**
   * Told of every stale write the guard refuses (a Reporter, such as
   * client.reporter("orders-db")), which sends them to fenced.
   */
  reporter?: RejectionReporter;
  /**
   * Names the guard when a Lease's client reports for it, without reporter
   * (default "postgresql"; ClientOptions.reportRejections).
   */
  guard?: string;
}

// A PostgreSQL identifier fence's installer names: letters, digits,
// underscores, at most 63 bytes, not starting with a digit.
const schemaName = /^[A-Za-z_][A-Za-z0-9_]{0,62}$/;

/** pgFunction is the guard function fn, qualified by opts.schema when given. */
function pgFunction(fn: string, opts: PgOptions): string {
  if (opts.schema === undefined) return fn;
  if (!schemaName.test(opts.schema)) {
    throw new InvalidError("schema", `${JSON.stringify(opts.schema)} is not a schema name fence's installer makes (letters, digits and underscores, at most 63, not starting with a digit)`);
  }
  return `"${opts.schema}".${fn}`;
}

/**
 * pgAdvance checks a write against its scope's mark and advances the mark,
 * inside the transaction open on db: call it first, then write, then
 * commit. The mark's row stays locked until the transaction ends, so the
 * writers of a scope take turns. A stale token throws a StaleError (and
 * marks a Lease lost); the transaction is then aborted, roll it back. seq
 * (1 to 2^63−1) orders the writes of one token; without it the write is
 * ordered by its token alone. opts.schema qualifies the guard's function
 * (PgOptions); a schema name that is not one throws an InvalidError before
 * any query.
 */
export async function pgAdvance(db: Queryable, presented: Presented, seq?: bigint, opts: PgOptions = {}): Promise<void> {
  const { token, lease } = presentedToken(presented);
  const fn = pgFunction("fence_advance", opts);
  try {
    await db.query(`SELECT ${fn}($1::text, $2::bigint, $3::bigint)`, [token.scope, token.value.toString(), (seq ?? 0n).toString()]);
  } catch (err) {
    throw pgError(err, lease, opts);
  }
}

/**
 * pgFenced runs fn in a transaction on db that begins with pgAdvance, and
 * commits it if fn succeeds; it rolls back and throws if either fails. db
 * must be one connection (a pg Client, or a PoolClient from pool.connect()),
 * not a Pool, whose queries may each take another connection. A stale
 * answer from fn's statements too (a fence_row_token trigger) becomes a
 * StaleError. opts.schema qualifies the guard's function, and
 * opts.reporter hears of stale writes (PgOptions).
 */
export async function pgFenced<T>(db: Queryable, presented: Presented, fn: (db: Queryable) => Promise<T>, opts: { seq?: bigint } & PgOptions = {}): Promise<T> {
  const { lease } = presentedToken(presented);
  pgFunction("fence_advance", opts); // a bad schema fails before BEGIN
  await db.query("BEGIN");
  try {
    await pgAdvance(db, presented, opts.seq, opts);
    const out = await fn(db);
    await db.query("COMMIT");
    return out;
  } catch (err) {
    // The error that matters is the first; a failed rollback adds nothing
    // the caller can act on (the connection is broken, and the server
    // rolls back anyway).
    await db.query("ROLLBACK").catch(() => undefined);
    throw pgError(err, lease, opts);
  }
}

/**
 * pgError turns the guard's SQLSTATEs into this package's errors: FN409
 * (stale, with DETAIL "scope=S presented_token=T highest_token=H ...") and
 * FN400 (a malformed argument). Other errors pass unchanged. A stale write
 * is reported to opts.reporter, or else through the lease's client.
 */
function pgError(err: unknown, lease: Lease | undefined, opts: PgOptions): unknown {
  if (err instanceof FenceError) return err;
  const e = err as { code?: string; message?: string; detail?: string };
  if (e?.code === "FN400") {
    return new InvalidError("token", e.message ?? "malformed fenced write", { cause: err });
  }
  if (e?.code !== "FN409") return err;
  const stale = staleFromFields(e.detail ?? "", lease);
  report(opts.reporter ?? lease?.reporterFor(opts.guard ?? "postgresql"), stale);
  return stale;
}

/**
 * pgMarkAdvancer advances marks in PostgreSQL for a Follower, with the
 * writers' own check: each advance is one statement, SELECT
 * "SCHEMA".fence_advance(scope, token, 0), its own transaction, which moves
 * the mark up and never back (a mark already past answers FN409, which
 * counts as done). db is a pg Pool, or a connection of its own on which no
 * transaction is left open; opts.schema is as for pgAdvance.
 *
 * Its scopes(prefix) lists the scopes under prefix that have a mark, from
 * the guard's table, "SCHEMA".fence_tokens (without a schema, the
 * fence_tokens the connection's search_path finds), so that a Follower
 * that starts closes the leases that ended while none ran.
 */
export function pgMarkAdvancer(db: Queryable, opts: Pick<PgOptions, "schema"> = {}): MarkAdvancer {
  const table = pgFunction("fence_tokens", opts); // a bad schema fails here
  const schema = { schema: opts.schema }; // the follower's own advances are no rejections to report
  return {
    async scopes(prefix) {
      // The database counts the prefix's characters (JavaScript's length
      // counts UTF-16 units): left() takes characters.
      const res = (await db.query(`SELECT scope FROM ${table} WHERE left(scope, char_length($1::text)) = $1::text`, [prefix])) as { rows?: { scope: string }[] };
      return (res.rows ?? []).map((r) => r.scope);
    },
    advance: (scope, token) => pgAdvance(db, { version: 1, scope, value: token }, undefined, schema),
  };
}
