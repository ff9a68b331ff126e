// Reporting stale rejections to a real fenced (ReportRejections), as Go's
// guardreport and Python's Reporter do: the Reporter's batches, its bounded
// buffer and dropped count, its timer and its failures; and the guards'
// reporter option: a stale write refused by the PostgreSQL guard, the Redis
// guard and the HTTP middleware shows up on fenced's status page, in its
// metrics and to its watchers, naming the guard.

import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { createServer, type Server } from "node:http";
import { after, test } from "node:test";

import { Redis } from "ioredis";
import pg from "pg";

import {
  Client,
  dataKey,
  fencedFetch,
  fencingMiddleware,
  MemoryMarkStore,
  pgFenced,
  redisSet,
  Reporter,
  StaleError,
  UnavailableError,
  type Lease,
  type WatchEvent,
} from "../src/index.js";
import { installGuard, metric, reportedOnStatusPage, rpc, serverURL, startFenced, until } from "./fenced.js";

const pgURL = serverURL("FENCE_TEST_POSTGRES");
const redisURL = serverURL("FENCE_TEST_REDIS");
const fenced = await startFenced();
const client = new Client(fenced.url, { holder: "ts-report" });
after(() => client.close());
const run = randomUUID().slice(0, 8);

const REPORTED = "fence_stale_rejections_reported_total";
const DROPPED = "fence_stale_rejections_dropped_total";


/** takeOver releases first at fenced behind its back and grants the scope to a second holder. */
async function takeOver(first: Lease): Promise<Lease> {
  await rpc(fenced.url, "Release", { scope: first.scope, leaseId: first.leaseId });
  return client.acquire(first.scope, { ttl: 30_000 });
}

/** rejectedEvents collects the "rejected" events fenced streams for prefix until the returned stop is called. */
function rejectedEvents(prefix: string): { events: WatchEvent[]; ready: Promise<void>; stop(): void } {
  const ac = new AbortController();
  const events: WatchEvent[] = [];
  let started!: () => void;
  const ready = new Promise<void>((r) => (started = r));
  void (async () => {
    try {
      for await (const resp of client.watch(prefix, { signal: ac.signal })) {
        started();
        events.push(...resp.events.filter((e) => e.kind === "rejected"));
      }
    } catch {
      // stopped
    }
  })();
  return { events, ready, stop: () => ac.abort() };
}

test("client.reportRejections, and a Reporter's batch, bounded buffer and dropped count", async () => {
  const scope = `ts/report/${run}`;
  const before = await metric(fenced.url, REPORTED);
  await client.reportRejections("ts-direct", [{ scope, presented: 41n, highest: 42n }]);
  assert.equal(await metric(fenced.url, REPORTED), before + 1);

  const r = new Reporter(client, "ts-reporter", { intervalMs: 3_600_000, buffer: 2 });
  for (let i = 0n; i < 3n; i++) r.rejected(new StaleError({ scope, presented: 40n + i, highest: 50n }));
  assert.equal(r.pending, 2, "the buffer holds 2");
  assert.equal(r.dropped, 1n, "the third is dropped and counted");
  const dropped = await metric(fenced.url, DROPPED);
  await r.flush();
  assert.equal(r.pending, 0);
  assert.equal(r.dropped, 0n);
  assert.equal(await metric(fenced.url, REPORTED), before + 3);
  assert.equal(await metric(fenced.url, DROPPED), dropped + 1, "the dropped count reaches fenced");
  await r.close();

  // The timer sends without being asked.
  const quick = new Reporter(client, "ts-quick", { intervalMs: 50 });
  quick.rejected(new StaleError({ scope, presented: 1n, highest: 2n }));
  await until("the timer sent it", async () => (await metric(fenced.url, REPORTED)) === before + 4);
  await quick.close();
});

test("a Reporter never blocks or fails the write: while fenced is unreachable it keeps what fits", async () => {
  const down = new Client("http://127.0.0.1:9", { retryTimeoutMs: 0 });
  const errors: unknown[] = [];
  const r = new Reporter(down, "ts-down", { intervalMs: 20, buffer: 2, onError: (err) => errors.push(err) });
  for (let i = 0n; i < 3n; i++) r.rejected(new StaleError({ scope: "ts/down", presented: i + 1n, highest: 9n }));
  assert.deepEqual([r.pending, r.dropped, errors.length], [2, 1n, 0], "rejected returned at once: buffered, before any send");
  await until("the timer's failed send, told once", () => errors.length === 1);
  await new Promise((res) => setTimeout(res, 100));
  assert.equal(errors.length, 1, "a run of failures is told once");
  assert.ok(errors[0] instanceof UnavailableError, String(errors[0]));
  assert.equal(r.pending, 2, "the batch was kept");
  assert.equal(r.dropped, 1n);
  await assert.rejects(r.close(), UnavailableError);
  assert.equal(r.pending, 2, "close's last flush kept it too");
});

test("postgres guard: a stale write it refuses reaches fenced's status page, metrics and watchers", { skip: pgURL === undefined && "FENCE_TEST_POSTGRES is not set" }, async () => {
  installGuard(pgURL!);
  const db = new pg.Client({ connectionString: pgURL });
  await db.connect();
  const table = `ts_report_${run}`;
  await db.query(`CREATE TABLE ${table} (id int PRIMARY KEY, owner text NOT NULL)`);
  after(async () => {
    await db.query(`DROP TABLE ${table}`);
    await db.end();
  });
  const write = (owner: string) => (tx: pg.Client | any) =>
    tx.query(`INSERT INTO ${table} VALUES (1, $1) ON CONFLICT (id) DO UPDATE SET owner = excluded.owner`, [owner]);
  const scope = `ts/report-pg/${run}`;
  const watch = rejectedEvents(scope);
  after(watch.stop);
  await watch.ready;
  const reporter = client.reporter("ts-orders-db");

  const a = await client.acquire(scope, { ttl: 30_000 });
  await pgFenced(db, a, write("a"), { reporter });
  const b = await takeOver(a);
  await pgFenced(db, b, write("b"), { reporter });
  const before = await metric(fenced.url, REPORTED);
  await assert.rejects(pgFenced(db, a, write("a, late"), { reporter }), StaleError);
  assert.equal(reporter.pending, 1, "reported once, though it passed pgAdvance and pgFenced");
  await reporter.flush();

  assert.equal(await metric(fenced.url, REPORTED), before + 1);
  const rows = await reportedOnStatusPage(fenced.url, scope);
  assert.deepEqual(
    rows.map((r) => [r[1], r[2], r[4], r[5]]),
    [["1", a.token.toString(), b.token.toString(), "ts-orders-db"]],
    "the status page's row: 1 rejected, the stale token, the highest, the guard",
  );
  await until("the watchers' rejected event", () => watch.events.length === 1);
  const e = watch.events[0]!;
  assert.deepEqual([e.scope, e.token, e.currentToken, e.guard, e.holder], [scope, a.token, b.token, "ts-orders-db", "ts-report"]);
  await b.release();
});

test("redis guard: a stale write it refuses reaches fenced's status page", { skip: redisURL === undefined && "FENCE_TEST_REDIS is not set" }, async () => {
  installGuard(redisURL!);
  const r = new Redis(redisURL!, { lazyConnect: true, maxRetriesPerRequest: 1 });
  await r.connect();
  const scope = `ts/report-redis/${run}`;
  const key = dataKey(scope, "owner");
  // One hook, as hooks run in the order they were added.
  after(async () => {
    await r.del(`fence:{${scope}}`, key);
    await r.quit();
  });
  const reporter = client.reporter("ts-orders-cache");

  const a = await client.acquire(scope, { ttl: 30_000 });
  await redisSet(r, a, key, "a", [], { reporter });
  const b = await takeOver(a);
  await redisSet(r, b, key, "b", [], { reporter });
  await assert.rejects(redisSet(r, a, key, "a, late", [], { reporter }), StaleError);
  // A token without a lease reports too.
  await assert.rejects(redisSet(r, `fence:v1:${scope}:${a.token}`, key, "again", [], { reporter }), StaleError);
  await reporter.flush();
  const rows = await reportedOnStatusPage(fenced.url, scope);
  assert.deepEqual(rows.map((row) => [row[1], row[2], row[4], row[5]]), [["2", a.token.toString(), b.token.toString(), "ts-orders-cache"]]);
  assert.equal(await r.get(key), "b");
  await b.release();
});

test("HTTP middleware and MemoryMarkStore: a stale request is reported once, by either", async () => {
  const scope = `ts/report-http/${run}`;
  const reporter = client.reporter("ts-orders-api", { intervalMs: 3_600_000 });
  const store = new MemoryMarkStore({ reporter });
  const mw = fencingMiddleware({ scope, store, reporter });
  const server: Server = createServer((req, res) => mw(req, res, () => res.writeHead(204).end()));
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  after(() => server.close());
  const { port } = server.address() as { port: number };

  const a = await client.acquire(scope, { ttl: 30_000 });
  assert.equal((await fencedFetch(a, `http://127.0.0.1:${port}/`, { method: "POST" })).status, 204);
  const b = await takeOver(a);
  assert.equal((await fencedFetch(b, `http://127.0.0.1:${port}/`, { method: "POST" })).status, 204);
  await assert.rejects(fencedFetch(a, `http://127.0.0.1:${port}/`, { method: "POST" }), StaleError);
  assert.equal(reporter.pending, 1, "the store and the middleware both saw it: reported once");
  await reporter.flush();
  const rows = await reportedOnStatusPage(fenced.url, scope);
  assert.deepEqual(rows.map((row) => [row[1], row[2], row[4], row[5]]), [["1", a.token.toString(), b.token.toString(), "ts-orders-api"]]);
  await b.release();
});

test("a Lease's client reports its guards' stale rejections without a reporter option, as Python's does; not with reportRejections false", { skip: (pgURL === undefined || redisURL === undefined) && "FENCE_TEST_POSTGRES or FENCE_TEST_REDIS is not set" }, async () => {
  installGuard(pgURL!);
  installGuard(redisURL!);
  const db = new pg.Client({ connectionString: pgURL });
  await db.connect();
  const r = new Redis(redisURL!, { lazyConnect: true, maxRetriesPerRequest: 1 });
  await r.connect();
  const table = `ts_report_default_${run}`;
  await db.query(`CREATE TABLE ${table} (id int PRIMARY KEY, owner text NOT NULL)`);
  const scopes = ["pg", "redis", "pg-quiet", "redis-quiet"].map((s) => `ts/report-default-${s}/${run}`);
  const quiet = new Client(fenced.url, { holder: "ts-report-quiet", reportRejections: false });
  after(async () => {
    await quiet.close();
    await db.query(`DROP TABLE ${table}`);
    await db.end();
    await r.del(...scopes.flatMap((s) => [`fence:{${s}}`, dataKey(s, "owner")]));
    await r.quit();
  });
  const write = (owner: string) => (tx: pg.Client | any) =>
    tx.query(`INSERT INTO ${table} VALUES (1, $1) ON CONFLICT (id) DO UPDATE SET owner = excluded.owner`, [owner]);

  /** stale takes the scope from a lease of c and has that lease's write refused by both guards' kind. */
  const stale = async (c: Client, scope: string, guard: "pg" | "redis") => {
    const a = await c.acquire(scope, { ttl: 30_000 });
    const put = (l: Lease, v: string) => (guard === "pg" ? pgFenced(db, l, write(v)) : redisSet(r, l, dataKey(scope, "owner"), v, [], { guard: "ts-cache" }));
    await put(a, "a");
    const b = await takeOver(a);
    await put(b, "b");
    await assert.rejects(put(a, "a, late"), StaleError);
    await b.release();
    return { a, b };
  };

  const pgRun = await stale(client, scopes[0]!, "pg");
  const redisRun = await stale(client, scopes[1]!, "redis");
  await stale(quiet, scopes[2]!, "pg");
  await stale(quiet, scopes[3]!, "redis");
  await client.reporter("postgresql").flush();
  await client.reporter("ts-cache").flush();
  await quiet.close(); // sends whatever its reporters hold: there must be none

  const row = async (scope: string) => (await reportedOnStatusPage(fenced.url, scope)).map((x) => [x[1], x[2], x[4], x[5]]);
  assert.deepEqual(await row(scopes[0]!), [["1", pgRun.a.token.toString(), pgRun.b.token.toString(), "postgresql"]], "named after the guard by default");
  assert.deepEqual(await row(scopes[1]!), [["1", redisRun.a.token.toString(), redisRun.b.token.toString(), "ts-cache"]], "named by the guard option");
  assert.deepEqual(await row(scopes[2]!), [], "reportRejections: false reports nothing");
  assert.deepEqual(await row(scopes[3]!), [], "reportRejections: false reports nothing");
});
