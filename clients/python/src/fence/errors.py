"""The errors of the client, the token parser and the guards.

Catch them by class: every one is a FenceError, and each carries the
message the service (or the guard) gave. They match the TypeScript
client's classes and Go's sentinel errors.
"""

from __future__ import annotations

from typing import Optional

__all__ = [
    "FenceError",
    "InvalidError",
    "HeldError",
    "LostError",
    "NotHolderError",
    "UnavailableError",
    "WaitTimeoutError",
    "MissedEventsError",
    "StaleError",
    "MissingCryptographyError",
]


class FenceError(Exception):
    """FenceError is the base class of every error this package raises.

    code is the Connect code fenced answered ("aborted", "not_found"), when
    the error came from it, else None.
    """

    def __init__(self, message: str, code: Optional[str] = None):
        super().__init__(message)
        self.message = message
        self.code = code

    def __str__(self) -> str:
        return self.message


class InvalidError(FenceError):
    """InvalidError reports a malformed request or token: a bad scope, TTL,
    holder, lease ID or token text, or a token whose signature does not
    verify. Nothing was changed. field names what was wrong ("scope",
    "ttl", "token"; "" when unknown)."""

    def __init__(self, field: str, message: str, code: str = "invalid_argument"):
        super().__init__(message, code)
        self.field = field


class HeldError(FenceError):
    """HeldError reports that an acquire found the scope held by another
    lease: its holder, its token and its time left in seconds, as the
    service saw it."""

    def __init__(self, message: str, scope: str, holder: str, token: int, expires_in: float):
        super().__init__(message, "aborted")
        self.scope = scope
        self.holder = holder
        self.token = token
        self.expires_in = expires_in


class LostError(FenceError):
    """LostError reports that a lease is no longer current: it expired, was
    released or superseded, no renewal was confirmed within its validity,
    or a guard refused its token as stale. Its holder must stop acting on
    it. current is the scope's current token when known (0 if free or
    unknown); reason says why in a few words."""

    def __init__(
        self,
        message: str,
        scope: str,
        token: int,
        reason: str,
        current: int = 0,
        code: Optional[str] = None,
    ):
        super().__init__(message, code)
        self.scope = scope
        self.token = token
        self.reason = reason
        self.current = current


class NotHolderError(FenceError):
    """NotHolderError reports a renew or release with a lease ID the service
    does not know for that scope (not_found): to a holder, its lease is
    lost."""


class UnavailableError(FenceError):
    """UnavailableError reports that the service could not be reached,
    answered something that is not its API, or has no leader right now.
    The request may or may not have been applied."""


class WaitTimeoutError(FenceError, TimeoutError):
    """WaitTimeoutError reports an acquire whose timeout passed first
    (deadline_exceeded), typically a wait in line that was not granted in
    time. The caller holds nothing."""


class MissedEventsError(FenceError):
    """MissedEventsError reports a watch that cannot resume where it was
    (out_of_range): the service no longer holds the events from its start
    position on (it keeps the most recent ten thousand, and a new leader, or
    a restarted fenced, starts afresh). Read the state again (Client.list,
    Client.get, or a watch with include_held) and watch from 0."""


class StaleError(FenceError):
    """StaleError reports a write refused because its scope already
    accepted a newer one. The lease that wrote is lost; retrying with the
    same token can never succeed. Tokens and sequences are exact ints."""

    def __init__(self, scope: str, presented: int, highest: int, presented_seq: int = 0, highest_seq: int = 0):
        # The same words as Go's guard.StaleError.
        if presented == highest:
            msg = (
                f'stale write to "{scope}": token {presented} sequence {presented_seq} '
                f"is not after sequence {highest_seq}"
            )
        else:
            msg = f'stale fencing token for "{scope}": token {presented} was superseded by token {highest}'
        super().__init__(msg)
        self.scope = scope
        self.presented = presented
        self.highest = highest
        self.presented_seq = presented_seq
        self.highest_seq = highest_seq


class MissingCryptographyError(FenceError, ImportError):
    """MissingCryptographyError reports that verifying a token's signature
    needs the cryptography package, which is not installed. Leases, token
    parsing and the database guards work without it."""

    def __init__(self, cause: BaseException):
        super().__init__(
            "verifying fence token signatures needs the cryptography package (Ed25519), "
            f"which cannot be imported ({cause}): install it with "
            "apt-get install python3-cryptography (Debian, Ubuntu) or pip install cryptography"
        )
