// The protocol's test vectors (testdata/protocol/vectors.json), read from
// the repository: v1, v2 and, once they are there, v3 cases are checked
// alike, recognised by their text.

import assert from "node:assert/strict";
import { createPrivateKey, sign } from "node:crypto";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { test } from "node:test";

import { check, formatToken, InvalidError, KeySet, MAX_TOKEN, parseToken, RemoteKeySet, signedPayload, type Token } from "../src/index.js";
import { vectors } from "./fenced.js";

const v = vectors();

/** privateKey makes the Ed25519 key of a vectors.json seed. */
function privateKey(seedHex: string, publicB64: string) {
  return createPrivateKey({
    key: { kty: "OKP", crv: "Ed25519", d: Buffer.from(seedHex, "hex").toString("base64url"), x: Buffer.from(publicB64, "base64").toString("base64url") },
    format: "jwk",
  });
}

test("vectors: valid texts parse to their fields and round-trip", (t) => {
  assert.ok(v.parse.valid.length > 0);
  const versions = v.parse.valid.map((c: any) => c.text.slice(6, 8));
  t.diagnostic(`valid texts: ${["v1", "v2", "v3"].map((ver) => `${versions.filter((x: string) => x === ver).length} ${ver}`).join(", ")}`);
  for (const c of v.parse.valid) {
    const t = parseToken(c.text);
    assert.equal(t.scope, c.scope, c.text);
    assert.equal(t.value, BigInt(c.value), c.text);
    assert.equal(typeof t.value, "bigint");
    assert.equal(`fence:v${t.version}:`, c.text.slice(0, 9), c.text);
    if (c.signature !== undefined) {
      assert.equal(t.keyId, c.key_id, c.text);
      assert.equal(Buffer.from(t.signature!).toString("base64url"), c.signature, c.text);
      assert.equal(t.leaseId, c.lease_id, c.text); // undefined for v3
    } else {
      assert.equal(t.signature, undefined, `${c.text} parsed as signed`);
    }
    assert.equal(formatToken(t), c.text, "the text form must round-trip");
  }
});

test("vectors: invalid texts are refused as InvalidError", () => {
  assert.ok(v.parse.invalid.length > 0);
  for (const c of v.parse.invalid) {
    assert.throws(() => parseToken(c.text), InvalidError, `${c.text.slice(0, 70)} (${c.why})`);
  }
});

test("vectors: compare as unsigned 64-bit, plain and strict", () => {
  assert.ok(v.compare.length > 0);
  for (const c of v.compare) {
    const w = { token: { version: 1, scope: "s", value: BigInt(c.presented) } as Token, seq: BigInt(c.presented_sequence ?? 0) };
    const h = { token: BigInt(c.highest), seq: BigInt(c.highest_sequence ?? 0) };
    const strict = c.accepted_strict ?? c.accepted;
    const what = `${c.presented}.${c.presented_sequence ?? 0} over ${c.highest}.${c.highest_sequence ?? 0} (${c.why})`;
    assert.equal(check("s", h, w, false) === undefined, c.accepted, what);
    assert.equal(check("s", h, w, true) === undefined, strict, `${what}, strict`);
  }
});

test("vectors: verify against the key set", () => {
  const keys = new KeySet(v.keys);
  assert.ok(v.verify.length > 0);
  for (const c of v.verify) {
    let ok = true;
    try {
      keys.verify(parseToken(c.text));
    } catch (err) {
      assert.ok(err instanceof InvalidError, `${c.text.slice(0, 70)}: ${err}`);
      ok = false;
    }
    assert.equal(ok, c.valid, `${c.text.slice(0, 70)} (${c.why ?? "genuine"})`);
  }
});

test("vectors: the seeds sign the valid tokens again (Ed25519 is deterministic)", () => {
  for (const k of v.keys.keys) {
    const priv = privateKey(v.seeds[k.kid], k.public_key);
    for (const c of [...v.parse.valid, ...v.verify.filter((c: any) => c.valid)]) {
      const t = parseToken(c.text);
      if (t.keyId !== k.kid) continue;
      assert.equal(sign(null, signedPayload(t), priv).toString("base64url"), Buffer.from(t.signature!).toString("base64url"), c.text);
    }
  }
});

test("v3: a token signed over scope and value verifies; changing either does not", () => {
  const k = v.keys.keys.find((k: any) => k.not_after === undefined);
  const keys = new KeySet(v.keys);
  const priv = privateKey(v.seeds[k.kid], k.public_key);
  const mint = (scope: string, value: bigint): Token => {
    const unsigned: Token = { version: 3, scope, value, keyId: k.kid, signature: new Uint8Array(64) };
    return { ...unsigned, signature: new Uint8Array(sign(null, signedPayload(unsigned), priv)) };
  };
  const t = mint("orders/shard-7", 9007199254740993n);
  assert.deepEqual(signedPayload(t), Buffer.from("fence-token-v3\x00orders/shard-7\x009007199254740993"));
  const text = formatToken(t);
  assert.match(text, /^fence:v3:orders\/shard-7:9007199254740993:k1700000000-a1b2c3:[A-Za-z0-9_-]{86}$/);
  const back = parseToken(text);
  assert.deepEqual(back, t);
  keys.verify(back);
  const sig = text.split(":").pop();
  for (const forged of [
    `fence:v3:orders/shard-7:9007199254740992:${k.kid}:${sig}`,
    `fence:v3:orders/shard-8:9007199254740993:${k.kid}:${sig}`,
    `fence:v3:orders/shard-7:${MAX_TOKEN}:${k.kid}:${sig}`,
  ]) {
    assert.throws(() => keys.verify(parseToken(forged)), InvalidError, forged);
  }
  // A v3 text has exactly SCOPE:VALUE:KEY_ID:SIG after the version.
  assert.throws(() => parseToken(`fence:v3:orders:42:${k.kid}`), InvalidError);
  assert.throws(() => parseToken(`fence:v3:orders:42:5f0c3a1e9b7d42c68e1f00a4b3c2d1e0:${k.kid}:${sig}`), InvalidError);
});

test("values beyond 2^53 stay exact", () => {
  const a = parseToken("fence:v1:s:9007199254740993");
  const b = parseToken("fence:v1:s:9007199254740992");
  assert.ok(check("s", { token: a.value, seq: 0n }, { token: b }) !== undefined, "2^53 after 2^53+1 must be stale");
  assert.equal(parseToken(`fence:v1:s:${MAX_TOKEN}`).value, MAX_TOKEN);
});

test("RemoteKeySet: an unknown key ID fetches /keys again at most once per interval", async () => {
  let hits = 0;
  const srv = createServer((req, res) => {
    assert.equal(req.url, "/keys");
    hits++;
    res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify(v.keys));
  });
  await new Promise<void>((resolve) => srv.listen(0, "127.0.0.1", resolve));
  try {
    const url = `http://127.0.0.1:${(srv.address() as AddressInfo).port}`;
    const genuine = parseToken(v.verify.find((c: any) => c.valid).text);
    const unknown = parseToken(v.verify.find((c: any) => /unknown key/.test(c.why ?? "")).text);
    const keys = new RemoteKeySet(url, { refreshIntervalMs: 3_600_000 });
    await keys.verify(genuine);
    for (let i = 0; i < 5; i++) {
      await assert.rejects(keys.verify(unknown), InvalidError);
    }
    assert.equal(hits, 1, "one fetch, however many unknown key IDs");
    const eager = new RemoteKeySet(url, { refreshIntervalMs: 0 });
    await eager.verify(genuine);
    await assert.rejects(eager.verify(unknown), InvalidError);
    assert.equal(hits, 3, "with no interval, an unknown key ID fetches again");
  } finally {
    srv.close();
  }
});
