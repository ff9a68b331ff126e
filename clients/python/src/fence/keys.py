"""Verifying signed tokens with fenced's public keys (docs/protocol.md,
"Signatures"): Ed25519 through the cryptography package, keys in the
GET /keys form.

cryptography is optional: the lease, token parsing and the database guards
work without it. Making a KeySet or RemoteKeySet without it raises a
MissingCryptographyError that says how to install it.
"""

from __future__ import annotations

import base64
import binascii
import json
import threading
import time
import urllib.error
import urllib.request
from datetime import datetime, timezone
from typing import Any, Dict, Optional, Tuple

from .errors import FenceError, InvalidError, MissingCryptographyError, UnavailableError
from .token import Token, format_token, signed_payload

__all__ = ["KeySet", "RemoteKeySet", "have_cryptography"]


def _ed25519():
    try:
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    except ImportError as err:
        raise MissingCryptographyError(err) from err
    return Ed25519PublicKey, InvalidSignature


def have_cryptography() -> bool:
    """have_cryptography reports whether signatures can be verified here."""
    try:
        _ed25519()
    except MissingCryptographyError:
        return False
    return True


def _parse_time(s: str) -> float:
    # RFC 3339 in UTC ("2026-12-05T00:00:00Z", perhaps with a fraction).
    t = s.strip()
    if t.endswith("Z") or t.endswith("z"):
        t = t[:-1] + "+00:00"
    if "." in t:
        # fromisoformat (3.9) takes at most 6 fractional digits.
        head, rest = t.split(".", 1)
        i = 0
        while i < len(rest) and rest[i].isdigit():
            i += 1
        t = head + "." + rest[:i][:6].ljust(6, "0") + rest[i:]
    d = datetime.fromisoformat(t)
    if d.tzinfo is None:
        d = d.replace(tzinfo=timezone.utc)
    return d.timestamp()


class KeySet:
    """KeySet is a fixed set of public keys, in the GET /keys form
    ({"keys": [{"kid", "public_key", "not_after"}]}). verify refuses an
    unsigned token, a token whose key ID is not in the set or whose key is
    past its not_after, and a token whose signature does not verify. Safe
    to share between threads. now gives the wall clock (for tests)."""

    def __init__(self, keys_file: Dict[str, Any], now=time.time):
        public_key, self._invalid_signature = _ed25519()
        self._now = now
        self._keys: Dict[str, Tuple[Any, Optional[float]]] = {}
        for k in keys_file.get("keys") or []:
            kid = k.get("kid", "")
            b64 = k.get("public_key", "")
            try:
                raw = base64.b64decode(b64, validate=True)
            except (binascii.Error, ValueError):
                raw = b""
            if len(raw) != 32 or base64.b64encode(raw).decode() != b64:
                raise FenceError(f"key {kid!r}: public_key is not 32 bytes in standard base64")
            not_after = None
            if k.get("not_after"):
                try:
                    not_after = _parse_time(k["not_after"])
                except ValueError:
                    raise FenceError(f"key {kid!r}: not_after {k['not_after']!r} is not a time") from None
            self._keys[kid] = (public_key.from_public_bytes(raw), not_after)

    def has(self, key_id: str) -> bool:
        """has reports whether the set lists the key ID."""
        return key_id in self._keys

    def verify(self, t: Token) -> None:
        """verify returns if t is genuine and raises an InvalidError if not."""
        if not t.signed or t.key_id is None:
            raise InvalidError("token", f"unsigned token {format_token(t)} refused: this guard requires tokens signed by fenced")
        k = self._keys.get(t.key_id)
        if k is None:
            raise InvalidError("token", f"bad token signature: unknown signing key {t.key_id!r}")
        key, not_after = k
        if not_after is not None and self._now() > not_after:
            when = datetime.fromtimestamp(not_after, timezone.utc).isoformat().replace("+00:00", "Z")
            raise InvalidError("token", f"bad token signature: key {t.key_id!r} was retired at {when}")
        try:
            key.verify(t.signature, signed_payload(t))
        except self._invalid_signature:
            raise InvalidError(
                "token", f"bad token signature: {t.scope} token {t.value} is not signed by key {t.key_id!r}"
            ) from None


class RemoteKeySet:
    """RemoteKeySet verifies with the keys fenced publishes at GET /keys. It
    fetches them on first use, and again when a token names a key ID it does
    not know (a rotation publishes a new key), but at most once per
    refresh_interval seconds (default 30), so unknown key IDs cannot make it
    fetch without bound. Safe to share between threads."""

    def __init__(self, base_url: str, refresh_interval: float = 30.0, bearer: Optional[str] = None, timeout: float = 10.0):
        _ed25519()  # fail early, and clearly, without cryptography
        self._url = base_url.rstrip("/") + "/keys"
        self._interval = refresh_interval
        self._headers = {} if bearer is None else {"Authorization": f"Bearer {bearer}"}
        self._timeout = timeout
        self._lock = threading.Lock()
        self._set: Optional[KeySet] = None
        self._fetched_at = float("-inf")

    def verify(self, t: Token) -> None:
        """verify returns if t is genuine and raises an InvalidError if not
        (an UnavailableError if the keys cannot be fetched)."""
        with self._lock:
            s = self._set
            stale = time.monotonic() - self._fetched_at >= self._interval
            if s is None or (t.key_id is not None and not s.has(t.key_id) and stale):
                s = self._fetch()
        s.verify(t)

    def refresh(self) -> KeySet:
        """refresh fetches the keys now."""
        with self._lock:
            return self._fetch()

    def _fetch(self) -> KeySet:
        self._fetched_at = time.monotonic()
        req = urllib.request.Request(self._url, headers=self._headers)
        try:
            with urllib.request.urlopen(req, timeout=self._timeout) as res:
                body = json.loads(res.read())
        except urllib.error.HTTPError as err:
            raise UnavailableError(f"fetch {self._url}: {err.code} {err.read()[:200]!r}") from err
        except (OSError, ValueError) as err:
            raise UnavailableError(f"fetch {self._url}: {err}") from err
        self._set = KeySet(body)
        return self._set
