// The client against a real fenced.

import assert from "node:assert/strict";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { test } from "node:test";

import { Client, HeldError, InvalidError, LostError, parseToken, RemoteKeySet, UnavailableError, type Lease } from "../src/index.js";
import { rpc, startFenced } from "./fenced.js";

const fenced = await startFenced();
const client = new Client(fenced.url, { holder: "ts-test" });

/** until waits for cond, checking every 20ms, at most 1,000 times. */
async function until(what: string, cond: () => boolean | Promise<boolean>): Promise<void> {
  for (let i = 0; i < 1000; i++) {
    if (await cond()) return;
    await new Promise((r) => setTimeout(r, 20));
  }
  throw new Error(`never came true: ${what}`);
}

function lostEvent(l: Lease): Promise<unknown> {
  return new Promise((resolve) => {
    if (l.lost.aborted) return resolve(l.lost.reason);
    l.lost.addEventListener("abort", () => resolve(l.lost.reason), { once: true });
  });
}

test("acquire: a signed token that verifies, as bigint; release frees the scope", async () => {
  const lease = await client.acquire("ts/acquire", { ttl: 5000 });
  assert.equal(typeof lease.token, "bigint");
  assert.ok(lease.token >= 1n);
  assert.equal(lease.holder, "ts-test");
  assert.equal(lease.ttlMs, 5000);
  assert.equal(lease.lost.aborted, false);
  const tok = parseToken(lease.tokenText);
  assert.equal(tok.scope, "ts/acquire");
  assert.equal(tok.value, lease.token);
  await new RemoteKeySet(fenced.url).verify(tok);

  await lease.release();
  assert.ok(lease.lost.aborted);
  assert.ok(lease.lost.reason instanceof LostError);
  assert.match(lease.lost.reason.message, /released by its holder/);
  const again = await client.acquire("ts/acquire", { ttl: 5000 });
  assert.ok(again.token > lease.token, "a new grant has a greater token");
  await again.release();
});

test("errors map to classes with the server's message", async () => {
  const a = await client.acquire("ts/held", { ttl: 5000, holder: "first" });
  await assert.rejects(client.acquire("ts/held", { ttl: 5000 }), (err: unknown) => {
    assert.ok(err instanceof HeldError, String(err));
    assert.equal(err.holder, "first");
    assert.equal(err.token, a.token);
    assert.equal(err.scope, "ts/held");
    assert.ok(err.expiresInMs > 0);
    assert.match(err.message, /^acquire "ts\/held": scope "ts\/held" is held by "first" with token \d+/);
    return true;
  });
  await a.release();

  await assert.rejects(client.acquire("ts/bad scope"), (err: unknown) => {
    assert.ok(err instanceof InvalidError, String(err));
    assert.equal(err.field, "scope");
    assert.match(err.message, /has ' ' at byte/);
    return true;
  });
  await assert.rejects(client.acquire("ts/ttl", { ttl: 50 }), (err: unknown) => {
    assert.ok(err instanceof InvalidError, String(err));
    assert.equal(err.field, "ttl");
    return true;
  });
  const down = new Client("http://127.0.0.1:9", { retryTimeoutMs: 0 });
  await assert.rejects(down.acquire("ts/down"), UnavailableError);
});

test("wait: queues behind the holder and is granted on release", async () => {
  const a = await client.acquire("ts/wait", { ttl: 5000 });
  const waiting = client.acquire("ts/wait", { ttl: 5000, wait: true, signal: AbortSignal.timeout(30_000) });
  // The waiter is in line once fenced counts it.
  await until("the acquire waits in line", async () => (await rpc(fenced.url, "Get", { scope: "ts/wait" })).body.waiters === 1);
  await a.release();
  const b = await waiting;
  assert.ok(b.token > a.token);
  await b.release();
});

test("keep-alive: the lease outlives several TTLs while renewals are confirmed", async () => {
  const ttl = 600;
  const lease = await client.acquire("ts/renew", { ttl });
  const first = lease.validUntil;
  // Three renewals' worth: the validity moves past where the acquire left it
  // by more than a TTL, which only confirmed renewals can do.
  await until("renewals extend the validity", () => lease.validUntil > first + ttl);
  assert.equal(lease.lost.aborted, false);
  const got = await rpc(fenced.url, "Get", { scope: "ts/renew" });
  assert.equal(BigInt(got.body.lease.token), lease.token, "the same grant is still current at fenced");
  await lease.release();
});

test("lost: a renewal refused by fenced aborts the signal with a LostError", async () => {
  const lease = await client.acquire("ts/refused", { ttl: 600 });
  const lost = lostEvent(lease);
  // Someone with the lease ID releases it behind the holder's back: the
  // next renewal is answered "not the current lease".
  const r = await rpc(fenced.url, "Release", { scope: "ts/refused", leaseId: lease.leaseId });
  assert.equal(r.status, 200);
  const reason = await lost;
  assert.ok(reason instanceof LostError, String(reason));
  assert.equal(reason.scope, "ts/refused");
  assert.equal(reason.token, lease.token);
  assert.match(reason.message, /is lost/);
  assert.equal(reason.code, "failed_precondition");
  // Releasing a lost lease only stops it, and says why it was lost.
  await assert.rejects(lease.release(), (err: unknown) => err === reason);
});

test("markLost ends the lease locally without releasing it", async () => {
  const lease = await client.acquire("ts/marked", { ttl: 5000 });
  lease.markLost(new Error("a guard said stale"));
  assert.ok(lease.lost.aborted);
  assert.throws(() => lease.throwIfLost(), LostError);
  const got = await rpc(fenced.url, "Get", { scope: "ts/marked" });
  assert.equal(BigInt(got.body.lease.token), lease.token, "still held at fenced until its TTL runs out");
  await rpc(fenced.url, "Release", { scope: "ts/marked", leaseId: lease.leaseId });
});

test("close releases every lease it keeps alive", async () => {
  const c = new Client(fenced.url);
  const a = await c.acquire("ts/close-a", { ttl: 5000 });
  const b = await c.acquire("ts/close-b", { ttl: 5000 });
  await c.close();
  assert.ok(a.lost.aborted && b.lost.aborted);
  for (const s of ["ts/close-a", "ts/close-b"]) {
    assert.equal((await rpc(fenced.url, "Get", { scope: s })).body.lease, undefined, `${s} released`);
  }
  await assert.rejects(c.acquire("ts/close-c"), /closed/);
});

test("an acquire whose answer is cut off is retried with its request ID: one grant, one token", async () => {
  // A proxy that forwards every call to fenced but cuts off the answer of
  // the first Acquire, after fenced has granted it.
  let cut = false;
  const proxy = createServer(async (req, res) => {
    const chunks: Buffer[] = [];
    for await (const c of req) chunks.push(c as Buffer);
    const answer = await fetch(fenced.url + req.url, { method: "POST", headers: { "content-type": "application/json" }, body: Buffer.concat(chunks) });
    const body = await answer.text();
    if (req.url!.endsWith("/Acquire") && !cut) {
      cut = true;
      res.socket?.destroy();
      return;
    }
    res.writeHead(answer.status, { "content-type": "application/json" }).end(body);
  });
  await new Promise<void>((resolve) => proxy.listen(0, "127.0.0.1", resolve));
  try {
    const c = new Client(`http://127.0.0.1:${(proxy.address() as AddressInfo).port}`);
    const before = BigInt((await rpc(fenced.url, "Get", { scope: "ts/retry" })).body.lastToken ?? "0");
    const lease = await c.acquire("ts/retry", { ttl: 5000 });
    assert.ok(cut, "the first answer was cut off");
    assert.equal(lease.token, before + 1n, "the retry got the first attempt's grant");
    const got = await rpc(fenced.url, "Get", { scope: "ts/retry" });
    assert.equal(BigInt(got.body.lastToken), lease.token, "no second token was issued");
    assert.equal(lease.lost.aborted, false);
    await c.close();
  } finally {
    proxy.close();
  }
});

test("several addresses: a call that finds a node down moves to the next, and stays there", async () => {
  // Port 9 (discard) refuses connections on loopback.
  const c = new Client(["http://127.0.0.1:9", fenced.url]);
  const lease = await c.acquire("ts/failover", { ttl: 600 });
  const first = lease.validUntil;
  await until("renewals reach the live node", () => lease.validUntil > first + 600);
  assert.equal(lease.lost.aborted, false);
  await c.close();
  assert.equal((await rpc(fenced.url, "Get", { scope: "ts/failover" })).body.lease, undefined, "released");
});

test("tokenText is signed again at each renewal: after a key rotation it carries the new key, as Go's and Python's do", async () => {
  const f = await startFenced("--key-publish-delay", "0");
  const c = new Client(f.url, { holder: "ts-rotate" });
  try {
    const lease = await c.acquire("ts/rotate", { ttl: 600 });
    const before = parseToken(lease.tokenText);
    const res = await fetch(`${f.url}/fence.v1.ClusterService/RotateSigningKey`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: "{}",
    });
    assert.equal(res.status, 200, await res.clone().text());
    const { keyId } = (await res.json()) as { keyId: string };
    assert.notEqual(keyId, before.keyId);
    await until("a renewal signed with the new key", () => parseToken(lease.tokenText).keyId === keyId);
    const after = parseToken(lease.tokenText);
    assert.deepEqual([after.scope, after.value], [before.scope, before.value], "the same token, signed again");
    assert.equal(lease.lost.aborted, false);
  } finally {
    await c.close();
  }
});

test("a lease whose local validity ran out is released, so fenced need not hold its scope for the rest of its TTL, as Go's and Python's are", async () => {
  // A drift margin of all but 100 ms of a minute: the lease gives up its
  // authority long before its first renewal, while fenced holds it for a minute.
  const c = new Client(fenced.url, { holder: "ts-ran-out" });
  try {
    const lease = await c.acquire("ts/ran-out", { ttl: 60_000, driftMarginMs: 59_900 });
    await until("the lease lost when its validity ran out", () => lease.lost.aborted);
    assert.match(lease.error!.message, /local validity ran out/);
    await until("fenced's scope released", async () => (await rpc(fenced.url, "Get", { scope: "ts/ran-out" })).body.lease === undefined);
  } finally {
    await c.close();
  }
});
