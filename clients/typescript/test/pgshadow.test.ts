// A function planted to shadow the guard's fence_advance does not answer
// pgFenced and pgAdvance given the guard's schema (issue 32, item 9).
// Another role, with CREATE on a schema earlier in the writer's
// search_path, makes a fence_advance there that accepts every token: an
// unqualified call takes it, the schema-qualified one takes the guard's
// own, which refuses a stale token. The Go test of the guard's side is
// guard/sqlguard's TestInDatabaseSearchPathShadow; Python's is
// test_guards.py's test_a_schema_of_its_own. It needs make services'
// PostgreSQL (FENCE_TEST_POSTGRES); without it the test skips, except
// under CI=true, where it fails.

import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { after, test } from "node:test";

import pg from "pg";

import { Client, pgAdvance, pgFenced, StaleError, type Queryable } from "../src/index.js";
import { installGuard, rpc, serverURL, startFenced } from "./fenced.js";

const pgURL = serverURL("FENCE_TEST_POSTGRES");
const fenced = await startFenced();
const client = new Client(fenced.url, { holder: "ts-shadow" });
after(() => client.close());

test("postgres: a fence_advance planted earlier in the search_path does not answer a schema-qualified call", { skip: pgURL === undefined && "FENCE_TEST_POSTGRES is not set" }, async () => {
  const run = randomUUID().slice(0, 8);
  const guard = `ts_fence_${run}`;
  const evil = `${guard}_evil`;

  const db = new pg.Client({ connectionString: pgURL });
  await db.connect();
  after(async () => {
    await db.query(`DROP SCHEMA IF EXISTS ${evil} CASCADE`);
    await db.query(`DROP SCHEMA IF EXISTS ${guard} CASCADE`);
    await db.end();
  });
  await db.query(`CREATE SCHEMA ${guard}`);
  await db.query(`CREATE SCHEMA ${evil}`);
  // The guard in a schema of its own, as docs/protocol.md installs it:
  // fencectl guard install puts it in the URL's search_path's first.
  installGuard(`${pgURL}${pgURL!.includes("?") ? "&" : "?"}options=${encodeURIComponent(`-csearch_path=${guard}`)}`);
  await db.query(`CREATE TABLE ${guard}.orders (id int PRIMARY KEY, owner text NOT NULL)`);

  // The other role's plants: functions that accept every token and count
  // their calls, of the argument types of this client's call (bigint) and
  // of a call with integer literals.
  await db.query(`CREATE TABLE ${evil}.calls (token bigint NOT NULL)`);
  for (const type of ["bigint", "integer"]) {
    await db.query(
      `CREATE FUNCTION ${evil}.fence_advance(scope text, token ${type}, seq ${type} DEFAULT 0) RETURNS void
       LANGUAGE sql AS 'INSERT INTO ${evil}.calls VALUES (token)'`,
    );
  }
  await db.query(`SET search_path = ${evil}, ${guard}, public`);
  const planted = async () => Number((await db.query(`SELECT count(*) AS n FROM ${evil}.calls`)).rows[0].n);
  const write = (owner: string) => (tx: Queryable) =>
    tx.query(`INSERT INTO ${guard}.orders VALUES (1, $1) ON CONFLICT (id) DO UPDATE SET owner = excluded.owner`, [owner]);
  const schema = { schema: guard };

  const scope = `ts/pg-shadow/${run}`;
  const a = await client.acquire(scope, { ttl: 30_000 });
  await pgFenced(db, a, write("a"), schema);
  // b takes the lease behind a's back, as a paused holder's successor would.
  await rpc(fenced.url, "Release", { scope, leaseId: a.leaseId });
  const b = await client.acquire(scope, { ttl: 30_000 });
  assert.ok(b.token > a.token);
  await pgFenced(db, b, write("b"), schema);
  assert.equal(await planted(), 0, "the qualified calls reached the planted function");

  // The plant works: an unqualified call, through the search_path, takes
  // it, and a's stale token passes.
  await pgFenced(db, { version: 1, scope, value: a.token }, write("a, through the plant"));
  assert.equal(await planted(), 1, "the unqualified call did not reach the planted function");
  await pgFenced(db, b, write("b"), schema);

  // The schema-qualified call does not: the guard's own function refuses a.
  await assert.rejects(pgFenced(db, a, write("a, late"), schema), (err: unknown) => {
    assert.ok(err instanceof StaleError, String(err));
    assert.equal(err.presented, a.token);
    assert.equal(err.highest, b.token);
    return true;
  });
  assert.ok(a.lost.aborted, "a stale answer marks the lease lost");
  await db.query("BEGIN");
  await assert.rejects(pgAdvance(db, { version: 1, scope, value: a.token }, undefined, schema), StaleError);
  await db.query("ROLLBACK");
  assert.equal(await planted(), 1, "a qualified call reached the planted function");
  assert.deepEqual((await db.query(`SELECT owner FROM ${guard}.orders`)).rows, [{ owner: "b" }], "the late write was rolled back");
  const marks = await db.query(`SELECT token FROM ${guard}.fence_tokens WHERE scope = $1`, [scope]);
  assert.deepEqual(marks.rows, [{ token: b.token.toString() }], "the guard's mark");
  await b.release();
});
