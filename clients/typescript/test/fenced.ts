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
}

/**
 * startFenced starts fenced with a temporary data directory on a port the
 * kernel picks (--listen 127.0.0.1:0; the port is read from its start-up
 * log), waits until it is the ready leader, and stops it after the file's
 * tests.
 */
export async function startFenced(...args: string[]): Promise<Fenced> {
  const dir = mkdtempSync(join(tmpdir(), "fence-ts-"));
  const child: ChildProcess = spawn(goBin("fenced", "FENCED_BIN"), ["--data-dir", join(dir, "data"), "--listen", "127.0.0.1:0", ...args], {
    stdio: ["ignore", "ignore", "pipe"],
  });
  let log = "";
  child.stderr!.setEncoding("utf8");
  after(async () => {
    if (child.exitCode === null && child.signalCode === null) {
      const exited = new Promise((resolve) => child.once("exit", resolve));
      child.kill("SIGTERM");
      await exited;
    }
    rmSync(dir, { recursive: true, force: true });
  });
  const url = await new Promise<string>((resolve, reject) => {
    child.stderr!.on("data", (chunk: string) => {
      log += chunk;
      const m = /msg="fenced started" listen=(\S+)/.exec(log);
      if (m) resolve(`http://${m[1]}`);
    });
    child.once("exit", (code, sig) => reject(new Error(`fenced exited (${code ?? sig}) before it started:\n${log}`)));
    child.once("error", reject);
  });
  // Ready once it leads: a single node elects itself within a second or
  // so. Bounded at 300 tries of 100ms.
  for (let i = 0; ; i++) {
    const res = await fetch(`${url}/readyz`).catch(() => undefined);
    if (res?.ok) break;
    if (i >= 300) throw new Error(`fenced at ${url} never became ready:\n${log}`);
    await new Promise((r) => setTimeout(r, 100));
  }
  return { url, log: () => log };
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
