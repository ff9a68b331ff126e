// The PostgreSQL and Redis guards, through fence's guard inside each
// (installed with fencectl guard install), with leases of a real fenced.
// They need make services' servers: FENCE_TEST_POSTGRES and
// FENCE_TEST_REDIS. Without them the tests skip, except under CI=true,
// where they fail.

import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { after, test } from "node:test";

import { createClient } from "@redis/client";
import { Redis } from "ioredis";
import pg from "pg";

import {
  Client,
  dataKey,
  InvalidError,
  LostError,
  pgAdvance,
  pgFenced,
  redisDel,
  redisHset,
  redisIncrby,
  redisSet,
  StaleError,
  type Lease,
  type RedisLike,
  type Token,
} from "../src/index.js";
import { installGuard, rpc, serverURL, startFenced } from "./fenced.js";

const pgURL = serverURL("FENCE_TEST_POSTGRES");
const redisURL = serverURL("FENCE_TEST_REDIS");
const fenced = await startFenced();
const client = new Client(fenced.url, { holder: "ts-db" });
after(() => client.close());

// The servers are shared with other test runs: every scope is new.
const run = randomUUID().slice(0, 8);

/**
 * takeOver gives scope's lease to a second holder behind the first one's
 * back: released at fenced by ID, while the first still believes it holds
 * it (its next renewal is seconds away), as a paused holder would.
 */
async function takeOver(first: Lease): Promise<Lease> {
  await rpc(fenced.url, "Release", { scope: first.scope, leaseId: first.leaseId });
  return client.acquire(first.scope, { ttl: 30_000 });
}

function isStale(presented: bigint, highest: bigint, seqs?: [bigint, bigint]) {
  return (err: unknown) => {
    assert.ok(err instanceof StaleError, String(err));
    assert.equal(err.presented, presented);
    assert.equal(err.highest, highest);
    if (seqs) assert.deepEqual([err.presentedSeq, err.highestSeq], seqs);
    return true;
  };
}

test("postgres: a superseded holder's write is refused and rolled back", { skip: pgURL === undefined && "FENCE_TEST_POSTGRES is not set" }, async () => {
  installGuard(pgURL!);
  const db = new pg.Client({ connectionString: pgURL });
  await db.connect();
  const table = `ts_orders_${run}`;
  await db.query(`CREATE TABLE ${table} (id int PRIMARY KEY, owner text NOT NULL)`);
  // One hook, as hooks run in the order they were added.
  after(async () => {
    await db.query(`DROP TABLE ${table}`);
    await db.end();
  });
  const write = (owner: string) => (tx: pg.Client | any) =>
    tx.query(`INSERT INTO ${table} VALUES (1, $1) ON CONFLICT (id) DO UPDATE SET owner = excluded.owner`, [owner]);

  const a = await client.acquire(`ts/pg/${run}`, { ttl: 30_000 });
  await pgFenced(db, a, write("a"));
  const b = await takeOver(a);
  await pgFenced(db, b, write("b"));
  assert.equal(a.lost.aborted, false, "a does not know yet");

  await assert.rejects(pgFenced(db, a, write("a, late")), isStale(a.token, b.token));
  assert.ok(a.lost.aborted, "a stale answer marks the lease lost");
  assert.ok(a.lost.reason instanceof LostError);
  assert.deepEqual((await db.query(`SELECT owner FROM ${table}`)).rows, [{ owner: "b" }], "the late write was rolled back");
  // A lost lease does not even try.
  await assert.rejects(pgFenced(db, a, write("again")), LostError);
  await b.release();
});

test("postgres: sequences, values beyond 2^53, malformed writes", { skip: pgURL === undefined && "FENCE_TEST_POSTGRES is not set" }, async () => {
  installGuard(pgURL!);
  const db = new pg.Client({ connectionString: pgURL });
  await db.connect();
  after(() => db.end());
  const tok = (value: bigint, scope = `ts/pg-seq/${run}`): Token => ({ version: 1, scope, value });
  const advance = async (t: Token, seq?: bigint) => {
    await db.query("BEGIN");
    try {
      await pgAdvance(db, t, seq);
      await db.query("COMMIT");
    } finally {
      await db.query("ROLLBACK"); // a no-op after COMMIT (with a warning)
    }
  };
  await advance(tok(9007199254740993n), 5n);
  await advance(tok(9007199254740993n), 5n); // an equal sequence passes
  await assert.rejects(advance(tok(9007199254740993n), 4n), isStale(9007199254740993n, 9007199254740993n, [4n, 5n]));
  // 2^53 and 2^53+1 are one double: as bigint they stay apart.
  await assert.rejects(advance(tok(9007199254740992n)), isStale(9007199254740992n, 9007199254740993n));
  await advance(tok((1n << 63n) - 1n));
  await assert.rejects(advance(tok(1n, "bad scope")), InvalidError);
});

// Both Redis clients the guard supports: ioredis (call) and node-redis
// (sendCommand).
const redisClients: [string, () => Promise<{ r: RedisLike; get(k: string): Promise<unknown>; close(): Promise<unknown> }>][] = [
  [
    "ioredis",
    async () => {
      const r = new Redis(redisURL!, { lazyConnect: true, maxRetriesPerRequest: 1 });
      await r.connect();
      return { r, get: (k) => r.get(k), close: () => r.quit() };
    },
  ],
  [
    "node-redis",
    async () => {
      const r = createClient({ url: redisURL });
      await r.connect();
      return { r: r as unknown as RedisLike, get: (k) => r.get(k), close: () => r.close() };
    },
  ],
];

for (const [name, connect] of redisClients) {
  test(`redis (${name}): a superseded holder's write is refused and changes nothing`, { skip: redisURL === undefined && "FENCE_TEST_REDIS is not set" }, async () => {
    installGuard(redisURL!);
    const { r, get, close } = await connect();
    after(close);
    const scope = `ts/redis-${name}/${run}`;
    const key = dataKey(scope, "owner");
    after(() => redisDel(r, `fence:v1:${scope}:${(1n << 63n) - 1n}`, [key]).catch(() => undefined));

    const a = await client.acquire(scope, { ttl: 30_000 });
    assert.equal(await redisSet(r, a, key, "a"), "OK");
    const b = await takeOver(a);
    assert.equal(await redisSet(r, b, key, "b"), "OK");
    await assert.rejects(redisSet(r, a, key, "a, late"), isStale(a.token, b.token));
    assert.ok(a.lost.aborted, "a stale answer marks the lease lost");
    assert.equal(await get(key), "b");
    await assert.rejects(redisSet(r, a, key, "again"), LostError);

    // The other calls, sequences, and a key outside the scope.
    await redisHset(r, b, dataKey(scope, "h"), { f: "1" }, { seq: 3n });
    await assert.rejects(redisIncrby(r, b, dataKey(scope, "n"), 1n, { seq: 2n }), isStale(b.token, b.token, [2n, 3n]));
    assert.equal(Number(await redisIncrby(r, b, dataKey(scope, "n"), 2n, { seq: 3n })), 2);
    await assert.rejects(redisSet(r, b, dataKey("ts/elsewhere", "x"), "v"), InvalidError);
    await redisDel(r, b, [dataKey(scope, "h"), dataKey(scope, "n")]);
    await b.release();
  });
}

test("redis: values beyond 2^53 compare exactly", { skip: redisURL === undefined && "FENCE_TEST_REDIS is not set" }, async () => {
  installGuard(redisURL!);
  const r = new Redis(redisURL!, { lazyConnect: true, maxRetriesPerRequest: 1 });
  await r.connect();
  after(() => r.quit());
  const scope = `ts/redis-big/${run}`;
  const key = dataKey(scope, "v");
  await redisSet(r, `fence:v1:${scope}:9007199254740993`, key, "x");
  await assert.rejects(redisSet(r, `fence:v1:${scope}:9007199254740992`, key, "y"), isStale(9007199254740992n, 9007199254740993n));
  await redisDel(r, `fence:v1:${scope}:${(1n << 63n) - 1n}`, [key]);
});
