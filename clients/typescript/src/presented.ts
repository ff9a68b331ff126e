// What the database guards share: the token a write presents, and the
// stale answers of the guards inside PostgreSQL and Redis, which both list
// "key=value" fields.

import { StaleError } from "./errors.js";
import type { Lease } from "./client.js";
import { parseToken, type Token } from "./token.js";

/** What a write presents: a Lease (its token, and marked lost on a stale answer), a Token or a token's text. */
export type Presented = Lease | Token | string;

/** presentedToken returns p's token, and p if it is a Lease; it throws the LostError of a lost Lease, which must not write. */
export function presentedToken(p: Presented): { token: Token; lease: Lease | undefined } {
  if (typeof p === "string") return { token: parseToken(p), lease: undefined };
  if ("tokenText" in p) {
    p.throwIfLost();
    return { token: parseToken(p.tokenText), lease: p };
  }
  return { token: p, lease: undefined };
}

/**
 * staleFromFields reads "scope=S presented_token=T highest_token=H
 * presented_seq=Q highest_seq=R" (the sequences may be absent) into a
 * StaleError, with the values as bigint. It marks lease lost when a newer
 * token was accepted: that proves a newer grant. A sequence refused under
 * the same token only says that a later write of this holder came first.
 */
export function staleFromFields(text: string, lease: Lease | undefined): StaleError {
  const f: Record<string, string> = {};
  // A scope has no spaces or '=', so the fields split on them.
  for (const m of text.matchAll(/([a-z_]+)=(\S*)/g)) f[m[1]!] = m[2]!;
  const num = (k: string) => (/^[0-9]{1,20}$/.test(f[k] ?? "") ? BigInt(f[k]!) : 0n);
  const stale = new StaleError({
    scope: f.scope ?? "",
    presented: num("presented_token"),
    highest: num("highest_token"),
    presentedSeq: num("presented_seq"),
    highestSeq: num("highest_seq"),
  });
  if (stale.highest > stale.presented) lease?.markLost(stale);
  return stale;
}
