// The child process of idle.test.ts: makes a client, does one thing with
// it that leaves it holding no lease, prints "done", and then must exit by
// itself: nothing it leaves behind may keep Node's event loop alive.

import { Client, HeldError, StaleError } from "../src/index.js";

const [url, mode, scope] = process.argv.slice(2) as [string, string, string];
const client = new Client(url, { holder: `idle-${mode}` });
switch (mode) {
  case "released": {
    const lease = await client.acquire(scope, { ttl: 60_000 });
    await lease.release();
    break;
  }
  case "held": {
    // The parent holds the scope: the one call fails, and nothing is held.
    try {
      await client.acquire(scope, { ttl: 60_000 });
      throw new Error(`acquired ${scope}, which the test holds`);
    } catch (err) {
      if (!(err instanceof HeldError)) throw err;
    }
    break;
  }
  case "lost": {
    // Marked lost and not released, as after a stale answer: it stops
    // renewing, and fenced expires it later.
    const lease = await client.acquire(scope, { ttl: 60_000 });
    lease.markLost("the test says so");
    break;
  }
  case "closed": {
    await client.acquire(scope, { ttl: 60_000 });
    await client.close();
    break;
  }
  case "reported": {
    // A reporter with a rejection to send and a timer a minute away: its
    // timer must not keep the process alive, and what it holds is sent
    // when the process has nothing else to do, before it exits.
    const reporter = client.reporter("idle-reporter", { intervalMs: 60_000 });
    reporter.rejected(new StaleError({ scope, presented: 41n, highest: 42n }));
    break;
  }
  case "holding": {
    // The control: a lease held keeps renewing, and keeps the process
    // alive, until it is released.
    await client.acquire(scope, { ttl: 60_000 });
    break;
  }
  default:
    throw new Error(`unknown mode ${mode}`);
}
console.log("done");
