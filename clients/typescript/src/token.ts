// The fencing token and its text forms (docs/protocol.md, "The token").
// Values are bigint throughout: a token may exceed 2^53, where a Number
// would round two tokens to one.

import { InvalidError } from "./errors.js";

/** MAX_TOKEN is the largest token fenced issues, 2^63−1: it fits a signed BIGINT. */
export const MAX_TOKEN = (1n << 63n) - 1n;

/** MAX_SCOPE_LEN bounds a scope, in bytes. */
export const MAX_SCOPE_LEN = 256;

const MAX_KEY_ID_LEN = 32;
const PREFIX = "fence:";
// The longest text any version can have (v2: 9 + 256 + 1 + 19 + 1 + 32 + 1
// + 32 + 1 + 86 = 438); longer is refused before splitting.
const MAX_TEXT_LEN = 438;

/**
 * Token is a scope and its 64-bit value. A signed token (v2, v3) also
 * carries the ID of the key that signed it and the 64-byte Ed25519
 * signature; a v2 token also the lease ID it was signed with. Tokens are
 * plain immutable values.
 */
export interface Token {
  readonly version: 1 | 2 | 3;
  readonly scope: string;
  readonly value: bigint;
  /** For v2 only: the lease ID its signature covers (32 lowercase hex digits). */
  readonly leaseId?: string;
  /** For v2 and v3: the signing key's ID, as listed by fenced's GET /keys. */
  readonly keyId?: string;
  /** For v2 and v3: the raw 64-byte Ed25519 signature. */
  readonly signature?: Uint8Array;
}

/** isSigned reports whether t carries a signature (v2 or v3). */
export function isSigned(t: Token): boolean {
  return t.signature !== undefined;
}

/**
 * parseToken reads a token's text form: "fence:v1:SCOPE:VALUE",
 * "fence:v3:SCOPE:VALUE:KEY_ID:SIG" or the older
 * "fence:v2:SCOPE:VALUE:LEASE_ID:KEY_ID:SIG". Anything else throws an
 * InvalidError for the field "token" (or "scope"). Parsing does not verify
 * the signature: KeySet.verify does, with fenced's public keys.
 */
export function parseToken(text: string): Token {
  if (text.length > MAX_TEXT_LEN) {
    throw new InvalidError("token", `token text is ${text.length} characters long, at most ${MAX_TEXT_LEN} allowed`);
  }
  if (!text.startsWith(PREFIX)) {
    throw new InvalidError("token", `${quoteShort(text)} does not start with "fence:"; want fence:v3:SCOPE:VALUE:KEY_ID:SIGNATURE or fence:v1:SCOPE:VALUE`);
  }
  const f = text.slice(PREFIX.length).split(":");
  // The scope cannot contain ':', so the fields split unambiguously.
  switch (f[0]) {
    case "v1":
      if (f.length !== 3) {
        throw new InvalidError("token", `${quoteShort(text)} has ${f.length - 1} fields after the version; want fence:v1:SCOPE:VALUE`);
      }
      return { version: 1, scope: scopeOf(f[1]!), value: parseValue(f[2]!) };
    case "v2": {
      if (f.length !== 6) {
        throw new InvalidError("token", `${quoteShort(text)} has ${f.length - 1} fields after the version; want fence:v2:SCOPE:VALUE:LEASE_ID:KEY_ID:SIGNATURE`);
      }
      const leaseId = f[3]!;
      if (!/^[0-9a-f]{32}$/.test(leaseId) || /^0+$/.test(leaseId)) {
        throw new InvalidError("token", `lease ID ${quoteShort(leaseId)} is not 32 hexadecimal digits of a lease`);
      }
      return { version: 2, scope: scopeOf(f[1]!), value: parseValue(f[2]!), leaseId, keyId: keyIdOf(f[4]!), signature: signatureOf(f[5]!) };
    }
    case "v3":
      if (f.length !== 5) {
        throw new InvalidError("token", `${quoteShort(text)} has ${f.length - 1} fields after the version; want fence:v3:SCOPE:VALUE:KEY_ID:SIGNATURE`);
      }
      return { version: 3, scope: scopeOf(f[1]!), value: parseValue(f[2]!), keyId: keyIdOf(f[3]!), signature: signatureOf(f[4]!) };
    default:
      if (f.length < 2) {
        throw new InvalidError("token", `${quoteShort(text)} has no version: want fence:v3:SCOPE:VALUE:KEY_ID:SIGNATURE or fence:v1:SCOPE:VALUE`);
      }
      throw new InvalidError("token", `${quoteShort(text)} has version ${JSON.stringify(f[0])}; this client reads v1, v2 and v3`);
  }
}

/** formatToken writes t's text form; parseToken reads it back unchanged. */
export function formatToken(t: Token): string {
  const head = `${PREFIX}v${t.version}:${t.scope}:${t.value}`;
  switch (t.version) {
    case 1:
      return head;
    case 2:
      return `${head}:${t.leaseId}:${t.keyId}:${base64url(t)}`;
    case 3:
      return `${head}:${t.keyId}:${base64url(t)}`;
  }
}

function base64url(t: Token): string {
  if (t.signature === undefined || t.keyId === undefined) {
    throw new InvalidError("token", `a v${t.version} token needs a key ID and a signature`);
  }
  return Buffer.from(t.signature).toString("base64url");
}

/**
 * signedPayload returns the bytes a signed token's signature covers:
 * "fence-token-v3" 0x00 SCOPE 0x00 VALUE for v3, and
 * "fence-token-v2" 0x00 SCOPE 0x00 VALUE 0x00 LEASE_ID for v2, with VALUE
 * in decimal. The fixed prefix keeps a token signature from being valid as
 * anything else.
 */
export function signedPayload(t: Token): Buffer {
  switch (t.version) {
    case 2:
      return Buffer.from(`fence-token-v2\x00${t.scope}\x00${t.value}\x00${t.leaseId}`, "latin1");
    case 3:
      return Buffer.from(`fence-token-v3\x00${t.scope}\x00${t.value}`, "latin1");
    default:
      throw new InvalidError("token", `a v${t.version} token is unsigned: it has no signed payload`);
  }
}

/**
 * validateScope throws an InvalidError for the field "scope" unless s is 1
 * to 256 bytes of ASCII letters, digits, '.', '_', '-' and '/', with '/'
 * separating non-empty segments none of which is '.' or '..'.
 */
export function validateScope(s: string): void {
  if (s === "") {
    throw new InvalidError("scope", `empty; want 1 to ${MAX_SCOPE_LEN} bytes of letters, digits, '.', '_', '-' and '/'`);
  }
  if (s.length > MAX_SCOPE_LEN) {
    throw new InvalidError("scope", `${s.length} bytes long, at most ${MAX_SCOPE_LEN} allowed`);
  }
  const bad = s.search(/[^A-Za-z0-9._\-/]/);
  if (bad >= 0) {
    throw new InvalidError("scope", `${quoteShort(s)} has ${JSON.stringify(s[bad])} at byte ${bad}; allowed are ASCII letters, digits, '.', '_', '-' and '/'`);
  }
  for (const seg of s.split("/")) {
    if (seg === "") {
      throw new InvalidError("scope", `${quoteShort(s)} has an empty segment; '/' may not start or end a scope or repeat`);
    }
    if (seg === "." || seg === "..") {
      throw new InvalidError("scope", `${quoteShort(s)} has a "${seg}" segment, which is not allowed`);
    }
  }
}

function scopeOf(s: string): string {
  validateScope(s);
  return s;
}

/**
 * parseValue reads a token value strictly: decimal digits, no sign, no
 * leading zero, from 1 to 2^63−1.
 */
export function parseValue(num: string): bigint {
  if (!/^[1-9][0-9]{0,18}$/.test(num)) {
    throw new InvalidError("token", `value ${quoteShort(num)} is not a decimal integer from 1 to ${MAX_TOKEN} without sign or leading zeros`);
  }
  const v = BigInt(num);
  if (v > MAX_TOKEN) {
    throw new InvalidError("token", `value ${quoteShort(num)} is above the maximum ${MAX_TOKEN}`);
  }
  return v;
}

function keyIdOf(s: string): string {
  if (s.length < 1 || s.length > MAX_KEY_ID_LEN || !/^[a-z0-9-]+$/.test(s)) {
    throw new InvalidError("token", `key ID ${quoteShort(s)} is not 1 to ${MAX_KEY_ID_LEN} of a-z, 0-9 and '-'`);
  }
  return s;
}

function signatureOf(s: string): Uint8Array {
  // Buffer's base64url decoder skips what it does not know; decoding and
  // encoding again must give the same text, which refuses padding, other
  // characters and non-zero trailing bits, as Go's strict decoder does.
  const raw = Buffer.from(s, "base64url");
  if (raw.length !== 64 || raw.toString("base64url") !== s) {
    throw new InvalidError("token", `signature ${quoteShort(s)} is not 64 bytes in unpadded base64url`);
  }
  return new Uint8Array(raw);
}

function quoteShort(s: string): string {
  return JSON.stringify(s.length > 64 ? s.slice(0, 61) + "..." : s);
}
