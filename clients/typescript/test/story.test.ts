// The story of fence, played from outside Go: a TypeScript holder and a
// psql writer (story-writer.sh: a shell with fencectl, psql and redis-cli,
// no fence library) take turns at one scope, each pausing past its lease,
// and each one's late write is refused inside PostgreSQL (fence_advance,
// SQLSTATE FN409) and Redis (FCALL fence_set, STALE) by the guards that
// `fencectl guard install` put there. The values left are the newer
// holder's.
//
// No clock decides the order. A pause ends only when the newer holder has
// written, and the newer holder is granted the scope only once the paused
// one's lease expired at fenced, so every pause is past the TTL however
// slow the machine. The waits are bounded at a minute or two.
//
// Needs make services' servers (FENCE_TEST_POSTGRES, FENCE_TEST_REDIS):
// without them the test skips, under CI=true it fails.

import assert from "node:assert/strict";
import { spawn, type ChildProcess } from "node:child_process";
import { randomUUID } from "node:crypto";
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, test } from "node:test";

import { Redis } from "ioredis";
import pg from "pg";

import { Client, dataKey, LostError, markKey, pgFenced, redisSet, StaleError, type Queryable } from "../src/index.js";
import { installGuard, PKG, serverURL, startFenced } from "./fenced.js";

const pgURL = serverURL("FENCE_TEST_POSTGRES");
const redisURL = serverURL("FENCE_TEST_REDIS");
const skip = (pgURL === undefined && "FENCE_TEST_POSTGRES is not set") || (redisURL === undefined && "FENCE_TEST_REDIS is not set");

/** Every lease of the story, the TypeScript ones and the psql writer's. */
const TTL_MS = 2_000;

// A minute for anything that waits on fenced or a database; the writer
// process is killed after two.
const WAIT_MS = 60_000;

function within<T>(p: Promise<T>, what: string, ms = WAIT_MS): Promise<T> {
  let timer: NodeJS.Timeout;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: not within ${ms} ms`)), ms);
  });
  return Promise.race([p, late]).finally(() => clearTimeout(timer));
}

/** A run of story-writer.sh, with its output collected. */
interface Writer {
  child: ChildProcess;
  stdout: string;
  stderr: string;
  exited: Promise<number | null>;
}

function writer(env: Record<string, string>, ...args: string[]): Writer {
  const child = spawn("bash", [join(PKG, "test", "story-writer.sh"), ...args], {
    env: { ...process.env, ...env },
    stdio: ["pipe", "pipe", "pipe"],
    timeout: 2 * WAIT_MS,
  });
  const w: Writer = { child, stdout: "", stderr: "", exited: undefined! };
  child.stdout!.setEncoding("utf8").on("data", (s: string) => (w.stdout += s));
  child.stderr!.setEncoding("utf8").on("data", (s: string) => (w.stderr += s));
  w.exited = new Promise((resolve, reject) => {
    child.once("error", reject);
    child.once("close", (code) => resolve(code));
  });
  return w;
}

test("a TypeScript holder and a psql writer, each paused past its lease, are refused at PostgreSQL and Redis", { skip }, async () => {
  installGuard(pgURL!);
  installGuard(redisURL!);
  const fenced = await startFenced();
  const client = new Client(fenced.url, { holder: "ts-holder" });
  const db = new pg.Client({ connectionString: pgURL });
  await db.connect();
  const r = new Redis(redisURL!, { lazyConnect: true, maxRetriesPerRequest: 1 });
  await r.connect();

  // The servers are shared with other runs: the scope, table and key are new.
  const run = randomUUID().slice(0, 8);
  const scope = `ts/story/${run}`;
  const table = `ts_story_${run}`;
  const key = dataKey(scope, "value");
  const dir = mkdtempSync(join(tmpdir(), "fence-story-"));
  await db.query(`CREATE TABLE ${table} (id int PRIMARY KEY, value text NOT NULL)`);
  await db.query(`INSERT INTO ${table} VALUES (1, 'none')`);
  after(async () => {
    await db.query(`DROP TABLE ${table}`);
    await db.query("DELETE FROM fence_tokens WHERE scope = $1", [scope]);
    await db.end();
    await r.del(markKey(scope), key);
    await r.quit();
    await client.close();
    rmSync(dir, { recursive: true, force: true });
  });

  const env = {
    FENCECTL: process.env.FENCECTL_BIN ?? join(PKG, "build", "fencectl"), // installGuard built it if missing
    FENCE_ADDR: fenced.url,
    FENCE_TEST_POSTGRES: pgURL!,
    FENCE_TEST_REDIS: redisURL!,
    STORY_SCOPE: scope,
    STORY_TABLE: table,
    STORY_TTL: `${TTL_MS}ms`,
  };
  const update = (value: string) => (tx: Queryable) => tx.query(`UPDATE ${table} SET value = $1 WHERE id = 1`, [value]);
  const values = async () => [(await db.query(`SELECT value FROM ${table}`)).rows[0]?.value, await r.get(key)];
  const detail = (presented: bigint, highest: bigint) => `scope=${scope} presented_token=${presented} highest_token=${highest} presented_seq=0 highest_seq=0`;

  // Round 1: the TypeScript holder A pauses; the psql writer B takes over.
  const a = await client.acquire(scope, { ttl: TTL_MS });
  await pgFenced(db, a, update("A1"));
  assert.equal(await redisSet(r, a, key, "A1"), "OK");
  assert.deepEqual(await values(), ["A1", "A1"]);

  // B queues behind A (fencectl acquire --wait): fenced grants it once A's
  // lease expires, which it does because A cannot renew. A's pause is a
  // busy loop: no timer of its keep-alive can run until B has written and
  // exited. B writes its exit status to done as it ends.
  const done = join(dir, "b-done");
  const b = writer({ ...env, STORY_DONE: done }, "take", "B1");
  const giveUp = performance.now() + 2 * WAIT_MS;
  while (!existsSync(done) && performance.now() < giveUp) {
    // spin
  }
  assert.ok(existsSync(done), "the psql writer B never ended");
  assert.equal(await within(b.exited, "B's exit"), 0, `B failed:\n${b.stderr}\nfenced:\n${fenced.log()}`);
  assert.equal(readFileSync(done, "utf8").trim(), "0");
  const bToken = BigInt(b.stdout.trim());
  assert.ok(bToken > a.token, `B's token ${bToken} after A's ${a.token}`);

  // A runs again. Its lost signal fired while it was paused: reading it
  // checks the clock.
  assert.equal(a.lost.aborted, true, "A's lost signal fired");
  assert.ok(a.lost.reason instanceof LostError);
  assert.match(a.lost.reason.message, new RegExp(`no renewal confirmed within the TTL of ${TTL_MS}ms`));
  await assert.rejects(pgFenced(db, a, update("A1 late")), (err) => err === a.lost.reason, "the client does not even try");

  // A's late write sent anyway, with its old token, straight at the
  // databases: refused by the guards inside them.
  await db.query("BEGIN");
  await assert.rejects(db.query("SELECT fence_advance($1, $2, 0)", [scope, a.token.toString()]), (err: any) => {
    assert.equal(err.code, "FN409");
    assert.equal(err.message, `stale fencing token for "${scope}": token ${a.token} was superseded by token ${bToken}`);
    assert.equal(err.detail, detail(a.token, bToken));
    return true;
  });
  await db.query("ROLLBACK");
  await assert.rejects(r.call("FCALL", "fence_set", "2", markKey(scope), key, a.token.toString(), "0", "A1 late"), (err: any) => {
    assert.equal(err.message, `STALE ${detail(a.token, bToken)}`);
    return true;
  });
  // The same through this package's guards, given the old token's text.
  const stale = (presented: bigint, highest: bigint) => (err: unknown) => {
    assert.ok(err instanceof StaleError, String(err));
    assert.deepEqual([err.scope, err.presented, err.highest], [scope, presented, highest]);
    return true;
  };
  await assert.rejects(pgFenced(db, a.tokenText, update("A1 late")), stale(a.token, bToken));
  await assert.rejects(redisSet(r, a.tokenText, key, "A1 late"), stale(a.token, bToken));
  assert.deepEqual(await values(), ["B1", "B1"], "the row and the key hold B's value");

  // Round 2: the psql writer P holds the scope and pauses; the TypeScript
  // holder C takes over. P queues behind B's lease, which nothing renews.
  const p = writer(env, "hold", "B2", "B2 late");
  const wrote = await within(
    new Promise<bigint>((resolve, reject) => {
      const check = () => {
        const m = /^wrote (\d+)$/m.exec(p.stdout);
        if (m) resolve(BigInt(m[1]!));
      };
      p.child.stdout!.on("data", check);
      check();
      p.exited.then((code) => reject(new Error(`P exited (${code}) before it wrote:\n${p.stderr}`)), reject);
    }),
    "P's first write",
  );
  assert.ok(wrote > bToken);
  assert.deepEqual(await values(), ["B2", "B2"]);

  // P is paused (its shell waits on stdin): C is granted the scope once P's
  // lease expired, and writes.
  const c = await client.acquire(scope, { ttl: 30_000, wait: true, signal: AbortSignal.timeout(WAIT_MS) });
  assert.ok(c.token > wrote, `C's token ${c.token} after P's ${wrote}`);
  await pgFenced(db, c, update("C2"));
  assert.equal(await redisSet(r, c, key, "C2"), "OK");

  // P wakes and writes with its old token: psql fails with FN409, redis-cli
  // gets STALE, and the writer's exit status says both (1 | 2).
  p.child.stdin!.end("go on\n");
  assert.equal(await within(p.exited, "P's late write"), 3, `P's late write:\n${p.stderr}`);
  const lines = p.stderr.trimEnd().split("\n");
  assert.equal(lines[0], `ERROR:  FN409: stale fencing token for "${scope}": token ${wrote} was superseded by token ${c.token}`);
  assert.equal(lines[1], `DETAIL:  ${detail(wrote, c.token)}`);
  assert.equal(lines.at(-1), `redis-cli: STALE ${detail(wrote, c.token)}`);
  assert.deepEqual(await values(), ["C2", "C2"], "the row and the key hold C's value");

  assert.equal(c.lost.aborted, false);
  await c.release();
});
