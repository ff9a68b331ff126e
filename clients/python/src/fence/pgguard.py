"""Fenced writes to PostgreSQL through fence's guard inside the database:
the function fence_advance(scope, token, seq) that `fencectl guard install
postgres://...` puts there (docs/protocol.md, "Guards inside the
database"). It keeps its marks in sqlguard's table fence_tokens, so Go,
TypeScript and Python writers of a scope share one mark.

Works with psycopg2 (Debian's python3-psycopg2), which this module does
not import: it takes a connection (or, for pg_advance, a cursor) that has
psycopg2's shape.
"""

from __future__ import annotations

import re
import threading
from typing import TYPE_CHECKING, Any, Callable, List, Optional, Sequence, Tuple, TypeVar

from .errors import FenceError, InvalidError, StaleError
from .token import MAX_TOKEN
from ._presented import Presented, check_seq, on_cursor, presented_token, stale_from_fields

if TYPE_CHECKING:
    from .client import Lease, Reporter

__all__ = ["pg_advance", "pg_fenced", "PgMarks"]

T = TypeVar("T")

# A PostgreSQL identifier fence's installer names: letters, digits,
# underscores, at most 63 bytes, not starting with a digit.
_SCHEMA = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")


def _function(schema: Optional[str]) -> str:
    if schema is None:
        return "fence_advance"
    if not isinstance(schema, str) or not _SCHEMA.fullmatch(schema):
        raise InvalidError(
            "schema",
            f"{schema!r} is not a schema name fence's installer makes "
            "(letters, digits and underscores, at most 63, not starting with a digit)",
        )
    return f'"{schema}".fence_advance'


def pg_advance(
    cur: Any,
    presented: Presented,
    seq: int = 0,
    schema: Optional[str] = None,
    reporter: Optional["Reporter"] = None,
    guard: str = "postgresql",
) -> None:
    """pg_advance checks a write against its scope's mark and advances the
    mark, inside the transaction open on cur (a psycopg2 cursor, or a
    connection): call it first, then write, then commit. The mark's row
    stays locked until the transaction ends, so the writers of a scope take
    turns. A stale token raises a StaleError, marks a Lease lost and reports
    the rejection to fenced (to reporter, or the lease's client, naming
    guard); the transaction is then aborted: roll it back. seq (1 to
    2^63−1) orders the writes of one token; 0 is none.

    schema names the schema `fencectl guard install` put the function in
    (docs/protocol.md installs into "fence"): the call is then qualified, so
    a function of the same name earlier in the connection's search_path
    cannot answer it. Without it the call is unqualified and found through
    the search_path: safe only if no role the guard does not trust may
    create in a schema on it. A schema that is not an identifier raises an
    InvalidError before any query.
    """
    token, lease = presented_token(presented)
    fn = _function(schema)
    seq = check_seq(seq)
    on_cursor(cur, lambda c: _advance(c, fn, token.scope, token.value, seq, lease, reporter, guard))


def _advance(cur: Any, fn: str, scope: str, value: int, seq: int, lease, reporter, guard: str) -> None:
    try:
        cur.execute(f"SELECT {fn}(%s::text, %s::bigint, %s::bigint)", (scope, value, seq))
    except Exception as err:
        raise _pg_error(err, lease, reporter, guard) from err


def pg_fenced(
    conn: Any,
    presented: Presented,
    fn: Callable[[Any], T],
    seq: int = 0,
    schema: Optional[str] = None,
    reporter: Optional["Reporter"] = None,
    guard: str = "postgresql",
) -> T:
    """pg_fenced runs fn(cursor) in a transaction on conn (a psycopg2
    connection with no transaction open) that begins with pg_advance, and
    commits it if fn returns; it rolls back and raises if either fails,
    returning fn's result otherwise. A stale answer from fn's statements too
    (a fence_row_token trigger) becomes a StaleError. seq, schema, reporter
    and guard are pg_advance's."""
    token, lease = presented_token(presented)
    func = _function(schema)  # a bad schema fails before BEGIN
    seq = check_seq(seq)
    status = getattr(getattr(conn, "info", None), "transaction_status", 0)
    if status != 0:  # psycopg2.extensions.TRANSACTION_STATUS_IDLE
        raise FenceError(
            "pg_fenced needs a connection with no transaction open: its check must be the "
            "transaction's first statement (call pg_advance first in a transaction of your own instead)"
        )
    autocommit = bool(getattr(conn, "autocommit", False))
    cur = conn.cursor()
    try:
        if autocommit:
            cur.execute("BEGIN")
        # Without autocommit, psycopg2 begins the transaction itself.
        _advance(cur, func, token.scope, token.value, seq, lease, reporter, guard)
        try:
            out = fn(cur)
        except Exception as err:
            raise _pg_error(err, lease, reporter, guard) from err
        if autocommit:
            cur.execute("COMMIT")
        else:
            conn.commit()
        return out
    except BaseException:
        # The error that matters is the first; a failed rollback adds nothing
        # the caller can act on (the connection is broken, and the server
        # rolls back anyway).
        try:
            if autocommit:
                cur.execute("ROLLBACK")
            else:
                conn.rollback()
        except Exception:
            pass
        raise
    finally:
        try:
            cur.close()
        except Exception:
            pass


def _pg_error(err: BaseException, lease, reporter, guard: str) -> BaseException:
    """_pg_error turns the guard's SQLSTATEs into this package's errors:
    FN409 (stale, with DETAIL "scope=S presented_token=T highest_token=H
    ...") and FN400 (a malformed argument). Other errors pass unchanged."""
    if isinstance(err, FenceError):
        return err
    code = getattr(err, "pgcode", None)
    diag = getattr(err, "diag", None)
    if code == "FN400":
        msg = getattr(diag, "message_primary", None) or str(err).strip()
        return InvalidError("token", msg)
    if code != "FN409":
        return err
    detail = getattr(diag, "message_detail", None) or ""
    if "presented_token=" not in detail:
        detail = str(err)
    stale: StaleError = stale_from_fields(detail, lease, reporter, guard)
    return stale


class PgMarks:
    """PgMarks is the marks of fence's guard inside PostgreSQL, for a
    Follower: advance(scope, token) is `SELECT fence_advance(scope, token)`
    in a transaction of its own, the check-and-advance writers call, so a
    mark never moves back; a mark already past the token (FN409) is left
    as it is and answers False.

    connect is a connection string (psycopg2.connect's; psycopg2 is then
    imported) or a function returning a new psycopg2 connection. PgMarks
    keeps one connection, made on first use, and makes a new one after a
    failure that broke it (a restarted server, a terminated backend), so a
    follower's retries find the server once it is back. schema is where
    `fencectl guard install` put the function and its table fence_tokens,
    as in pg_advance. Safe to use from several threads: calls take turns
    on the connection.
    """

    def __init__(self, connect: Any, schema: Optional[str] = None):
        self._fn = _function(schema)
        self._table = "fence_tokens" if schema is None else f'"{schema}".fence_tokens'
        if isinstance(connect, str):
            dsn = connect

            def from_dsn() -> Any:
                import psycopg2

                return psycopg2.connect(dsn)

            connect = from_dsn
        self._connect: Callable[[], Any] = connect
        self._conn: Any = None
        self._lock = threading.Lock()

    def _run(self, fn: Callable[[Any], T]) -> T:
        with self._lock:
            return self._run_locked(fn)

    def _run_locked(self, fn: Callable[[Any], T]) -> T:
        if self._conn is None or getattr(self._conn, "closed", 0):
            self._conn = self._connect()
        conn = self._conn
        try:
            with conn.cursor() as cur:
                out = fn(cur)
            conn.commit()
            return out
        except BaseException:
            try:
                conn.rollback()
            except Exception:
                pass
            if getattr(conn, "closed", 0):
                self._conn = None  # broken: a new one next time
            raise

    def advance(self, scope: str, token: int) -> bool:
        """advance moves scope's mark to token unless it is past it: True
        if the mark is now token, False if it was past it."""
        def run(cur: Any) -> bool:
            try:
                cur.execute(f"SELECT {self._fn}(%s::text, %s::bigint, 0::bigint)", (scope, int(token)))
            except Exception as err:
                if getattr(err, "pgcode", None) == "FN409":
                    return False
                if getattr(err, "pgcode", None) == "FN400":
                    raise InvalidError("token", f"advance {scope!r} to {token}: {err}") from err
                raise
            return True

        return self._run(run)

    def advance_many(self, marks: Sequence[Tuple[str, int]]) -> List[bool]:
        """advance_many advances each (scope, token) of marks, distinct
        scopes, as advance does, in one statement and one transaction, so a
        follower's batch costs one round trip and one commit: the answers in
        order. The scopes whose mark is past their token are left out of
        the statement, so that none of them aborts it; a writer that moves
        one past between that read and the advance does abort it (FN409),
        and then each goes in a transaction of its own."""
        if not marks:
            return []
        if len({s for s, _ in marks}) != len(marks):
            raise InvalidError("marks", "advance_many takes each scope once")
        for s, t in marks:
            if not 1 <= int(t) <= MAX_TOKEN:
                raise InvalidError("token", f"advance {s!r} to {t!r}: a token is from 1 to 2^63-1")
        scopes = [s for s, _ in marks]
        tokens = [int(t) for _, t in marks]

        def run(cur: Any) -> List[bool]:
            # In the order given, one scope's row lock at a time, with the
            # writers' check: a scope whose mark is past is not called.
            cur.execute(
                f"SELECT m.s, {self._fn}(m.s, m.t, 0::bigint) FROM unnest(%s::text[], %s::bigint[]) AS m(s, t) "
                f"WHERE NOT EXISTS (SELECT 1 FROM {self._table} f WHERE f.scope = m.s AND f.token > m.t)",
                (scopes, tokens),
            )
            done = {r[0] for r in cur.fetchall()}
            return [s in done for s in scopes]

        try:
            return self._run(run)
        except Exception as err:
            if getattr(err, "pgcode", None) == "FN400":
                raise InvalidError("token", f"advance {len(marks)} marks: {err}") from err
            if getattr(err, "pgcode", None) != "FN409":
                raise
        return [self.advance(s, t) for s, t in zip(scopes, tokens)]

    def scopes(self, prefix: str) -> List[str]:
        """scopes lists the scopes under prefix that have a mark."""
        def run(cur: Any) -> List[str]:
            cur.execute(f"SELECT scope FROM {self._table} WHERE left(scope, char_length(%s)) = %s", (prefix, prefix))
            return [r[0] for r in cur.fetchall()]

        return self._run(run)

    def close(self) -> None:
        """close closes the connection PgMarks made."""
        with self._lock:
            if self._conn is not None:
                try:
                    self._conn.close()
                finally:
                    self._conn = None
