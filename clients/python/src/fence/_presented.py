"""What the database guards share: the token a write presents, the cursor
an advance runs on, and the stale answers of the guards inside PostgreSQL and Redis, which both list
"key=value" fields."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Callable, Optional, Tuple, Union

from .errors import InvalidError, StaleError
from .token import Token, parse_token

if TYPE_CHECKING:
    from .client import Lease, Reporter

#: What a write presents: a Lease (its newest token text; marked lost on a
#: stale answer, which its client reports), a Token, or a token's text.
Presented = Union["Lease", Token, str]

_FIELD = re.compile(r"([a-z_]+)=(\S*)")
_NUM = re.compile(r"[0-9]{1,20}")


def presented_token(p: Presented) -> Tuple[Token, Optional["Lease"]]:
    """presented_token returns p's token, and p if it is a Lease. It raises
    the LostError of a lost Lease, which must not write."""
    from .client import Lease

    if isinstance(p, str):
        return parse_token(p), None
    if isinstance(p, Lease):
        p.raise_if_lost()
        return parse_token(p.token_text), p
    if isinstance(p, Token):
        return p, None
    raise TypeError(f"a fenced write presents a Lease, a Token or a token's text, not {type(p).__name__}")


def on_cursor(cur: Any, f: Callable[[Any], None]) -> None:
    """on_cursor calls f with cur, a DB-API cursor, or, if cur is a
    connection, with a cursor of it that is closed afterwards: the
    advances take either."""
    if hasattr(cur, "cursor") and not hasattr(cur, "execute"):
        with cur.cursor() as c:
            f(c)
    else:
        f(cur)


_MAX_SEQ = (1 << 63) - 1


def check_seq(seq: int) -> int:
    """check_seq returns seq, a write's sequence number for the guards
    inside the databases, or raises an InvalidError naming what is allowed."""
    if not isinstance(seq, int) or seq < 0 or seq > _MAX_SEQ:
        raise InvalidError("seq", f"sequence {seq!r} is not an int from 0 (none) to 2^63-1")
    return seq


def stale_from_fields(text: str, lease: Optional["Lease"], reporter: Optional["Reporter"], guard: str) -> StaleError:
    """stale_from_fields reads "scope=S presented_token=T highest_token=H
    presented_seq=Q highest_seq=R" (the sequences may be absent) into a
    StaleError. It marks lease lost when a newer token was accepted, which
    proves a newer grant (a sequence refused under the same token only says
    that a later write of this holder came first), and reports the
    rejection: to reporter, or else to the lease's client."""
    f = dict(_FIELD.findall(text))  # a scope has no spaces or '='

    def num(k: str) -> int:
        v = f.get(k, "")
        return int(v) if _NUM.fullmatch(v) else 0

    stale = StaleError(
        f.get("scope", ""), num("presented_token"), num("highest_token"), num("presented_seq"), num("highest_seq")
    )
    if lease is not None and stale.highest > stale.presented:
        lease.mark_lost(stale)
    if reporter is not None:
        reporter.rejected(stale)
    elif lease is not None:
        lease._client._report_stale(guard, stale)
    return stale
