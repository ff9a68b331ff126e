// Fencing over HTTP: a middleware for Node's http (and Express) that checks
// the Fencing-Token header, and fencedFetch, which sends it.

import type { IncomingMessage, ServerResponse } from "node:http";

import { FenceError, InvalidError, StaleError } from "./errors.js";
import type { MarkStore, Write } from "./guard.js";
import type { Verifier } from "./keys.js";
import { formatToken, parseToken, type Token } from "./token.js";
import type { Lease } from "./client.js";
import { report, type RejectionReporter } from "./report.js";

/** The header names of docs/protocol.md. */
export const TOKEN_HEADER = "Fencing-Token";
export const SEQUENCE_HEADER = "Fencing-Sequence";

/** PROBLEM_TYPE identifies a stale rejection in problem+json bodies. */
export const PROBLEM_TYPE = "https://fence.dev/problems/stale-token";

const MAX_SEQ = (1n << 64n) - 1n;

/** MiddlewareOptions configure fencingMiddleware. */
export interface MiddlewareOptions {
  /** The scope every request writes; or give scopeOf. */
  scope?: string;
  /** Picks the scope per request (a shard per path segment, say); replaces scope. */
  scopeOf?: (req: IncomingMessage) => string;
  /** Where the highest mark of each scope is kept. */
  store: MarkStore;
  /**
   * Checks signatures: a KeySet or a RemoteKeySet of fenced's /keys. A token
   * it refuses never reaches the store. Without one any well-formed token is
   * believed, and one forged token of 2^63−1 would lock out every honest
   * writer.
   */
  verifier?: Verifier;
  /** Refuse a write whose sequence is not greater than the last one of its token. */
  strict?: boolean;
  /**
   * Let GET, HEAD, OPTIONS and TRACE pass unchecked. Give it only when the
   * handler writes on none of them.
   */
  unfencedReads?: boolean;
  /**
   * Told of every write refused as stale (a Reporter, such as
   * client.reporter("orders-api")), which sends them to fenced, whatever
   * the store.
   */
  reporter?: RejectionReporter;
}

/** A Node http or Express style middleware. */
export type Middleware = (req: IncomingMessage, res: ServerResponse, next: (err?: unknown) => void) => void;

/**
 * fencingMiddleware fences the requests it wraps, whatever their method
 * (unless unfencedReads): a request must carry exactly one Fencing-Token
 * header with a token of the scope, verified if a verifier is given, and
 * not older than the highest the store has accepted for the scope. A stale
 * token gets 409 Conflict, a missing, malformed, foreign-scope or
 * unverifiable one 400 Bad Request, both with an RFC 9457
 * application/problem+json body, as docs/protocol.md specifies.
 *
 * The rest of the chain (next) runs inside the store's atomic section for
 * the scope, until the response has been sent: the writes of one scope
 * through one middleware run one at a time. A response with an error status
 * (400 or above) counts as a failed write: its sequence number is not
 * recorded, but its token still becomes the scope's highest, since it was
 * granted and so every older lease is over.
 *
 * Unlike Go's httpguard, the handler's answer is not held back: a store
 * that commits the handler's writes with the mark could fail after the
 * answer is sent. The stores of this package keep the mark apart from the
 * handler's writes, so there is nothing to hold back for.
 */
export function fencingMiddleware(opts: MiddlewareOptions): Middleware {
  const scopeOf = opts.scopeOf ?? (() => opts.scope ?? "");
  if (opts.scopeOf === undefined && opts.scope === undefined) {
    throw new FenceError("fencingMiddleware: give a scope or a scopeOf");
  }
  return (req, res, next) => {
    if (opts.unfencedReads && ["GET", "HEAD", "OPTIONS", "TRACE"].includes(req.method ?? "")) {
      next();
      return;
    }
    const scope = scopeOf(req);
    serve(opts, scope, req, res, next).catch((err) => {
      // Only a bug gets here; the request must still get an answer.
      if (!res.headersSent) {
        writeProblem(res, { type: "about:blank", title: "Fencing check failed", status: 500, detail: String(err), scope });
      }
    });
  };
}

async function serve(opts: MiddlewareOptions, scope: string, req: IncomingMessage, res: ServerResponse, next: (err?: unknown) => void): Promise<void> {
  let w: Write;
  try {
    w = readWrite(req);
    if (w.token.scope !== scope) {
      throw new InvalidError("token", `token is for another scope: ${formatToken(w.token)} presented for scope "${scope}"`);
    }
    await opts.verifier?.verify(w.token);
  } catch (err) {
    if (err instanceof InvalidError) {
      writeProblem(res, { type: "about:blank", title: "Bad fencing token", status: 400, detail: err.message, scope });
    } else {
      writeProblem(res, { type: "about:blank", title: "Fencing check failed", status: 500, detail: errText(err), scope });
    }
    return;
  }
  const failed = Symbol("the handler answered an error status");
  try {
    await opts.store.fence(w, opts.strict ?? false, async () => {
      await runRest(res, next);
      if (res.statusCode >= 400) throw failed;
    });
  } catch (err) {
    if (err === failed) {
      // The token passed the check: record it, so that older leases'
      // writes are refused from now on. A stale answer means the mark is
      // past it already; any other failure, the next write records it.
      await opts.store.fence({ token: w.token }, false, async () => undefined).catch(() => undefined);
      return;
    }
    if (res.headersSent) {
      // The handler answered, and the store failed after it: nothing more
      // can be told to the client.
      return;
    }
    if (err instanceof StaleError) {
      report(opts.reporter, err);
      writeProblem(res, {
        type: PROBLEM_TYPE,
        title: "Stale fencing token",
        status: 409,
        detail: err.message,
        scope: err.scope,
        presented: err.presented,
        highest: err.highest,
      });
    } else {
      writeProblem(res, { type: "about:blank", title: "Fencing check failed", status: 500, detail: errText(err), scope });
    }
  }
}

/** runRest calls next and resolves when the response is finished or its connection gone. */
function runRest(res: ServerResponse, next: (err?: unknown) => void): Promise<void> {
  return new Promise((resolve) => {
    if (res.writableEnded) return resolve();
    res.once("finish", resolve);
    res.once("close", resolve);
    try {
      next();
    } catch (err) {
      // A synchronous throw in a plain http chain: answer it, which ends
      // the response and so the section.
      if (!res.headersSent) {
        writeProblem(res, { type: "about:blank", title: "Internal Server Error", status: 500, detail: errText(err) });
      } else {
        res.destroy(err as Error);
      }
    }
  });
}

/** readWrite reads the token and sequence headers; it throws InvalidError for a bad one. */
function readWrite(req: IncomingMessage): Write {
  const toks = req.headersDistinct[TOKEN_HEADER.toLowerCase()] ?? [];
  if (toks.length === 0) {
    throw new InvalidError("token", `missing ${TOKEN_HEADER} header: want the lease's token, e.g. ${TOKEN_HEADER}: fence:v1:SCOPE:TOKEN`);
  }
  if (toks.length > 1) {
    // A proxy in front may read another one than the guard.
    throw new InvalidError("token", `${toks.length} ${TOKEN_HEADER} headers: want exactly one`);
  }
  let token: Token;
  try {
    token = parseToken(toks[0]!);
  } catch (err) {
    throw new InvalidError("token", `${TOKEN_HEADER} header: ${(err as Error).message}`);
  }
  const seqs = req.headersDistinct[SEQUENCE_HEADER.toLowerCase()] ?? [];
  if (seqs.length > 1) {
    throw new InvalidError("sequence", `${seqs.length} ${SEQUENCE_HEADER} headers: want at most one`);
  }
  const s = seqs[0] ?? "";
  if (s === "") return { token };
  if (!/^[0-9]{1,20}$/.test(s) || BigInt(s) === 0n || BigInt(s) > MAX_SEQ) {
    throw new InvalidError("sequence", `${SEQUENCE_HEADER} header ${JSON.stringify(s)}: want a decimal integer from 1 to ${MAX_SEQ}`);
  }
  return { token, seq: BigInt(s) };
}

interface Problem {
  type: string;
  title: string;
  status: number;
  detail: string;
  scope?: string;
  presented?: bigint;
  highest?: bigint;
}

/**
 * writeProblem answers p as application/problem+json, with the fields in
 * the order and with the omissions of Go's httpguard. The tokens are JSON
 * numbers written from their bigint digits, exact beyond 2^53.
 */
function writeProblem(res: ServerResponse, p: Problem): void {
  const fields = [
    `"type":${JSON.stringify(p.type)}`,
    `"title":${JSON.stringify(p.title)}`,
    `"status":${p.status}`,
    `"detail":${JSON.stringify(p.detail)}`,
  ];
  if (p.scope) fields.push(`"scope":${JSON.stringify(p.scope)}`);
  if (p.presented) fields.push(`"presented_token":${p.presented.toString()}`);
  if (p.highest) fields.push(`"highest_token":${p.highest.toString()}`);
  const body = `{${fields.join(",")}}\n`;
  res.writeHead(p.status, { "content-type": "application/problem+json", "content-length": Buffer.byteLength(body) });
  res.end(body);
}

function errText(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}

/** FencedFetchOptions add a sequence number to fencedFetch. */
export interface FencedFetchOptions extends RequestInit {
  /** The write's sequence number within its epoch (Fencing-Sequence). */
  seq?: bigint;
}

/**
 * fencedFetch sends a request with the lease's token in the Fencing-Token
 * header. It refuses to send once the lease is lost, throwing its
 * LostError. A 409 answer with the stale-token problem for this lease's
 * scope and token throws a StaleError with the body's tokens, read exactly,
 * and marks the lease lost if the guard has accepted a newer token; never
 * retry that write with this lease. A stale problem naming another scope or
 * token (a server passing on the refusal of its own write downstream) and
 * other answers are returned as they are.
 */
export async function fencedFetch(lease: Lease, input: string | URL, init: FencedFetchOptions = {}): Promise<Response> {
  lease.throwIfLost();
  const headers = new Headers(init.headers);
  headers.set(TOKEN_HEADER, lease.tokenText);
  if (init.seq !== undefined) headers.set(SEQUENCE_HEADER, init.seq.toString());
  const res = await fetch(input, { ...init, headers });
  if (res.status !== 409 || !(res.headers.get("content-type") ?? "").startsWith("application/problem+json")) {
    return res;
  }
  const text = await res.text();
  const stale = staleFromProblem(text);
  // A server may pass on the rejection of another lease's token (its own
  // write downstream): that says nothing about this lease. Fields the
  // problem lacks are given the benefit of the doubt, so that a terse
  // guard still ends the lease, as Go's httpguard.Transport does.
  if (
    stale === undefined ||
    (stale.scope !== "" && stale.scope !== lease.scope) ||
    (stale.presented !== 0n && stale.presented !== lease.token)
  ) {
    // Some other conflict: give the caller the answer, body included.
    return new Response(text, { status: res.status, statusText: res.statusText, headers: res.headers });
  }
  // A newer token proves a newer grant; a sequence refused under the same
  // token only says that a later write of this holder came first.
  if (stale.highest > stale.presented) lease.markLost(stale);
  throw stale;
}

/**
 * staleFromProblem reads a 409 stale-token problem body, taking the token
 * numbers from their digits (JSON.parse would round them to doubles). It
 * returns undefined for any other body.
 */
export function staleFromProblem(body: string): StaleError | undefined {
  let p: { type?: unknown; scope?: unknown };
  try {
    p = JSON.parse(body);
  } catch {
    return undefined;
  }
  if (p.type !== PROBLEM_TYPE) return undefined;
  const digits = (name: string) => BigInt(new RegExp(`"${name}"\\s*:\\s*([0-9]+)`).exec(body)?.[1] ?? "0");
  return new StaleError({ scope: typeof p.scope === "string" ? p.scope : "", presented: digits("presented_token"), highest: digits("highest_token") });
}
