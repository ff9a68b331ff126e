// Watch over Connect's streaming framing for HTTP/1.1 JSON
// (docs/protocol.md, "Watch"): a request of one frame, an answer of frames,
// each a flags byte, a 4-byte big-endian length and the JSON; flags 02 marks
// the end frame, {"error": ...} or {}. A stream that ends without it was cut
// off.

import { FenceError, UnavailableError } from "./errors.js";

/**
 * EventKind is a watch event's kind: the wire's EVENT_KIND_X, as "x". The
 * leader records "renewed" a quarter of the lease's TTL apart at least,
 * "lost" once a lease, "rejected" once a stale token of a scope, in a tenth
 * of the events it keeps at most (docs/protocol.md, "Watch").
 */
export type EventKind = "granted" | "renewed" | "released" | "expired" | "lost" | "rejected" | "held" | "unspecified";

/**
 * WatchEvent is one lease event, as fenced recorded it. Tokens and positions
 * are bigint (exact up to 2^63−1); a field the service left out is 0n, "" or
 * undefined.
 */
export interface WatchEvent {
  /** Where the event is in the leader's log of events; 0n for "held". */
  position: bigint;
  kind: EventKind;
  scope: string;
  token: bigint;
  holder: string;
  /** The lease ID's fingerprint (not a prefix of it): tells leases apart, reveals nothing. */
  leaseIdPrefix: string;
  ttlMs: number;
  /** When fenced recorded the event, on its wall clock. */
  time: Date | undefined;
  /** "lost": the scope's token then; "rejected": the highest the guard had accepted. */
  currentToken: bigint;
  /** "rejected": the guard that refused the write. */
  guard: string;
  /**
   * "released" and "expired", from log format 8: the token value the end of
   * the lease consumed and granted to nobody. A guard advanced to it refuses
   * the ended lease's token; every later grant is above it.
   */
  closingToken: bigint;
}

/** WatchResponse is one message of a watch stream. */
export interface WatchResponse {
  events: WatchEvent[];
  /** The startPosition that resumes the watch right after this response. */
  nextPosition: bigint;
  /** More pages of held leases follow (includeHeld). */
  moreHeld: boolean;
}

/** WatchOptions configure one watch stream. */
export interface WatchOptions {
  /** Resume after a response: its nextPosition. 0n or absent: from now. */
  startPosition?: bigint;
  /** First, a "held" event for each lease held under the prefix. */
  includeHeld?: boolean;
  /** Ends the stream. */
  signal?: AbortSignal;
}

/** fromWire turns a Connect error object into a FenceError; it is client.ts's fromConnect. */
export type FromWire = (body: { code: string; message?: string; details?: { type?: string; debug?: any }[] }, signal?: AbortSignal) => FenceError;

/**
 * watchStream runs one watch stream at base and yields its responses. It
 * throws the end frame's error (a FenceError with its code: "out_of_range"
 * when the start position is no longer kept, an UnavailableError when the
 * leader stepped down), an UnavailableError when the connection fails or
 * the stream is cut off without its end frame, and the signal's reason once
 * it aborts. It returns when the service ends the stream without an error.
 */
export async function* watchStream(
  base: string,
  headers: Record<string, string>,
  prefix: string,
  opts: WatchOptions,
  fromWire: FromWire,
): AsyncGenerator<WatchResponse, void, undefined> {
  const { signal } = opts;
  const url = `${base}/fence.v1.LeaseService/Watch`;
  const json = Buffer.from(
    JSON.stringify({ prefix, startPosition: (opts.startPosition ?? 0n).toString(), includeHeld: opts.includeHeld ?? false }),
  );
  const frame = Buffer.alloc(5 + json.length);
  frame.writeUInt32BE(json.length, 1);
  json.copy(frame, 5);
  let res: Response;
  try {
    res = await fetch(url, { method: "POST", headers: { ...headers, "content-type": "application/connect+json" }, body: frame, signal });
  } catch (err) {
    if (signal?.aborted) throw signal.reason;
    throw new UnavailableError(`${url}: ${(err as Error)?.message ?? err}`, { cause: err });
  }
  if (res.status !== 200 || !(res.headers.get("content-type") ?? "").startsWith("application/connect+json") || res.body === null) {
    const text = await res.text().catch(() => "");
    let body: any;
    try {
      body = JSON.parse(text);
    } catch {
      body = undefined;
    }
    if (typeof body?.code === "string") throw fromWire(body, signal);
    const msg = `${url}: ${res.status} ${res.statusText}: ${text.slice(0, 200)}`;
    throw res.status >= 502 && res.status <= 504 ? new UnavailableError(msg) : new FenceError(msg);
  }
  const reader = res.body.getReader();
  let buf = Buffer.alloc(0);
  try {
    for (;;) {
      while (buf.length >= 5 && buf.length >= 5 + buf.readUInt32BE(1)) {
        const flags = buf[0]!;
        const n = buf.readUInt32BE(1);
        const msg = JSON.parse(buf.subarray(5, 5 + n).toString("utf8"));
        buf = buf.subarray(5 + n);
        if (flags & 1) {
          // Never asked for (no Connect-Accept-Encoding): a proxy's doing.
          throw new FenceError(`${url}: a compressed frame, which this client did not ask for`);
        }
        if (flags & 2) {
          if (msg?.error !== undefined) throw fromWire(msg.error, signal);
          return;
        }
        yield watchResponse(msg);
      }
      let chunk: Awaited<ReturnType<typeof reader.read>>;
      try {
        chunk = await reader.read();
      } catch (err) {
        if (signal?.aborted) throw signal.reason;
        throw new UnavailableError(`${url}: the watch stream broke: ${(err as Error)?.message ?? err}`, { cause: err });
      }
      if (chunk.done) {
        throw new UnavailableError(`${url}: the watch stream was cut off (no end frame)`);
      }
      buf = buf.length === 0 ? Buffer.from(chunk.value) : Buffer.concat([buf, chunk.value]);
    }
  } finally {
    // Stopped early, by the caller or an error: close the connection.
    await reader.cancel().catch(() => undefined);
  }
}

function watchResponse(m: any): WatchResponse {
  return {
    events: Array.isArray(m?.events) ? m.events.map(watchEvent) : [],
    nextPosition: big(m?.nextPosition),
    moreHeld: m?.moreHeld === true,
  };
}

function watchEvent(e: any): WatchEvent {
  const kind = typeof e?.kind === "string" && e.kind.startsWith("EVENT_KIND_") ? e.kind.slice(11).toLowerCase() : "unspecified";
  const ttl = typeof e?.ttl === "string" && e.ttl.endsWith("s") ? Number(e.ttl.slice(0, -1)) * 1000 : 0;
  const time = typeof e?.time === "string" ? new Date(e.time) : undefined;
  return {
    position: big(e?.position),
    kind: kind as EventKind,
    scope: e?.scope ?? "",
    token: big(e?.token),
    holder: e?.holder ?? "",
    leaseIdPrefix: e?.leaseIdPrefix ?? "",
    ttlMs: Number.isFinite(ttl) ? ttl : 0,
    time: time !== undefined && Number.isFinite(time.getTime()) ? time : undefined,
    currentToken: big(e?.currentToken),
    guard: e?.guard ?? "",
    closingToken: big(e?.closingToken),
  };
}

/** big reads a 64-bit JSON field (a string of digits; a number from a lenient sender), 0n if absent or not one. */
function big(v: unknown): bigint {
  if (typeof v === "string" && /^[0-9]{1,20}$/.test(v)) return BigInt(v);
  if (typeof v === "number" && Number.isSafeInteger(v) && v >= 0) return BigInt(v);
  return 0n;
}
