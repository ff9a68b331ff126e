// The HTTP middleware and fencedFetch, with tokens from a real fenced.

import assert from "node:assert/strict";
import { createServer, request, type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { after, test } from "node:test";

import { Client, fencedFetch, fencingMiddleware, MemoryMarkStore, RemoteKeySet, StaleError, type Middleware } from "../src/index.js";
import { rpc, startFenced } from "./fenced.js";

const fenced = await startFenced();
const client = new Client(fenced.url, { holder: "ts-http" });

/** serve runs handler behind mw on a loopback port until the file's tests end. */
async function serve(mw: Middleware, handler: (req: IncomingMessage, res: ServerResponse) => void): Promise<string> {
  const srv = createServer((req, res) => mw(req, res, () => handler(req, res)));
  await new Promise<void>((resolve) => srv.listen(0, "127.0.0.1", resolve));
  after(() => new Promise<void>((resolve) => srv.close(() => resolve())));
  return `http://127.0.0.1:${(srv.address() as AddressInfo).port}`;
}

const store = new MemoryMarkStore();
const writes: string[] = [];
const url = await serve(fencingMiddleware({ scope: "ts/http", store, verifier: new RemoteKeySet(fenced.url) }), (req, res) => {
  if (req.url === "/fail") {
    res.writeHead(500).end("failed");
    return;
  }
  writes.push(`${req.method} ${String(req.headers["fencing-token"]).split(":")[3]}`);
  res.writeHead(200, { "content-type": "text/plain" }).end("ok");
});

/**
 * post sends a request with exactly the given header lines, repeated ones
 * included (fetch would join them into one).
 */
function post(headers: Record<string, string | string[]>, path = "/"): Promise<{ status: number; type: string | undefined; body: string }> {
  return new Promise((resolve, reject) => {
    const req = request(url + path, { method: "POST", headers }, (res) => {
      let body = "";
      res.setEncoding("utf8");
      res.on("data", (c: string) => (body += c));
      res.on("end", () => resolve({ status: res.statusCode ?? 0, type: res.headers["content-type"], body }));
    });
    req.on("error", reject);
    req.end();
  });
}

test("a stale token gets 409 with the problem body of docs/protocol.md", async () => {
  const a = await client.acquire("ts/http", { ttl: 5000 });
  assert.equal((await fencedFetch(a, url, { method: "POST" })).status, 200);
  await a.release();
  const b = await client.acquire("ts/http", { ttl: 5000 });
  assert.equal((await fencedFetch(b, url, { method: "POST" })).status, 200);

  const late = await post({ "Fencing-Token": a.tokenText });
  assert.equal(late.status, 409, late.body);
  assert.equal(late.type, "application/problem+json");
  assert.equal(
    late.body,
    `{"type":"https://fence.dev/problems/stale-token","title":"Stale fencing token","status":409,` +
      `"detail":"stale fencing token for \\"ts/http\\": token ${a.token} was superseded by token ${b.token}",` +
      `"scope":"ts/http","presented_token":${a.token},"highest_token":${b.token}}\n`,
  );
  assert.deepEqual(writes.slice(-2), [`POST ${a.token}`, `POST ${b.token}`], "the stale write never reached the handler");
  assert.equal(store.highest("ts/http").token, b.token);
  await b.release();
});

test("fencedFetch: a 409 marks the lease lost and throws StaleError; a lost lease sends nothing", async () => {
  // a does not know yet that it lost: its lease is released behind its back
  // and the scope granted to b, while a's next renewal is seconds away.
  const a = await client.acquire("ts/http", { ttl: 30_000 });
  await rpc(fenced.url, "Release", { scope: "ts/http", leaseId: a.leaseId });
  const b = await client.acquire("ts/http", { ttl: 30_000 });
  assert.equal((await fencedFetch(b, url, { method: "POST" })).status, 200);
  assert.equal(a.lost.aborted, false);

  await assert.rejects(fencedFetch(a, url, { method: "POST" }), (err: unknown) => {
    assert.ok(err instanceof StaleError, String(err));
    assert.equal(err.presented, a.token);
    assert.equal(err.highest, b.token);
    return true;
  });
  assert.ok(a.lost.aborted, "a stale answer marks the lease lost");
  const before = writes.length;
  await assert.rejects(fencedFetch(a, url, { method: "POST" }), /marked lost by its holder: stale fencing token/);
  assert.equal(writes.length, before, "a lost lease sends nothing");
  await b.release();
});

test("fencedFetch: a passed-on stale problem of another scope or token leaves the lease alone", async () => {
  // The server answers, whatever it is sent, the problem in the request's
  // X-Problem header, as a handler passing on another service's answer would.
  const relay = await serve(
    (_req, _res, next) => next(),
    (req, res) => {
      res.writeHead(409, { "content-type": "application/problem+json" }).end(String(req.headers["x-problem"]));
    },
  );
  const problem = (fields: string) =>
    `{"type":"https://fence.dev/problems/stale-token","title":"Stale fencing token","status":409,"detail":"stale"${fields}}`;
  const cases: [string, (token: bigint) => string, boolean][] = [
    ["another scope", (t) => problem(`,"scope":"billing","presented_token":${t},"highest_token":${t + 1n}`), false],
    ["another token of the scope", (t) => problem(`,"scope":"ts/relay","presented_token":${t - 1n},"highest_token":${t}`), false],
    ["its own token", (t) => problem(`,"scope":"ts/relay","presented_token":${t},"highest_token":${t + 1n}`), true],
    ["neither scope nor token", (t) => problem(`,"highest_token":${t + 1n}`), true],
  ];
  for (const [what, body, lost] of cases) {
    const l = await client.acquire("ts/relay", { ttl: 30_000 });
    const sent = body(l.token);
    if (lost) {
      await assert.rejects(fencedFetch(l, relay, { method: "POST", headers: { "x-problem": sent } }), StaleError, what);
      assert.ok(l.lost.aborted, `${what}: the lease is lost`);
    } else {
      const res = await fencedFetch(l, relay, { method: "POST", headers: { "x-problem": sent } });
      assert.equal(res.status, 409, what);
      assert.equal(await res.text(), sent, `${what}: the problem is passed on as it came`);
      assert.equal(l.lost.aborted, false, `${what}: the lease ended on another lease's rejection`);
    }
    // A lease lost only locally keeps its scope at the service: free it.
    await l.release().catch(() => {});
    await rpc(fenced.url, "Release", { scope: "ts/relay", leaseId: l.leaseId });
  }
});

test("missing, repeated, malformed, foreign, forged and unsigned tokens get 400", async () => {
  const a = await client.acquire("ts/http", { ttl: 5000 });
  const other = await client.acquire("ts/other", { ttl: 5000 });
  const f = a.tokenText.split(":");
  const forged = [...f.slice(0, 3), String(BigInt(f[3]!) + 1000n), ...f.slice(4)].join(":");
  const cases: [string, Record<string, string | string[]>, RegExp][] = [
    ["missing", {}, /missing Fencing-Token header/],
    ["repeated", { "Fencing-Token": [a.tokenText, a.tokenText] }, /2 Fencing-Token headers: want exactly one/],
    ["malformed", { "Fencing-Token": "fence:v1:ts/http:042" }, /Fencing-Token header: value/],
    ["foreign scope", { "Fencing-Token": other.tokenText }, /token is for another scope/],
    ["forged value", { "Fencing-Token": forged }, /bad token signature/],
    ["unsigned", { "Fencing-Token": `fence:v1:ts/http:${a.token}` }, /unsigned token/],
    ["bad sequence", { "Fencing-Token": a.tokenText, "Fencing-Sequence": "0" }, /Fencing-Sequence header "0"/],
  ];
  const before = writes.length;
  for (const [what, headers, detail] of cases) {
    const r = await post(headers);
    assert.equal(r.status, 400, what);
    assert.equal(r.type, "application/problem+json", what);
    const p = JSON.parse(r.body);
    assert.equal(p.type, "about:blank", what);
    assert.equal(p.title, "Bad fencing token", what);
    assert.equal(p.status, 400, what);
    assert.equal(p.scope, "ts/http", what);
    assert.match(p.detail, detail, what);
  }
  assert.equal(writes.length, before, "no refused request reached the handler");
  await a.release();
  await other.release();
});

test("sequences order the writes of one token; a failed write still advances the token", async () => {
  const a = await client.acquire("ts/http", { ttl: 5000 });
  assert.equal((await fencedFetch(a, url, { method: "POST", seq: 5n })).status, 200);
  assert.equal((await fencedFetch(a, url, { method: "POST", seq: 5n })).status, 200, "equal sequence: accepted unless strict");
  const lower = await post({ "Fencing-Token": a.tokenText, "Fencing-Sequence": "4" });
  assert.equal(lower.status, 409);
  assert.match(lower.body, new RegExp(`"detail":"stale write to \\\\"ts/http\\\\": token ${a.token} sequence 4 is not after sequence 5"`));
  await a.release();

  const b = await client.acquire("ts/http", { ttl: 5000 });
  const failed = await post({ "Fencing-Token": b.tokenText, "Fencing-Sequence": "9" }, "/fail");
  assert.equal(failed.status, 500, "the handler's own answer");
  assert.deepEqual(store.highest("ts/http"), { token: b.token, seq: 0n }, "the token is recorded, its sequence is not");
  await assert.rejects(fencedFetch(a, url, { method: "POST" }), /released by its holder/);
  const late = await post({ "Fencing-Token": a.tokenText });
  assert.equal(late.status, 409, late.body);
  await b.release();
});

test("writes of one scope run one at a time, inside the mark store's section", async () => {
  const slowStore = new MemoryMarkStore();
  let inside = 0;
  let most = 0;
  const slow = await serve(fencingMiddleware({ scope: "ts/http-serial", store: slowStore }), (_req, res) => {
    inside++;
    most = Math.max(most, inside);
    setImmediate(() => {
      inside--;
      res.end("ok");
    });
  });
  const headers = { "Fencing-Token": "fence:v1:ts/http-serial:7" };
  const answers = await Promise.all(Array.from({ length: 8 }, () => fetch(slow, { method: "POST", headers })));
  assert.deepEqual(
    answers.map((r) => r.status),
    Array(8).fill(200),
  );
  assert.equal(most, 1);
});

test("staleFromProblem keeps tokens beyond 2^53 exact", async () => {
  const { staleFromProblem } = await import("../src/index.js");
  const s = staleFromProblem(
    `{"type":"https://fence.dev/problems/stale-token","title":"Stale fencing token","status":409,"detail":"x","scope":"s","presented_token":9007199254740992,"highest_token":9007199254740993}`,
  );
  assert.ok(s instanceof StaleError);
  assert.equal(s.presented, 9007199254740992n);
  assert.equal(s.highest, 9007199254740993n);
});
