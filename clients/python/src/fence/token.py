"""The fencing token and its text forms (docs/protocol.md, "The token").

Values are Python ints, exact at any size: a token may exceed 2^53, where
a float (or a JSON parser that makes floats) would round two tokens to one.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass
from typing import Optional

from .errors import InvalidError, StaleError

__all__ = [
    "MAX_TOKEN",
    "MAX_SCOPE_LEN",
    "Token",
    "parse_token",
    "format_token",
    "signed_payload",
    "validate_scope",
    "parse_value",
    "check",
]

#: MAX_TOKEN is the largest token fenced issues, 2^63−1: it fits a signed BIGINT.
MAX_TOKEN = (1 << 63) - 1
#: MAX_SCOPE_LEN bounds a scope, in bytes.
MAX_SCOPE_LEN = 256

_MAX_KEY_ID_LEN = 32
_PREFIX = "fence:"
# The longest text any version can have (v2: 9 + 256 + 1 + 19 + 1 + 32 + 1 +
# 32 + 1 + 86 = 438); longer is refused before splitting.
_MAX_TEXT_LEN = 438
_VALUE = re.compile(r"[1-9][0-9]{0,18}")
_KEY_ID = re.compile(r"[a-z0-9-]{1,32}")
_LEASE_ID = re.compile(r"[0-9a-f]{32}")
_SCOPE_BAD = re.compile(r"[^A-Za-z0-9._\-/]")
_SIG = re.compile(r"[A-Za-z0-9_-]{86}")


@dataclass(frozen=True)
class Token:
    """Token is a scope and its 64-bit value. A signed token (v2, v3) also
    carries the ID of the key that signed it and the 64-byte Ed25519
    signature; a v2 token also the lease ID it was signed with. Tokens are
    immutable values, safe to share between threads."""

    version: int
    scope: str
    value: int
    key_id: Optional[str] = None
    signature: Optional[bytes] = None
    lease_id: Optional[str] = None  # v2 only

    @property
    def signed(self) -> bool:
        """signed reports whether the token carries a signature (v2, v3)."""
        return self.signature is not None

    def __str__(self) -> str:
        return format_token(self)


def _quote(s: str) -> str:
    s = s if len(s) <= 64 else s[:61] + "..."
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def parse_token(text: str) -> Token:
    """parse_token reads a token's text form: "fence:v1:SCOPE:VALUE",
    "fence:v3:SCOPE:VALUE:KEY_ID:SIG" or the older
    "fence:v2:SCOPE:VALUE:LEASE_ID:KEY_ID:SIG". Anything else raises an
    InvalidError for the field "token" (or "scope"). Parsing does not verify
    the signature: KeySet.verify does, with fenced's public keys."""
    if not isinstance(text, str):
        raise InvalidError("token", f"a token's text is a str, not {type(text).__name__}")
    if len(text) > _MAX_TEXT_LEN:
        raise InvalidError("token", f"token text is {len(text)} characters long, at most {_MAX_TEXT_LEN} allowed")
    if not text.startswith(_PREFIX):
        raise InvalidError(
            "token",
            f'{_quote(text)} does not start with "fence:"; '
            "want fence:v3:SCOPE:VALUE:KEY_ID:SIGNATURE or fence:v1:SCOPE:VALUE",
        )
    f = text[len(_PREFIX):].split(":")
    # The scope cannot contain ':', so the fields split unambiguously.
    if f[0] == "v1":
        if len(f) != 3:
            raise InvalidError("token", f"{_quote(text)} has {len(f) - 1} fields after the version; want fence:v1:SCOPE:VALUE")
        return Token(1, _scope(f[1]), parse_value(f[2]))
    if f[0] == "v2":
        if len(f) != 6:
            raise InvalidError(
                "token",
                f"{_quote(text)} has {len(f) - 1} fields after the version; "
                "want fence:v2:SCOPE:VALUE:LEASE_ID:KEY_ID:SIGNATURE",
            )
        lease_id = f[3]
        if not _LEASE_ID.fullmatch(lease_id) or lease_id == "0" * 32:
            raise InvalidError("token", f"lease ID {_quote(lease_id)} is not 32 hexadecimal digits of a lease")
        return Token(2, _scope(f[1]), parse_value(f[2]), _key_id(f[4]), _signature(f[5]), lease_id)
    if f[0] == "v3":
        if len(f) != 5:
            raise InvalidError(
                "token",
                f"{_quote(text)} has {len(f) - 1} fields after the version; want fence:v3:SCOPE:VALUE:KEY_ID:SIGNATURE",
            )
        return Token(3, _scope(f[1]), parse_value(f[2]), _key_id(f[3]), _signature(f[4]))
    if len(f) < 2:
        raise InvalidError(
            "token", f"{_quote(text)} has no version: want fence:v3:SCOPE:VALUE:KEY_ID:SIGNATURE or fence:v1:SCOPE:VALUE"
        )
    raise InvalidError("token", f'{_quote(text)} has version "{f[0]}"; this client reads v1, v2 and v3')


def format_token(t: Token) -> str:
    """format_token writes t's text form; parse_token reads it back unchanged."""
    head = f"{_PREFIX}v{t.version}:{t.scope}:{t.value}"
    if t.version == 1:
        return head
    if t.signature is None or t.key_id is None:
        raise InvalidError("token", f"a v{t.version} token needs a key ID and a signature")
    sig = base64.urlsafe_b64encode(t.signature).rstrip(b"=").decode("ascii")
    if t.version == 2:
        return f"{head}:{t.lease_id}:{t.key_id}:{sig}"
    if t.version == 3:
        return f"{head}:{t.key_id}:{sig}"
    raise InvalidError("token", f"version {t.version} is not one this client writes")


def signed_payload(t: Token) -> bytes:
    """signed_payload returns the bytes a signed token's signature covers:
    "fence-token-v3" 0x00 SCOPE 0x00 VALUE for v3, and "fence-token-v2" 0x00
    SCOPE 0x00 VALUE 0x00 LEASE_ID for v2, with VALUE in decimal."""
    if t.version == 3:
        return f"fence-token-v3\x00{t.scope}\x00{t.value}".encode("ascii")
    if t.version == 2:
        return f"fence-token-v2\x00{t.scope}\x00{t.value}\x00{t.lease_id}".encode("ascii")
    raise InvalidError("token", f"a v{t.version} token is unsigned: it has no signed payload")


def validate_scope(s: str) -> None:
    """validate_scope raises an InvalidError for the field "scope" unless s
    is 1 to 256 bytes of ASCII letters, digits, '.', '_', '-' and '/', with
    '/' separating non-empty segments none of which is '.' or '..'."""
    if s == "":
        raise InvalidError("scope", f"empty; want 1 to {MAX_SCOPE_LEN} bytes of letters, digits, '.', '_', '-' and '/'")
    if len(s) > MAX_SCOPE_LEN:
        raise InvalidError("scope", f"{len(s)} bytes long, at most {MAX_SCOPE_LEN} allowed")
    m = _SCOPE_BAD.search(s)
    if m:
        raise InvalidError(
            "scope",
            f"{_quote(s)} has {m.group()!r} at byte {len(s[:m.start()].encode())}; "
            "allowed are ASCII letters, digits, '.', '_', '-' and '/'",
        )
    for seg in s.split("/"):
        if seg == "":
            raise InvalidError("scope", f"{_quote(s)} has an empty segment; '/' may not start or end a scope or repeat")
        if seg in (".", ".."):
            raise InvalidError("scope", f'{_quote(s)} has a "{seg}" segment, which is not allowed')


def _scope(s: str) -> str:
    validate_scope(s)
    return s


def parse_value(num: str) -> int:
    """parse_value reads a token value strictly: decimal digits, no sign, no
    leading zero, from 1 to 2^63−1."""
    if not _VALUE.fullmatch(num):
        raise InvalidError(
            "token", f"value {_quote(num)} is not a decimal integer from 1 to {MAX_TOKEN} without sign or leading zeros"
        )
    v = int(num)
    if v > MAX_TOKEN:
        raise InvalidError("token", f"value {_quote(num)} is above the maximum {MAX_TOKEN}")
    return v


def _key_id(s: str) -> str:
    if not _KEY_ID.fullmatch(s):
        raise InvalidError("token", f"key ID {_quote(s)} is not 1 to {_MAX_KEY_ID_LEN} of a-z, 0-9 and '-'")
    return s


def _signature(s: str) -> bytes:
    # 64 bytes are 86 characters of unpadded base64url; the last one carries
    # 2 bits of padding, which must be zero (as Go's strict decoder wants):
    # encoding the bytes again must give the same text.
    try:
        if not _SIG.fullmatch(s):
            raise ValueError
        raw = base64.urlsafe_b64decode(s + "==")
        if len(raw) != 64 or base64.urlsafe_b64encode(raw).rstrip(b"=").decode() != s:
            raise ValueError
    except (ValueError, binascii.Error):
        raise InvalidError("token", f"signature {_quote(s)} is not 64 bytes in unpadded base64url") from None
    return raw


def check(scope: str, highest: int, highest_seq: int, presented: int, seq: int = 0, strict: bool = False) -> Optional[StaleError]:
    """check applies the stale rule (docs/protocol.md, "Comparing tokens") to
    a scope's highest accepted token and sequence: it returns a StaleError if
    the write (presented, seq) is older, else None. An equal token is
    accepted unless it carries a sequence below the highest (or equal to it,
    when strict). A seq of 0 is none."""
    stale = presented < highest
    if presented == highest and seq != 0:
        stale = seq < highest_seq or (strict and seq == highest_seq)
    if stale:
        return StaleError(scope, presented, highest, seq, highest_seq)
    return None
