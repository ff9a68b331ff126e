// A paused holder: its event loop blocked past its TTL. fenced expires its
// lease and grants the scope to a second holder, which writes; when the
// first runs again its lost signal has fired, and its late write is refused
// by the guard.

import assert from "node:assert/strict";
import { test } from "node:test";
import { Worker } from "node:worker_threads";

import { Client, fencedFetch, LostError } from "../src/index.js";
import { startFenced } from "./fenced.js";

const fenced = await startFenced();

test("a holder blocked past its TTL finds its lease lost, and its late write is refused", async () => {
  const scope = "ts/paused";
  const done = new Int32Array(new SharedArrayBuffer(4));
  const worker = new Worker(new URL("./paused-worker.js", import.meta.url), { workerData: { fencedUrl: fenced.url, scope, done } });
  const inbox: any[] = [];
  const waiters: ((m: any) => void)[] = [];
  worker.on("message", (m) => (waiters.length > 0 ? waiters.shift()!(m) : inbox.push(m)));
  const receive = () => new Promise<any>((resolve) => (inbox.length > 0 ? resolve(inbox.shift()) : waiters.push(resolve)));
  try {
    const { guardUrl } = await receive();
    const client = new Client(fenced.url, { holder: "paused" });
    const a = await client.acquire(scope, { ttl: 500 });
    assert.equal((await fencedFetch(a, guardUrl, { method: "POST" })).status, 200);

    worker.postMessage("take over");
    // The pause: a busy loop holds this thread's event loop until the
    // second holder has been granted the scope and has written, so no timer
    // of a's keep-alive can run. Bounded at a minute, should fenced never
    // grant it.
    const giveUp = performance.now() + 60_000;
    while (Atomics.load(done, 0) === 0 && performance.now() < giveUp) {
      // spin
    }
    assert.equal(Atomics.load(done, 0), 1, `the second holder never took over: ${JSON.stringify(inbox)}`);
    const b = await receive();
    assert.equal(b.status, 200);
    assert.ok(BigInt(b.token) > a.token);

    // Running again, before any timer: the signal has already fired,
    // because reading it checks the monotonic clock.
    assert.equal(a.lost.aborted, true);
    const reason = a.lost.reason;
    assert.ok(reason instanceof LostError);
    assert.match(reason.message, /no renewal confirmed within the TTL of 500ms/);
    // fencedFetch refuses to send with a lost lease...
    await assert.rejects(fencedFetch(a, guardUrl, { method: "POST" }), (err) => err === reason);
    // ...and a write sent anyway, as a holder that ignores the signal would,
    // is refused by the guard.
    const late = await fetch(guardUrl, { method: "POST", headers: { "Fencing-Token": a.tokenText } });
    assert.equal(late.status, 409);
    const problem = await late.text();
    assert.match(problem, new RegExp(`"presented_token":${a.token},"highest_token":${b.token}`));

    worker.postMessage("writes");
    assert.deepEqual((await receive()).writes, [a.token.toString(), b.token]);
    await assert.rejects(a.release(), (err) => err === reason);
    await client.close();
  } finally {
    worker.postMessage("stop");
    await new Promise((resolve) => worker.once("exit", resolve));
  }
});
