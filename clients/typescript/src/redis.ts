// Fenced writes to Redis through fence's guard inside Redis: the Redis 7
// function library that `fencectl guard install redis://...` loads
// (guard/redisguard/fence.lua), called with FCALL. Its marks are where Go's
// redisguard keeps them, so Go and TypeScript writers of a scope share one
// mark. Works with ioredis (call) and node-redis (sendCommand); this module
// imports neither.

import { FenceError, InvalidError } from "./errors.js";
import type { Lease } from "./client.js";
import type { MarkAdvancer } from "./follow.js";
import { presentedToken, staleFromFields, type Presented } from "./presented.js";
import { report, type RejectionReporter } from "./report.js";

/** RedisLike is an ioredis client (call) or a node-redis client (sendCommand). */
export type RedisLike = { call(command: string, ...args: string[]): Promise<unknown> } | { sendCommand(args: string[]): Promise<unknown> };

/**
 * markKey is the key of a scope's mark: "fence:{SCOPE}", as Go's redisguard
 * keeps it, and the only form the library accepts as its first key.
 */
export function markKey(scope: string): string {
  return `fence:{${scope}}`;
}

/**
 * dataKey names a key of scope's data: "{SCOPE}:name". The guard writes only
 * keys tagged with the scope they are fenced by (and in a Redis Cluster the
 * tag keeps them in the mark's slot).
 */
export function dataKey(scope: string, name: string): string {
  return `{${scope}}:${name}`;
}

/** RedisWriteOptions configure one fenced write. */
export interface RedisWriteOptions {
  /** The write's sequence number (1 to 2^64−1), ordering the writes of one token. */
  seq?: bigint;
  /**
   * Told of the write if the guard refuses it as stale (a Reporter, such as
   * client.reporter("orders-cache")), which sends it to fenced.
   */
  reporter?: RejectionReporter;
  /**
   * Names the guard when a Lease's client reports for it, without reporter
   * (default "redis"; ClientOptions.reportRejections).
   */
  guard?: string;
}

/**
 * redisSet is SET key value [options...] if the token is current for its
 * scope, and advances the mark in the same function call. key must be a
 * dataKey of the token's scope. A stale token throws a StaleError (and
 * marks a Lease lost) and changes nothing.
 */
export function redisSet(redis: RedisLike, presented: Presented, key: string, value: string, options: string[] = [], opts: RedisWriteOptions = {}): Promise<unknown> {
  return fcall(redis, "fence_set", presented, [key], [value, ...options], opts);
}

/** redisDel is DEL keys... if the token is current; see redisSet. */
export function redisDel(redis: RedisLike, presented: Presented, keys: string[], opts: RedisWriteOptions = {}): Promise<unknown> {
  return fcall(redis, "fence_del", presented, keys, [], opts);
}

/** redisHset is HSET key field value [field value ...] if the token is current; see redisSet. */
export function redisHset(redis: RedisLike, presented: Presented, key: string, values: Record<string, string>, opts: RedisWriteOptions = {}): Promise<unknown> {
  return fcall(redis, "fence_hset", presented, [key], Object.entries(values).flat(), opts);
}

/** redisIncrby is INCRBY key increment if the token is current; see redisSet. */
export function redisIncrby(redis: RedisLike, presented: Presented, key: string, increment: bigint, opts: RedisWriteOptions = {}): Promise<unknown> {
  return fcall(redis, "fence_incrby", presented, [key], [increment.toString()], opts);
}

async function fcall(redis: RedisLike, fn: string, presented: Presented, keys: string[], args: string[], opts: RedisWriteOptions): Promise<unknown> {
  const { token, lease } = presentedToken(presented);
  const cmd = [fn, String(keys.length + 1), markKey(token.scope), ...keys, token.value.toString(), (opts.seq ?? 0n).toString(), ...args];
  try {
    return "call" in redis ? await redis.call("FCALL", ...cmd) : await redis.sendCommand(["FCALL", ...cmd]);
  } catch (err) {
    throw redisError(err, lease, opts);
  }
}

/**
 * redisError turns the library's error replies into this package's errors:
 * "STALE scope=S presented_token=T highest_token=H presented_seq=Q
 * highest_seq=R" and "ERR fence: ..." (bad arguments). Other errors pass
 * unchanged. A stale write is reported to opts.reporter, or else through
 * the lease's client.
 */
function redisError(err: unknown, lease: Lease | undefined, opts: RedisWriteOptions): unknown {
  if (err instanceof FenceError) return err;
  const msg = String((err as Error)?.message ?? err);
  if (msg.startsWith("ERR fence: ")) {
    return new InvalidError("", msg, { cause: err });
  }
  if (!msg.startsWith("STALE ")) return err;
  const stale = staleFromFields(msg, lease);
  report(opts.reporter ?? lease?.reporterFor(opts.guard ?? "redis"), stale);
  return stale;
}

/**
 * redisMarkAdvancer advances marks in Redis for a Follower, with the
 * writers' own check: FCALL fence_advance on the mark fence:{SCOPE}, which
 * moves the mark up and never back (a mark already past answers STALE,
 * which counts as done) and writes nothing else.
 *
 * Its scopes(prefix) lists the scopes under prefix that have a mark, with
 * SCAN MATCH fence:{PREFIX*} (the prefix's glob characters quoted), so
 * that a Follower that starts closes the leases that ended while none ran.
 * Given an ioredis Cluster, it scans every master.
 */
export function redisMarkAdvancer(redis: RedisLike): MarkAdvancer {
  return {
    async advance(scope, token) {
      await fcall(redis, "fence_advance", { version: 1, scope, value: token }, [], [], {});
    },
    async scopes(prefix) {
      const start = markKey(prefix).slice(0, -1); // "fence:{PREFIX"
      const match = globQuote(start) + "*}";
      // An ioredis Cluster sends a SCAN to one node: scan each master.
      const nodes = (redis as { nodes?: (role: string) => RedisLike[] }).nodes;
      const clients = typeof nodes === "function" ? nodes.call(redis, "master") : [redis];
      const scopes = new Set<string>(); // SCAN may return a key more than once
      for (const c of clients) {
        let cursor = "0";
        do {
          const args = ["SCAN", cursor, "MATCH", match, "COUNT", "1000"];
          const reply = ("call" in c ? await c.call(args[0]!, ...args.slice(1)) : await c.sendCommand(args)) as [unknown, unknown[]];
          cursor = String(reply[0]);
          for (const k of reply[1]) {
            const key = String(k);
            if (key.startsWith(start) && key.endsWith("}")) scopes.add(key.slice("fence:{".length, -1));
          }
        } while (cursor !== "0");
      }
      return [...scopes];
    },
  };
}

/** globQuote quotes the characters special in a SCAN pattern. */
function globQuote(s: string): string {
  return s.replace(/[\\*?[\]]/g, "\\$&");
}
