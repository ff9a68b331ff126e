"""Fenced writes to Redis through fence's guard inside Redis: the Redis 7
function library that `fencectl guard install redis://...` loads
(guard/redisguard/fence.lua), called with FCALL. Its marks are where Go's
redisguard keeps them, so Go, TypeScript and Python writers of a scope
share one mark.

Works with redis-py (Debian's python3-redis), which this module does not
import: it takes anything with redis-py's execute_command.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple

from .errors import FenceError, InvalidError, StaleError
from ._presented import Presented, presented_token, stale_from_fields
from .token import MAX_TOKEN, validate_scope

if TYPE_CHECKING:
    from .client import Reporter

__all__ = ["mark_key", "data_key", "redis_set", "redis_del", "redis_hset", "redis_incrby", "RedisMarks"]

_MAX_SEQ = (1 << 64) - 1


def mark_key(scope: str) -> str:
    """mark_key is the key of a scope's mark: "fence:{SCOPE}", as Go's
    redisguard keeps it, and the only form the library accepts as its first
    key."""
    return f"fence:{{{scope}}}"


def data_key(scope: str, name: str) -> str:
    """data_key names a key of scope's data: "{SCOPE}:name". The guard
    writes only keys tagged with the scope they are fenced by (and in a
    Redis Cluster the tag keeps them in the mark's slot)."""
    return f"{{{scope}}}:{name}"


def redis_set(
    r: Any, presented: Presented, key: str, value: Any, *options: Any, seq: int = 0,
    reporter: Optional["Reporter"] = None, guard: str = "redis",
) -> Any:
    """redis_set is SET key value [options...] if the token is current for
    its scope, and advances the mark in the same function call; it returns
    SET's reply. key must be a data_key of the token's scope. A stale token
    raises a StaleError (marking a Lease lost and reporting the rejection,
    as pg_advance does) and changes nothing. seq (1 to 2^64−1) orders the
    writes of one token; 0 is none."""
    return _fcall(r, "fence_set", presented, [key], [value, *options], seq, reporter, guard)


def redis_del(r: Any, presented: Presented, keys: Sequence[str], seq: int = 0,
              reporter: Optional["Reporter"] = None, guard: str = "redis") -> Any:
    """redis_del is DEL keys... if the token is current; see redis_set."""
    return _fcall(r, "fence_del", presented, list(keys), [], seq, reporter, guard)


def redis_hset(r: Any, presented: Presented, key: str, values: Dict[str, Any], seq: int = 0,
               reporter: Optional["Reporter"] = None, guard: str = "redis") -> Any:
    """redis_hset is HSET key field value [field value ...] if the token is
    current; see redis_set."""
    flat: List[Any] = []
    for k, v in values.items():
        flat += [k, v]
    return _fcall(r, "fence_hset", presented, [key], flat, seq, reporter, guard)


def redis_incrby(r: Any, presented: Presented, key: str, increment: int, seq: int = 0,
                 reporter: Optional["Reporter"] = None, guard: str = "redis") -> Any:
    """redis_incrby is INCRBY key increment if the token is current; see
    redis_set. It returns the new value."""
    return _fcall(r, "fence_incrby", presented, [key], [str(int(increment))], seq, reporter, guard)


def _fcall(r: Any, fn: str, presented: Presented, keys: List[str], args: List[Any], seq: int,
           reporter: Optional["Reporter"], guard: str) -> Any:
    token, lease = presented_token(presented)
    if not isinstance(seq, int) or seq < 0 or seq > _MAX_SEQ:
        raise InvalidError("seq", f"sequence {seq!r} is not an int from 0 (none) to 2^64-1")
    cmd = [fn, str(len(keys) + 1), mark_key(token.scope), *keys, str(token.value), str(seq), *args]
    try:
        return r.execute_command("FCALL", *cmd)
    except Exception as err:
        raise _redis_error(err, lease, reporter, guard) from err


def _redis_error(err: BaseException, lease, reporter, guard: str) -> BaseException:
    """_redis_error turns the library's error replies into this package's
    errors: "STALE scope=S presented_token=T highest_token=H presented_seq=Q
    highest_seq=R" and "ERR fence: ..." (bad arguments; redis-py drops the
    "ERR "). Other errors pass unchanged."""
    if isinstance(err, FenceError):
        return err
    msg = str(err)
    if msg.startswith("ERR fence: ") or msg.startswith("fence: "):
        return InvalidError("", msg if msg.startswith("ERR ") else "ERR " + msg)
    if not msg.startswith("STALE "):
        return err
    return stale_from_fields(msg, lease, reporter, guard)


class RedisMarks:
    """RedisMarks is the marks of fence's guard inside Redis (the hash
    "fence:{SCOPE}", fields token and seq, that fence_set and the others
    check), for a Follower: advance(scope, token) is the library's FCALL
    fence_advance, the writers' own check and advance without a write, so a
    mark never moves back; a mark already past the token is left as it is
    and answers False. r is a redis-py client (anything with
    execute_command), which reconnects by itself after a failure. The
    library must have fence_advance: run `fencectl guard install` again on
    a Redis that loaded it before fence_advance existed."""

    def __init__(self, r: Any):
        self._r = r

    def advance(self, scope: str, token: int) -> bool:
        """advance moves scope's mark to token unless it is past it: True
        if the mark is now token, False if it was past it."""
        validate_scope(scope)
        t = int(token)
        if not 1 <= t <= MAX_TOKEN:
            raise InvalidError("token", f"token {token!r} is not from 1 to 2^63-1")
        try:
            self._r.execute_command("FCALL", "fence_advance", 1, mark_key(scope), str(t), "0")
        except Exception as err:
            e = _redis_error(err, None, None, "redis")
            if isinstance(e, StaleError):
                return False  # the mark is past the token, and stays
            raise e from err
        return True

    def advance_many(self, marks: Sequence[Tuple[str, int]]) -> List[bool]:
        """advance_many advances each (scope, token) of marks as advance
        does, in one pipeline (one round trip, not a transaction: each
        FCALL is the writers' check on its own): the answers in order. It
        raises the first failure other than a mark past its token; the
        advances that did go through stay, and doing them again changes
        nothing. A client without pipeline() advances one at a time."""
        for s, t in marks:
            validate_scope(s)
            if not 1 <= int(t) <= MAX_TOKEN:
                raise InvalidError("token", f"advance {s!r} to {t!r}: a token is from 1 to 2^63-1")
        if not marks:
            return []
        if not callable(getattr(self._r, "pipeline", None)):
            return [self.advance(s, t) for s, t in marks]
        pipe = self._r.pipeline(transaction=False)
        for s, t in marks:
            pipe.execute_command("FCALL", "fence_advance", 1, mark_key(s), str(int(t)), "0")
        out: List[bool] = []
        for r in pipe.execute(raise_on_error=False):
            if isinstance(r, BaseException):
                e = _redis_error(r, None, None, "redis")
                if not isinstance(e, StaleError):
                    raise e from r
                out.append(False)  # the mark is past the token, and stays
            else:
                out.append(True)
        return out

    def scopes(self, prefix: str) -> List[str]:
        """scopes lists the scopes under prefix that have a mark (SCAN)."""
        out: List[str] = []
        cursor: Any = "0"
        # A scope has none of the glob's special characters (*?[]\).
        pattern = f"fence:{{{prefix}*}}"
        while True:
            cursor, keys = self._r.execute_command("SCAN", cursor, "MATCH", pattern, "COUNT", 1000)
            for k in keys:
                k = k.decode() if isinstance(k, bytes) else k
                if k.startswith("fence:{") and k.endswith("}"):
                    out.append(k[len("fence:{"):-1])
            if str(cursor.decode() if isinstance(cursor, bytes) else cursor) == "0":
                return out
