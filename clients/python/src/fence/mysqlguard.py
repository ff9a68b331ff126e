"""Fenced writes to MySQL and MariaDB through fence's guard inside the
database: the procedure fence_advance(scope, token, seq) that `fencectl
guard install mysql://...` puts there (docs/protocol.md, "Guards inside
the database"). It keeps its marks in sqlguard's table fence_tokens, so
Go, TypeScript and Python writers of a scope share one mark.

Works with PyMySQL (Debian's python3-pymysql), which this module does not
import: it takes a connection (or, for mysql_advance, a cursor) that has
PyMySQL's shape.

MySQL does not roll a transaction back when a statement fails: a stale
answer leaves the transaction open, and the caller must roll it back and
write nothing more. mysql_fenced does.
"""

from __future__ import annotations

import re
import threading
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Tuple, TypeVar, Union

from .errors import FenceError, InvalidError, StaleError
from .token import MAX_TOKEN, validate_scope
from ._presented import Presented, check_seq, on_cursor, presented_token, stale_from_fields

if TYPE_CHECKING:
    from .client import Reporter

__all__ = ["mysql_advance", "mysql_fenced", "MySQLMarks"]

T = TypeVar("T")

# The error number of every SIGNAL: the guard's SQLSTATEs (FN409, FN400)
# are told apart by their messages, which PyMySQL passes on without the
# SQLSTATE.
_ER_SIGNAL_EXCEPTION = 1644
# A database name fence's installer can be pointed at, as a plain
# identifier: letters, digits, "_" and "$", at most 64.
_DATABASE = re.compile(r"[A-Za-z0-9_$]{1,64}")
# PyMySQL's SERVER_STATUS_IN_TRANS flag of the connection's server_status.
_IN_TRANS = 1


def _procedure(database: Optional[str]) -> str:
    if database is None:
        return "fence_advance"
    if not isinstance(database, str) or not _DATABASE.fullmatch(database):
        raise InvalidError(
            "database",
            f"{database!r} is not a database name this guard takes (letters, digits, '_' and '$', at most 64)",
        )
    return f"`{database}`.fence_advance"


def mysql_advance(
    cur: Any,
    presented: Presented,
    seq: int = 0,
    database: Optional[str] = None,
    reporter: Optional["Reporter"] = None,
    guard: str = "mysql",
) -> None:
    """mysql_advance checks a write against its scope's mark and advances
    the mark, inside the transaction open on cur (a PyMySQL cursor, or a
    connection): START TRANSACTION, call it, write, COMMIT. The mark's row
    stays locked until the transaction ends, so the writers of a scope take
    turns. A stale token raises a StaleError, marks a Lease lost and reports
    the rejection to fenced (to reporter, or the lease's client, naming
    guard); the transaction stays open, as MySQL leaves it: roll it back and
    write nothing more. seq (1 to 2^63−1) orders the writes of one token; 0
    is none.

    database names the database `fencectl guard install` put the procedure
    in, to call it there whatever the connection's current database;
    without it the connection's current database is used. A database name
    that is not a plain identifier raises an InvalidError before any query.
    """
    token, lease = presented_token(presented)
    proc = _procedure(database)
    seq = check_seq(seq)
    on_cursor(cur, lambda c: _advance(c, proc, token.scope, token.value, seq, lease, reporter, guard))


def _advance(cur: Any, proc: str, scope: str, value: int, seq: int, lease, reporter, guard: str) -> None:
    try:
        cur.execute(f"CALL {proc}(%s, %s, %s)", (scope, value, seq))
    except Exception as err:
        raise _mysql_error(err, scope, lease, reporter, guard) from err


def mysql_fenced(
    conn: Any,
    presented: Presented,
    fn: Callable[[Any], T],
    seq: int = 0,
    database: Optional[str] = None,
    reporter: Optional["Reporter"] = None,
    guard: str = "mysql",
) -> T:
    """mysql_fenced runs fn(cursor) in a transaction on conn (a PyMySQL
    connection with no transaction open) that begins with mysql_advance,
    and commits it if fn returns; it rolls back and raises if either
    fails, returning fn's result otherwise. A stale answer from fn's
    statements too (the fence_row_* triggers) becomes a StaleError. seq,
    database, reporter and guard are mysql_advance's."""
    token, lease = presented_token(presented)
    proc = _procedure(database)  # a bad name fails before the transaction
    seq = check_seq(seq)
    if getattr(conn, "server_status", 0) & _IN_TRANS:
        # START TRANSACTION would commit it silently.
        raise FenceError(
            "mysql_fenced needs a connection with no transaction open: its check must be the "
            "transaction's first statement (call mysql_advance first in a transaction of your own instead)"
        )
    cur = conn.cursor()
    try:
        cur.execute("START TRANSACTION")
        _advance(cur, proc, token.scope, token.value, seq, lease, reporter, guard)
        try:
            out = fn(cur)
        except Exception as err:
            raise _mysql_error(err, token.scope, lease, reporter, guard) from err
        conn.commit()
        return out
    except BaseException:
        # The error that matters is the first; a failed rollback adds nothing
        # the caller can act on (the connection is broken, and the server
        # rolls back when it goes).
        try:
            conn.rollback()
        except Exception:
            pass
        raise
    finally:
        try:
            cur.close()
        except Exception:
            pass


def _mysql_error(err: BaseException, scope: str, lease, reporter, guard: str) -> BaseException:
    """_mysql_error turns the guard's signals into this package's errors:
    "stale fencing token: presented_token=T highest_token=H presented_seq=Q
    highest_seq=R scope=S" (FN409) and the "fence_...: " messages (FN400).
    Other errors pass unchanged."""
    if isinstance(err, FenceError):
        return err
    args = getattr(err, "args", ())
    if len(args) < 2 or args[0] != _ER_SIGNAL_EXCEPTION or not isinstance(args[1], str):
        return err
    msg = args[1]
    if msg.startswith("fence_"):
        return InvalidError("token", msg)
    if not msg.startswith("stale fencing token: "):
        return err
    # MySQL keeps 128 characters of a message, the scope last: a scope cut
    # short is the written scope's start.
    head, sep, named = msg.partition(" scope=")
    if sep and len(msg) >= 128 and named != scope and scope.startswith(named):
        msg = head + sep + scope
    stale: StaleError = stale_from_fields(msg, lease, reporter, guard)
    return stale


class MySQLMarks:
    """MySQLMarks is the marks of fence's guard inside MySQL or MariaDB, for
    a Follower: advance(scope, token) is `CALL fence_advance(scope, token,
    0)` in a transaction of its own, the check-and-advance writers call, so
    a mark never moves back; a mark already past the token is left as it
    is and answers False. advance_many calls it for many scopes in one
    transaction: MySQL fails only the statement that found a mark past,
    so the others go on, and one commit records them all.

    connect is a dict of pymysql.connect's keyword arguments (PyMySQL is
    then imported) or a function returning a new PyMySQL connection.
    MySQLMarks keeps one connection, made on first use, and makes a new one
    after a failure that broke it (a restarted server, a killed session),
    so a follower's retries find the server once it is back. database is
    as for mysql_advance; scopes() reads the table fence_tokens there (or
    in the connection's current database). Safe to use from several
    threads: calls take turns on the connection.
    """

    def __init__(self, connect: Union[Dict[str, Any], Callable[[], Any]], database: Optional[str] = None):
        self._proc = _procedure(database)
        self._table = "fence_tokens" if database is None else f"`{database}`.fence_tokens"
        if isinstance(connect, dict):
            kwargs = dict(connect)

            def from_kwargs() -> Any:
                import pymysql

                return pymysql.connect(**kwargs)

            connect = from_kwargs
        self._connect: Callable[[], Any] = connect
        self._conn: Any = None
        self._lock = threading.Lock()

    def _run(self, fn: Callable[[Any], T]) -> T:
        with self._lock:
            if self._conn is None or not getattr(self._conn, "open", True):
                self._conn = self._connect()
            conn = self._conn
            try:
                with conn.cursor() as cur:
                    cur.execute("START TRANSACTION")
                    out = fn(cur)
                conn.commit()
                return out
            except BaseException:
                try:
                    conn.rollback()
                except Exception:
                    pass
                if not getattr(conn, "open", True):
                    self._conn = None  # broken: a new one next time
                raise

    def _call(self, cur: Any, scope: str, token: int) -> bool:
        try:
            cur.execute(f"CALL {self._proc}(%s, %s, 0)", (scope, token))
        except Exception as err:
            e = _mysql_error(err, scope, None, None, "mysql")
            if isinstance(e, StaleError):
                return False  # the mark is past the token, and stays
            if isinstance(e, InvalidError):
                raise InvalidError("token", f"advance {scope!r} to {token}: {e}") from err
            raise
        return True

    def advance(self, scope: str, token: int) -> bool:
        """advance moves scope's mark to token unless it is past it: True
        if the mark is now token, False if it was past it."""
        return self.advance_many([(scope, token)])[0]

    def advance_many(self, marks: Sequence[Tuple[str, int]]) -> List[bool]:
        """advance_many advances each (scope, token) of marks as advance
        does, in one transaction and one commit: the answers in order. Bad
        input (a scope that is not one, a token outside 1 to 2^63-1) raises
        an InvalidError before anything is sent."""
        checked = []
        for s, t in marks:
            validate_scope(s)
            if not isinstance(t, int) or not 1 <= t <= MAX_TOKEN:
                raise InvalidError("token", f"advance {s!r} to {t!r}: a token is an int from 1 to 2^63-1")
            checked.append((s, t))
        if not checked:
            return []
        return self._run(lambda cur: [self._call(cur, s, t) for s, t in checked])

    def scopes(self, prefix: str) -> List[str]:
        """scopes lists the scopes under prefix that have a mark."""
        def run(cur: Any) -> List[str]:
            p = prefix.encode()
            cur.execute(f"SELECT scope FROM {self._table} WHERE LEFT(scope, %s) = %s", (len(p), p))
            return [r[0].decode() if isinstance(r[0], (bytes, bytearray)) else r[0] for r in cur.fetchall()]

        return self._run(run)

    def close(self) -> None:
        """close closes the connection MySQLMarks made."""
        with self._lock:
            if self._conn is not None:
                try:
                    self._conn.close()
                finally:
                    self._conn = None
