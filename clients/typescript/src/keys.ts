// Verifying signed tokens with fenced's public keys (docs/protocol.md,
// "Signatures"): Node's own Ed25519, keys in the GET /keys form.

import { createPublicKey, verify as edVerify, type KeyObject } from "node:crypto";

import { FenceError, InvalidError, UnavailableError } from "./errors.js";
import { formatToken, isSigned, signedPayload, type Token } from "./token.js";

/** KeysFile is the body of fenced's GET /keys. */
export interface KeysFile {
  keys: { kid: string; public_key: string; not_after?: string }[];
}

/**
 * Verifier checks a token's signature. A guard given one refuses, before
 * comparing, every token it does not verify. KeySet and RemoteKeySet are
 * verifiers.
 */
export interface Verifier {
  /** verify resolves if t is genuine and throws an InvalidError if not. */
  verify(t: Token): void | Promise<void>;
}

interface PublicKey {
  key: KeyObject;
  notAfter: number | undefined; // ms since the epoch; undefined: no end
}

/**
 * KeySet is a fixed set of public keys. verify refuses an unsigned token, a
 * token whose key ID is not in the set or whose key is past its not_after,
 * and a token whose signature does not verify. Safe to share.
 */
export class KeySet implements Verifier {
  readonly #keys = new Map<string, PublicKey>();
  readonly #now: () => number;

  /** The keys in the GET /keys form; now gives the wall clock (for tests). */
  constructor(file: KeysFile, now: () => number = Date.now) {
    this.#now = now;
    for (const k of file.keys ?? []) {
      const raw = Buffer.from(k.public_key, "base64");
      if (raw.length !== 32 || raw.toString("base64") !== k.public_key) {
        throw new FenceError(`key ${JSON.stringify(k.kid)}: public_key is not 32 bytes in standard base64`);
      }
      let notAfter: number | undefined;
      if (k.not_after !== undefined && k.not_after !== "") {
        notAfter = Date.parse(k.not_after);
        if (Number.isNaN(notAfter)) {
          throw new FenceError(`key ${JSON.stringify(k.kid)}: not_after ${JSON.stringify(k.not_after)} is not a time`);
        }
      }
      const key = createPublicKey({ key: { kty: "OKP", crv: "Ed25519", x: raw.toString("base64url") }, format: "jwk" });
      this.#keys.set(k.kid, { key, notAfter });
    }
  }

  /** has reports whether the set lists the key ID. */
  has(keyId: string): boolean {
    return this.#keys.has(keyId);
  }

  verify(t: Token): void {
    if (!isSigned(t) || t.keyId === undefined || t.signature === undefined) {
      throw new InvalidError("token", `unsigned token ${formatToken(t)} refused: this guard requires tokens signed by fenced`);
    }
    const k = this.#keys.get(t.keyId);
    if (k === undefined) {
      throw new InvalidError("token", `bad token signature: unknown signing key ${JSON.stringify(t.keyId)}`);
    }
    if (k.notAfter !== undefined && this.#now() > k.notAfter) {
      throw new InvalidError("token", `bad token signature: key ${JSON.stringify(t.keyId)} was retired at ${new Date(k.notAfter).toISOString()}`);
    }
    if (!edVerify(null, signedPayload(t), k.key, t.signature)) {
      throw new InvalidError("token", `bad token signature: ${t.scope} token ${t.value} is not signed by key ${JSON.stringify(t.keyId)}`);
    }
  }
}

/**
 * RemoteKeySet verifies with the keys fenced publishes at GET /keys. It
 * fetches them on first use, and again when a token names a key ID it does
 * not know (a rotation publishes a new key), but at most once per
 * refreshIntervalMs (default 30s), so unknown key IDs cannot make it fetch
 * without bound. Safe to share; concurrent verifies share one fetch.
 */
export class RemoteKeySet implements Verifier {
  readonly #url: string;
  readonly #intervalMs: number;
  readonly #headers: Record<string, string>;
  #set: KeySet | undefined;
  #fetchedAt = -Infinity; // performance.now() of the last fetch
  #inflight: Promise<KeySet> | undefined;

  constructor(baseUrl: string, opts: { refreshIntervalMs?: number; bearer?: string } = {}) {
    this.#url = baseUrl.replace(/\/+$/, "") + "/keys";
    this.#intervalMs = opts.refreshIntervalMs ?? 30_000;
    this.#headers = opts.bearer === undefined ? {} : { authorization: `Bearer ${opts.bearer}` };
  }

  async verify(t: Token): Promise<void> {
    let set = this.#set;
    const stale = performance.now() - this.#fetchedAt >= this.#intervalMs;
    if (set === undefined || (t.keyId !== undefined && !set.has(t.keyId) && stale)) {
      set = await this.refresh();
    }
    set.verify(t);
  }

  /** refresh fetches the keys now (sharing a fetch already under way). */
  refresh(): Promise<KeySet> {
    this.#inflight ??= this.#fetch().finally(() => {
      this.#inflight = undefined;
    });
    return this.#inflight;
  }

  async #fetch(): Promise<KeySet> {
    this.#fetchedAt = performance.now();
    let res: Response;
    try {
      res = await fetch(this.#url, { headers: this.#headers, signal: AbortSignal.timeout(10_000) });
    } catch (err) {
      throw new UnavailableError(`fetch ${this.#url}: ${(err as Error).message}`, { cause: err });
    }
    if (!res.ok) {
      throw new UnavailableError(`fetch ${this.#url}: ${res.status} ${await res.text()}`);
    }
    this.#set = new KeySet((await res.json()) as KeysFile);
    return this.#set;
  }
}
