// The Follower with a real fenced and the guards inside PostgreSQL and Redis
// (fencectl guard install), as Go's guard/follow tests do: a released or
// expired lease's late write is refused before anyone else wrote with a
// follower, and accepted without one; marks never move back; the follower
// resumes within a term where it was (a connection cut by a proxy) and
// reads the state again across a restart of fenced; a follower that starts
// closes the leases that ended while none ran, over a store that names its
// scopes.

import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { createServer, connect, type Socket } from "node:net";
import { after, test } from "node:test";

import { Redis } from "ioredis";
import pg from "pg";

import {
  Client,
  dataKey,
  Follower,
  markKey,
  MemoryMarkStore,
  markStoreAdvancer,
  pgFenced,
  pgMarkAdvancer,
  redisMarkAdvancer,
  redisSet,
  StaleError,
  type Lease,
  type MarkAdvancer,
} from "../src/index.js";
import { installGuard, serverURL, startFenced, until } from "./fenced.js";

const pgURL = serverURL("FENCE_TEST_POSTGRES");
const redisURL = serverURL("FENCE_TEST_REDIS");
const run = randomUUID().slice(0, 8);
// FENCE_TEST_VERBOSE=1 shows the followers' warnings.
const quiet = process.env.FENCE_TEST_VERBOSE ? {} : { onWarning: () => undefined };


/** follow runs a Follower until the test file ends. */
function follow(client: Client, marks: MarkAdvancer, prefix: string): Follower {
  const f = new Follower(client, marks, prefix, quiet);
  const ac = new AbortController();
  const done = f.run(ac.signal);
  after(async () => {
    ac.abort();
    await done;
  });
  return f;
}

/** A guard inside a database: how a writer writes with a token, and where its mark is. */
interface Guarded {
  name: string;
  marks: MarkAdvancer;
  write(token: string, scope: string): Promise<unknown>;
  mark(scope: string): Promise<bigint>;
  /** plant makes a mark named name directly, bypassing the guard's checks (removed when the file ends). */
  plant(name: string): Promise<void>;
}

async function postgres(): Promise<Guarded> {
  installGuard(pgURL!);
  const db = new pg.Client({ connectionString: pgURL });
  await db.connect();
  const pool = new pg.Pool({ connectionString: pgURL, max: 4 });
  const planted: string[] = [];
  after(async () => {
    if (planted.length > 0) await db.query("DELETE FROM fence_tokens WHERE scope = ANY($1)", [planted]);
    await db.end();
    await pool.end();
  });
  return {
    name: "postgres",
    marks: pgMarkAdvancer(pool),
    write: (token) => pgFenced(db, token, (tx) => tx.query("SELECT 1")),
    mark: async (scope) => BigInt((await db.query("SELECT token::text AS t FROM fence_tokens WHERE scope = $1", [scope])).rows[0]?.t ?? "0"),
    plant: async (name) => {
      planted.push(name);
      await db.query("INSERT INTO fence_tokens (scope, token, seq) VALUES ($1, 1, 0)", [name]);
    },
  };
}

async function redis(): Promise<Guarded> {
  installGuard(redisURL!);
  const r = new Redis(redisURL!, { lazyConnect: true, maxRetriesPerRequest: 1 });
  await r.connect();
  const scopes: string[] = [];
  after(async () => {
    for (const s of scopes) await r.del(markKey(s), dataKey(s, "v"));
    await r.quit();
  });
  return {
    name: "redis",
    marks: redisMarkAdvancer(r),
    write: (token, scope) => {
      scopes.push(scope);
      return redisSet(r, token, dataKey(scope, "v"), token);
    },
    mark: async (scope) => BigInt((await r.hget(markKey(scope), "token")) ?? "0"),
    plant: async (name) => {
      scopes.push(name);
      await r.hset(markKey(name), "token", "1", "seq", "0");
    },
  };
}

const stores: [string, string | undefined, () => Promise<Guarded>][] = [
  ["postgres", pgURL, postgres],
  ["redis", redisURL, redis],
];

for (const [name, url, open] of stores) {
  test(`${name}: a released or expired lease's late write is refused with a follower before anyone else wrote, and accepted without`, { skip: url === undefined && `the ${name} server is not set` }, async () => {
    const fenced = await startFenced();
    const client = new Client(fenced.url, { holder: "ts-follow" });
    after(() => client.close());
    const g = await open();
    const on = `ts/follow/${run}/on/`;
    const f = follow(client, g.marks, on);

    for (const end of ["released", "expired"]) {
      const followed = `${on}${name}-${end}`;
      const plain = `ts/follow/${run}/off/${name}-${end}`;
      const ttl = end === "expired" ? 300 : 30_000;
      const leases: Lease[] = [await client.acquire(followed, { ttl }), await client.acquire(plain, { ttl })];
      for (const l of leases) await g.write(l.tokenText, l.scope); // the holder's own write
      for (const l of leases) {
        if (end === "released") await l.release();
        else l.markLost("the test stops renewing it; fenced expires it");
      }
      await until("the leases' end at fenced", async () => (await Promise.all(leases.map((l) => client.get(l.scope)))).every((st) => st.lease === undefined));
      const [a, b] = leases as [Lease, Lease];
      const closing = (await client.get(followed)).lastToken;
      assert.equal(closing, a.token + 1n, "the closing token: one above the lease's (log format 8)");
      await until("the follower to advance the mark to the closing", async () => (await g.mark(followed)) === closing);

      // The ended holder's delayed write arrives; nobody else wrote.
      await assert.rejects(g.write(a.tokenText, followed), (err: unknown) => {
        assert.ok(err instanceof StaleError, String(err));
        assert.deepEqual([err.presented, err.highest], [a.token, closing]);
        return true;
      });
      await g.write(b.tokenText, plain); // without a follower: accepted, the window a follower closes
      assert.equal(await g.mark(plain), b.token);

      // The next holder is above the closing, and writes.
      const next = await client.acquire(followed, { ttl: 30_000 });
      assert.equal(next.token, a.token + 2n);
      await g.write(next.tokenText, followed);
      await next.release();
    }
    await until("no lag once caught up", () => f.lagMs === 0);
    assert.ok(f.advanced >= 6, `advanced ${f.advanced}`);
    assert.equal(f.resyncs, 0);
  });
}

test("postgres: the follower never moves a mark back, and leaves other prefixes alone", { skip: pgURL === undefined && "FENCE_TEST_POSTGRES is not set" }, async () => {
  const fenced = await startFenced();
  const client = new Client(fenced.url, { holder: "ts-follow" });
  after(() => client.close());
  const g = await postgres();
  const prefix = `ts/follow-back/${run}/`;
  const high = (1n << 62n).toString();
  await g.write(`fence:v1:${prefix}high:${high}`, `${prefix}high`); // another writer, far ahead
  const f = follow(client, g.marks, prefix);

  const l = await client.acquire(`${prefix}high`, { ttl: 30_000 });
  await l.release();
  // A scope after it, so that once its mark moves, the first one's did.
  const later = await client.acquire(`${prefix}later`, { ttl: 30_000 });
  await until("later's mark", async () => (await g.mark(`${prefix}later`)) === later.token);
  assert.equal((await g.mark(`${prefix}high`)).toString(), high, "the higher mark is kept");
  const other = await client.acquire(`ts/follow-other/${run}`, { ttl: 30_000 });
  await later.release();
  await until("later's closing", async () => (await g.mark(`${prefix}later`)) === later.token + 1n);
  assert.equal(await g.mark(other.scope), 0n, "a scope outside the prefix was not advanced");
  // advanced counts an advance once its query has answered the follower,
  // which can be after the mark shows in PostgreSQL; high's may still be
  // out: once nothing is pending, all four are counted.
  await until("no lag once caught up", () => f.lagMs === 0);
  assert.ok(f.advanced >= 3, `advanced ${f.advanced}`);
});

/** proxy forwards TCP connections to port; cut() breaks them all and refuses new ones until uncut(). */
async function proxy(port: number): Promise<{ url: string; cut(): void; uncut(): void }> {
  let cut = false;
  const conns = new Set<Socket>();
  const server = createServer((inbound) => {
    if (cut) return inbound.destroy();
    const out = connect(port, "127.0.0.1");
    for (const s of [inbound, out]) {
      conns.add(s);
      s.on("close", () => conns.delete(s));
      s.on("error", () => undefined);
    }
    inbound.pipe(out).on("error", () => undefined);
    out.pipe(inbound).on("error", () => undefined);
    inbound.on("close", () => out.destroy());
    out.on("close", () => inbound.destroy());
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  after(() => {
    for (const s of conns) s.destroy();
    server.close();
  });
  const { port: p } = server.address() as { port: number };
  return {
    url: `http://127.0.0.1:${p}`,
    cut() {
      cut = true;
      for (const s of conns) s.destroy();
    },
    uncut() {
      cut = false;
    },
  };
}

test("the follower resumes where it was within a term, and reads the state again across a restart of fenced", async () => {
  const fenced = await startFenced();
  const p = await proxy(Number(new URL(fenced.url).port));
  const client = new Client(fenced.url, { holder: "ts-follow" });
  after(() => client.close());
  const store = new MemoryMarkStore();
  const f = follow(new Client(p.url, { retryTimeoutMs: 500 }), markStoreAdvancer(store), "");
  const grant = async (scope: string) => {
    const l = await client.acquire(scope, { ttl: 60_000 });
    await until(`the follower to see ${scope}'s grant`, () => store.highest(scope).token === l.token);
    return l;
  };
  const a = await grant("a");
  const b = await grant("b");

  // Cut off, the same term: the release is in the leader's ring.
  p.cut();
  await a.release();
  await until("the follower to notice the cut", () => f.lagMs > 0);
  p.uncut();
  await until("a's closing after the follower resumed", () => store.highest("a").token === a.token + 1n);
  assert.equal(f.resyncs, 0, "a cut within a term resumes the watch, no resync");

  // Cut off across a restart: the new term's leader has none of the old
  // one's events. b is released before the follower is back.
  p.cut();
  await fenced.stop();
  await until("a lag while fenced is down", () => f.lagMs >= 200);
  await fenced.restart();
  await client.get("b"); // the client's node is back
  await b.release();
  // Another writer of a, far ahead (above the new term's token floor too).
  const ahead = 1n << 62n;
  await store.fence({ token: { version: 1, scope: "a", value: ahead } }, false, async () => undefined);
  p.uncut();
  // A new term sets a token floor from the wall clock, and b's closing is
  // above it rather than b's token + 1 (docs/design.md, "The token floor").
  const closing = (await client.get("b")).lastToken;
  assert.ok(closing > b.token);
  await until("b's closing, read from the state", () => store.highest("b").token === closing);
  await assert.rejects(store.fence({ token: { version: 1, scope: "b", value: b.token } }, false, async () => undefined), StaleError, "b's late write");
  assert.ok(f.resyncs > 0, "no resync after a restart of fenced");
  assert.equal(store.highest("a").token, ahead, "a's mark after the resync is kept");
  // And it follows the new term's stream.
  await grant("c");
  await until("no lag", () => f.lagMs === 0);
});

/** CountingClient is a Client that counts the gets fenced answered. */
class CountingClient extends Client {
  gets = 0;
  override async get(...args: Parameters<Client["get"]>): ReturnType<Client["get"]> {
    const st = await super.get(...args);
    this.gets++;
    return st;
  }
}

test("a follower over many short-lived scopes forgets each once closed, and its resync reads the leases held, not every scope it saw", async () => {
  const fenced = await startFenced();
  const p = await proxy(Number(new URL(fenced.url).port));
  const client = new Client(fenced.url, { holder: "ts-follow" });
  after(() => client.close());
  const store = new MemoryMarkStore();
  const fc = new CountingClient(p.url, { retryTimeoutMs: 500 });
  const f = follow(fc, markStoreAdvancer(store), "job/");
  await until("the follower to watch", async () => {
    const l = await client.acquire("job/start", { ttl: 60_000 });
    await l.release();
    return store.highest("job/start").token === l.token + 1n;
  });

  // Three leases stay held; 2,000 jobs each take a scope of their own and
  // release it, 16 at a time.
  const held = 3;
  const jobs = 2000;
  const kept: Lease[] = [];
  for (let i = 0; i < held; i++) kept.push(await client.acquire(`job/held-${i}`, { ttl: 60_000 }));
  const tokens: bigint[] = [];
  let next = 0;
  const worker = async () => {
    for (let i = next++; i < jobs; i = next++) {
      const l = await client.acquire(`job/${i}`, { ttl: 60_000 });
      tokens[i] = l.token;
      await l.release();
    }
  };
  await Promise.all(Array.from({ length: 16 }, worker));
  await until("every job's closing recorded", () => tokens.every((t, i) => store.highest(`job/${i}`).token === t + 1n));
  await until("no lag once caught up", () => f.lagMs === 0);

  // Cut off across a restart: the new term's leader has none of the old
  // one's events. A held lease is released meanwhile.
  p.cut();
  await fenced.stop();
  await until("a lag while fenced is down", () => f.lagMs >= 200);
  await fenced.restart();
  await client.get("job/held-0"); // the client's node is back
  await kept[0]!.release();
  const closing = (await client.get("job/held-0")).lastToken;
  fc.gets = 0;
  p.uncut();
  await until("the released lease's closing, read from the state", () => store.highest("job/held-0").token === closing);
  await until("caught up after the resync", () => f.resyncs > 0 && f.lagMs === 0);
  // Each read of the state (a failed one too) reads the leases it knew
  // held, at most: not the 2,000 scopes of the jobs.
  assert.ok(fc.gets <= held * f.resyncs, `${fc.gets} gets in ${f.resyncs} resyncs; want at most ${held} each, the leases known held, not one per scope ever seen`);
});

for (const [name, url, open] of stores) {
  test(`${name}: a lease that ended before the follower started is closed once it starts, the store naming its scopes`, { skip: url === undefined && `the ${name} server is not set` }, async () => {
    const fenced = await startFenced();
    const client = new Client(fenced.url, { holder: "ts-follow" });
    after(() => client.close());
    const g = await open();
    const listing = `ts/follow-late/${run}/${name}/listing/`;
    const hidden = `ts/follow-late/${run}/${name}/hidden/`;
    // Names under the prefix that are no scope (written by another program):
    // the follower leaves them alone rather than failing to read them.
    if (name === "redis") await g.plant(`${listing}x*}y`);
    await g.plant(`${listing}é`);

    const ended: Lease[] = [];
    for (const prefix of [listing, hidden]) {
      for (const end of ["released", "expired"]) {
        const l = await client.acquire(`${prefix}${end}`, { ttl: end === "expired" ? 300 : 30_000 });
        await g.write(l.tokenText, l.scope); // the holder's own write
        if (end === "released") await l.release();
        else l.markLost("the test stops renewing it; fenced expires it");
        ended.push(l);
      }
    }
    await until("the leases' end at fenced", async () => (await Promise.all(ended.map((l) => client.get(l.scope)))).every((st) => st.lease === undefined));
    for (const l of ended) assert.equal(await g.mark(l.scope), l.token, "no follower ran: the mark is the holder's");

    // Both start afterwards; the second's advancer cannot name its scopes.
    const f = follow(client, g.marks, listing);
    const h = follow(client, { advance: (scope, token) => g.marks.advance(scope, token) }, hidden);
    for (const l of ended.slice(0, 2)) {
      await until(`the follower to close ${l.scope}`, async () => (await g.mark(l.scope)) === l.token + 1n);
      // The ended holder's delayed write arrives; nobody else wrote.
      await assert.rejects(g.write(l.tokenText, l.scope), (err: unknown) => {
        assert.ok(err instanceof StaleError, String(err));
        assert.deepEqual([err.presented, err.highest], [l.token, l.token + 1n]);
        return true;
      });
    }
    // A grant after both started, which both record.
    const sentinels = [await client.acquire(`${listing}sentinel`, { ttl: 30_000 }), await client.acquire(`${hidden}sentinel`, { ttl: 30_000 })];
    for (const s of sentinels) await until(`the follower to record ${s.scope}`, async () => (await g.mark(s.scope)) === s.token);
    for (const l of ended.slice(2)) {
      assert.equal(await g.mark(l.scope), l.token, `${l.scope}: a store that names no scope leaves the ended lease open`);
      await g.write(l.tokenText, l.scope); // the window a listing closes
    }
    assert.equal(f.resyncs, 0, "the first listing is no resync");
    assert.equal(h.resyncs, 0);
    await until("no lag once caught up", () => f.lagMs === 0);
    for (const s of sentinels) await s.release();
  });
}

/** planted plants the marks names (under base/) and returns what g's advancer lists under base/ + prefix, without base/, sorted. */
async function planted(g: Guarded, base: string, names: string[]): Promise<(prefix: string) => Promise<string[]>> {
  for (const n of names) await g.plant(n);
  return async (prefix) => (await g.marks.scopes!(`${base}/${prefix}`)).map((s) => s.slice(base.length + 1)).sort();
}

test("redis: the advancer lists the marks under a prefix, its glob characters and non-ASCII ones taken literally", { skip: redisURL === undefined && "FENCE_TEST_REDIS is not set" }, async () => {
  const g = await redis();
  const base = `ts/follow-scan/${run}`;
  const names = ["a1", "ab", "a*x", "a?", "[ab]", "\\b", "é/x", "😀x", "e"].map((n) => `${base}/${n}`);
  const scopes = await planted(g, base, names);
  assert.deepEqual(await scopes("a"), ["a*x", "a1", "a?", "ab"]);
  assert.deepEqual(await scopes("a*"), ["a*x"]);
  assert.deepEqual(await scopes("a?"), ["a?"]);
  assert.deepEqual(await scopes("["), ["[ab]"]);
  assert.deepEqual(await scopes("[ab]"), ["[ab]"]);
  assert.deepEqual(await scopes("\\"), ["\\b"]);
  assert.deepEqual(await scopes("é"), ["é/x"]);
  assert.deepEqual(await scopes("😀"), ["😀x"]);
  assert.deepEqual(await scopes("ü"), []);
  assert.deepEqual(await g.marks.scopes!(`ts/follow-scan/${run}-none/`), []);

  // An ioredis Cluster's SCAN reaches one node: the advancer scans each
  // master (nodes("master")). Two databases of one server stand in for two.
  const [r0, r1] = [0, 1].map(() => new Redis(redisURL!, { lazyConnect: true, maxRetriesPerRequest: 1 })) as [Redis, Redis];
  await Promise.all([r0.connect(), r1.connect()]);
  const db = Number(new URL(redisURL!).pathname.slice(1) || "0");
  await r1.select(db === 1 ? 2 : 1); // a database other than the URL's
  after(async () => {
    await r1.del(markKey(`${base}/other-node`));
    await Promise.all([r0.quit(), r1.quit()]);
  });
  await r1.hset(markKey(`${base}/other-node`), "token", "1", "seq", "0");
  const cluster = { call: r0.call.bind(r0), nodes: (role: string) => (role === "master" ? [r0, r1] : []) };
  assert.deepEqual((await redisMarkAdvancer(cluster).scopes!(`${base}/`)).sort(), [...names, `${base}/other-node`].sort());
});

test("redis: the advancer moves a mark with FCALL fence_advance, never back, and writes no other key", { skip: redisURL === undefined && "FENCE_TEST_REDIS is not set" }, async () => {
  installGuard(redisURL!);
  const r = new Redis(redisURL!, { lazyConnect: true, maxRetriesPerRequest: 1 });
  await r.connect();
  const scope = `ts/follow-advance/${run}`;
  after(async () => {
    await r.del(markKey(scope));
    await r.quit();
  });
  const m = redisMarkAdvancer(r);
  await m.advance(scope, 5n);
  assert.deepEqual(await r.hgetall(markKey(scope)), { token: "5", seq: "0" });
  await assert.rejects(m.advance(scope, 4n), StaleError, "a mark past the token answers STALE, which the Follower counts as done");
  await m.advance(scope, 5n); // at the token already: done, and no error
  await m.advance(scope, 7n);
  assert.deepEqual(await r.hgetall(markKey(scope)), { token: "7", seq: "0" });
  assert.deepEqual(await r.keys(`*{${scope}}*`), [markKey(scope)], "the scope's keys: its mark alone");
});

test("postgres: the advancer lists the marks under a prefix, counting its non-ASCII characters", { skip: pgURL === undefined && "FENCE_TEST_POSTGRES is not set" }, async () => {
  const g = await postgres();
  const base = `ts/follow-list/${run}`;
  const names = ["a1", "ab", "a_b", "a%", "é/x", "😀x", "😀", "e"].map((n) => `${base}/${n}`);
  const scopes = await planted(g, base, names);
  assert.deepEqual(await scopes("a"), ["a%", "a1", "a_b", "ab"]);
  assert.deepEqual(await scopes("a_"), ["a_b"]);
  assert.deepEqual(await scopes("a%"), ["a%"]);
  assert.deepEqual(await scopes("é"), ["é/x"]);
  assert.deepEqual(await scopes("😀"), ["😀", "😀x"]);
  assert.deepEqual(await scopes("😀x"), ["😀x"]);
  assert.deepEqual(await scopes("ü"), []);
  assert.deepEqual(await g.marks.scopes!(`ts/follow-list/${run}-none/`), []);
});
