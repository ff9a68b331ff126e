// The other side of paused.test.ts, on a thread of its own so that it runs
// while the main thread's event loop is blocked: the guarded resource (an
// HTTP server with the middleware) and the second holder.

import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { parentPort, workerData } from "node:worker_threads";

import { Client, fencedFetch, fencingMiddleware, MemoryMarkStore, RemoteKeySet } from "../src/index.js";

const { fencedUrl, scope, done } = workerData as { fencedUrl: string; scope: string; done: Int32Array };
const store = new MemoryMarkStore();
const writes: string[] = [];
const mw = fencingMiddleware({ scope, store, verifier: new RemoteKeySet(fencedUrl) });
const srv = createServer((req, res) =>
  mw(req, res, () => {
    writes.push(String(req.headers["fencing-token"]).split(":")[3]!);
    res.end("ok");
  }),
);
await new Promise<void>((resolve) => srv.listen(0, "127.0.0.1", resolve));
const guardUrl = `http://127.0.0.1:${(srv.address() as AddressInfo).port}`;

parentPort!.on("message", async (msg: string) => {
  try {
    if (msg === "take over") {
      // Queued behind the paused holder: granted once fenced expires its
      // lease, which it does because the holder cannot renew.
      const client = new Client(fencedUrl, { holder: "second" });
      const b = await client.acquire(scope, { ttl: 30_000, wait: true, signal: AbortSignal.timeout(60_000) });
      const res = await fencedFetch(b, guardUrl, { method: "POST" });
      parentPort!.postMessage({ token: b.token.toString(), status: res.status });
      Atomics.store(done, 0, 1); // ends the main thread's busy loop
      await client.close();
    } else if (msg === "writes") {
      parentPort!.postMessage({ writes });
    } else if (msg === "stop") {
      srv.close();
      parentPort!.close();
    }
  } catch (err) {
    parentPort!.postMessage({ error: String(err) });
    Atomics.store(done, 0, 2);
  }
});
parentPort!.postMessage({ guardUrl });
