// Test support: a real fenced on a free loopback port with a data directory
// of its own, stopped when the test file ends.

import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { after } from "node:test";

/** PKG is clients/typescript; REPO the repository root. */
export const PKG = join(dirname(fileURLToPath(import.meta.url)), "..", "..");
export const REPO = join(PKG, "..", "..");

/** vectors returns testdata/protocol/vectors.json, read from the repository on every call. */
export function vectors(): any {
  return JSON.parse(readFileSync(join(REPO, "testdata", "protocol", "vectors.json"), "utf8"));
}

/**
 * goBin returns a binary of the repository's cmd/NAME: $ENV, or build/NAME,
 * which `npm test` builds (go build ./cmd/fenced ./cmd/fencectl) and which
 * is built here if missing.
 */
function goBin(name: string, env: string): string {
  const fromEnv = process.env[env];
  if (fromEnv) return fromEnv;
  const bin = join(PKG, "build", name);
  if (!existsSync(bin)) {
    const r = spawnSync("go", ["build", "-o", bin, `./cmd/${name}`], { cwd: REPO, stdio: "inherit" });
    if (r.status !== 0) throw new Error(`go build ./cmd/${name} failed (${r.status ?? r.signal})`);
  }
  return bin;
}

/**
 * installGuard runs `fencectl guard install url`: fence's guard inside
 * PostgreSQL or Redis, as a user installs it. Installing again is harmless.
 */
export function installGuard(url: string): void {
  const r = spawnSync(goBin("fencectl", "FENCECTL_BIN"), ["guard", "install", url], { encoding: "utf8", timeout: 60_000 });
  if (r.status !== 0) throw new Error(`fencectl guard install failed (${r.status ?? r.signal}):\n${r.stdout}${r.stderr}`);
}

export interface Fenced {
  /** The API's base URL, "http://127.0.0.1:PORT". */
  url: string;
  /** What fenced logged so far, for failure messages. */
  log(): string;
  /** stop stops fenced (SIGTERM) and waits for it to exit, keeping its data. */
  stop(): Promise<void>;
  /** restart stops fenced and starts it again on the same data and port, a new term of its own. */
  restart(): Promise<void>;
}

/**
 * startFenced starts fenced with a temporary data directory on a port the
 * kernel picks (--listen 127.0.0.1:0; the port is read from its start-up
 * log), waits until it is the ready leader, and stops it after the file's
 * tests.
 */
export async function startFenced(...args: string[]): Promise<Fenced> {
  const dir = mkdtempSync(join(tmpdir(), "fence-ts-"));
  let child: ChildProcess | undefined;
  let log = "";
  const stop = async () => {
    const c = child;
    if (c !== undefined && c.exitCode === null && c.signalCode === null) {
      const exited = new Promise((resolve) => c.once("exit", resolve));
      c.kill("SIGTERM");
      await exited;
    }
  };
  after(async () => {
    await stop();
    rmSync(dir, { recursive: true, force: true });
  });
  const start = async (listen: string) => {
    const c = spawn(goBin("fenced", "FENCED_BIN"), ["--data-dir", join(dir, "data"), "--listen", listen, ...args], {
      stdio: ["ignore", "ignore", "pipe"],
    });
    child = c;
    const from = log.length;
    c.stderr!.setEncoding("utf8");
    const url = await new Promise<string>((resolve, reject) => {
      c.stderr!.on("data", (chunk: string) => {
        log += chunk;
        const m = /msg="fenced started" listen=(\S+)/.exec(log.slice(from));
        if (m) resolve(`http://${m[1]}`);
      });
      c.once("exit", (code, sig) => reject(new Error(`fenced exited (${code ?? sig}) before it started:\n${log}`)));
      c.once("error", reject);
    });
    // Ready once it leads: a single node elects itself within a second or
    // so. Bounded at 300 tries of 100ms.
    for (let i = 0; ; i++) {
      const res = await fetch(`${url}/readyz`).catch(() => undefined);
      if (res?.ok) break;
      if (i >= 300) throw new Error(`fenced at ${url} never became ready:\n${log}`);
      await new Promise((r) => setTimeout(r, 100));
    }
    return url;
  };
  const url = await start("127.0.0.1:0");
  return {
    url,
    log: () => log,
    stop,
    restart: async () => {
      await stop();
      await start(new URL(url).host);
    },
  };
}

/** metric reads an unlabelled counter or gauge from fenced's /metrics (0 if absent). */
export async function metric(url: string, name: string): Promise<number> {
  const text = await (await fetch(`${url}/metrics`)).text();
  const m = new RegExp(`^${name} (\\S+)$`, "m").exec(text);
  return m ? Number(m[1]) : 0;
}

/**
 * reportedOnStatusPage returns the rows of the status page's table of stale
 * rejections (id="rejections") for scope: [scope, count, last stale token,
 * its holder, highest accepted, guard, at], as fenced shows them to people.
 */
export async function reportedOnStatusPage(url: string, scope: string): Promise<string[][]> {
  const html = await (await fetch(`${url}/`)).text();
  const table = /<table id="rejections">([\s\S]*?)<\/table>/.exec(html)?.[1] ?? "";
  const rows = [...table.matchAll(/<tr>([\s\S]*?)<\/tr>/g)].map((m) => [...m[1]!.matchAll(/<td[^>]*>([\s\S]*?)<\/td>/g)].map((c) => c[1]!));
  return rows.filter((r) => r[0] === scope);
}

/** rpc calls a LeaseService method directly, for what the client does not offer (Get, a foreign Release). */
export async function rpc(url: string, method: string, body: unknown): Promise<any> {
  const res = await fetch(`${url}/fence.v1.LeaseService/${method}`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify(body),
  });
  return { status: res.status, body: await res.json() };
}

/**
 * serverURL returns the named environment variable (FENCE_TEST_POSTGRES,
 * FENCE_TEST_REDIS: make services' servers), or undefined to skip the tests
 * that need it; under CI=true a missing server is an error instead.
 */
export function serverURL(name: string): string | undefined {
  const v = process.env[name];
  if (v) return v;
  if (process.env.CI === "true") {
    throw new Error(`${name} is not set: under CI=true the tests that need its server must run (make services; set -a; source scripts/services.env)`);
  }
  return undefined;
}

/** until polls cond every 10 ms until it holds, or fails after 20 s. */
export async function until(what: string, cond: () => Promise<boolean> | boolean): Promise<void> {
  for (const end = performance.now() + 20_000; !(await cond()); await new Promise((r) => setTimeout(r, 10))) {
    if (performance.now() > end) throw new Error(`${what}: not within 20s`);
  }
}
