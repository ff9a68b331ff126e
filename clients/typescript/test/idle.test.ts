// A process that holds no lease exits by itself: the client keeps Node's
// event loop alive only while a lease renews (its keep-alive timer), never
// for an idle client. Each case runs idle-child.js in a process of its own
// and waits for it to exit; the leases it takes have a TTL of a minute, so
// a keep-alive left running would hold it far past the bound.

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { test } from "node:test";

import { Client } from "../src/index.js";
import { reportedOnStatusPage, startFenced } from "./fenced.js";

const fenced = await startFenced();

/** EXIT_MS bounds how long a child may take from its start to its exit. */
const EXIT_MS = 10_000;

function runChild(mode: string, scope: string, killAfterMs = EXIT_MS): Promise<{ code: number | null; out: string; ms: number }> {
  const start = performance.now();
  const child = spawn(process.execPath, [new URL("./idle-child.js", import.meta.url).pathname, fenced.url, mode, scope], {
    stdio: ["ignore", "pipe", "pipe"],
  });
  let out = "";
  child.stdout.setEncoding("utf8").on("data", (s: string) => (out += s));
  child.stderr.setEncoding("utf8").on("data", (s: string) => (out += s));
  return new Promise((resolve) => {
    const timer = setTimeout(() => child.kill("SIGKILL"), killAfterMs);
    child.once("exit", (code) => {
      clearTimeout(timer);
      resolve({ code, out, ms: performance.now() - start });
    });
  });
}

for (const mode of ["released", "held", "lost", "closed"]) {
  test(`a process whose lease was ${mode === "held" ? "refused (held)" : mode} exits by itself`, async () => {
    const scope = `ts/idle/${mode}`;
    const holder = new Client(fenced.url, { holder: "idle-test" });
    const held = mode === "held" ? await holder.acquire(scope, { ttl: 60_000 }) : undefined;
    try {
      const r = await runChild(mode, scope);
      assert.equal(r.code, 0, `the child did not exit by itself within ${EXIT_MS}ms (killed: code ${r.code}):\n${r.out}`);
      assert.match(r.out, /^done$/m);
    } finally {
      await held?.release();
      await holder.close();
    }
  });
}

test("a process whose reporter holds a rejection exits by itself, and sends it first", async () => {
  const scope = "ts/idle/reported";
  const r = await runChild("reported", scope);
  assert.equal(r.code, 0, `the child did not exit by itself within ${EXIT_MS}ms, far less than its reporter's timer of a minute (killed: code ${r.code}):\n${r.out}`);
  assert.match(r.out, /^done$/m);
  const rows = await reportedOnStatusPage(fenced.url, scope);
  assert.deepEqual(rows.map((row) => [row[1], row[2], row[4], row[5]]), [["1", "41", "42", "idle-reporter"]], "sent before the exit");
});

test("the control: a process that holds a lease keeps running while it renews", async () => {
  const r = await runChild("holding", "ts/idle/holding", 2_000);
  assert.equal(r.code, null, `the child exited (${r.code}) while it held a lease:\n${r.out}`);
  assert.match(r.out, /^done$/m);
});
