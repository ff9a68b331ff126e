"""fence for Python: the client of fenced, the fence lease service, and
fenced writes to PostgreSQL, MySQL (or MariaDB) and Redis through fence's
guards inside them.

    import fence

    client = fence.Client("http://127.0.0.1:7480", holder="worker-3")
    with client.acquire("orders", ttl=10) as lease:
        ...  # write under lease.token_text; stop when lease.lost is set

client.watch(prefix) streams the lease events of a prefix; a Follower
advances the guards' marks in PostgreSQL (PgMarks), MySQL (MySQLMarks) or
Redis (RedisMarks) to every grant's token and every ended lease's closing token, so a late
write of an ended lease is refused before anyone else writes.

The lease and the watch need nothing but the standard library.
Verifying token signatures (KeySet, RemoteKeySet) needs the cryptography
package; the guards take the caller's psycopg2 or PyMySQL connection or
redis-py client. The protocol it implements is docs/protocol.md in fence's
repository.
"""

from .client import MAX_REPORT, Client, HeldLease, Lease, Rejection, Reporter, ScopeState
from .errors import (
    FenceError,
    HeldError,
    InvalidError,
    LostError,
    MissedEventsError,
    MissingCryptographyError,
    NotHolderError,
    StaleError,
    UnavailableError,
    WaitTimeoutError,
)
from .follow import Follower, MarkStore
from .keys import KeySet, RemoteKeySet, have_cryptography
from .mysqlguard import MySQLMarks, mysql_advance, mysql_fenced
from .pgguard import PgMarks, pg_advance, pg_fenced
from .redisguard import RedisMarks, data_key, mark_key, redis_del, redis_hset, redis_incrby, redis_set
from .token import (
    MAX_SCOPE_LEN,
    MAX_TOKEN,
    Token,
    check,
    format_token,
    parse_token,
    parse_value,
    signed_payload,
    validate_scope,
)
from .watch import EVENT_KINDS, Event, Watch

__version__ = "0.1.0"

__all__ = [
    "Client", "Lease", "HeldLease", "ScopeState", "Rejection", "Reporter", "MAX_REPORT",
    "Event", "Watch", "EVENT_KINDS", "Follower", "MarkStore", "PgMarks", "MySQLMarks", "RedisMarks",
    "FenceError", "HeldError", "InvalidError", "LostError", "MissedEventsError", "MissingCryptographyError",
    "NotHolderError", "StaleError", "UnavailableError", "WaitTimeoutError",
    "KeySet", "RemoteKeySet", "have_cryptography",
    "pg_advance", "pg_fenced", "mysql_advance", "mysql_fenced",
    "data_key", "mark_key", "redis_del", "redis_hset", "redis_incrby", "redis_set",
    "MAX_SCOPE_LEN", "MAX_TOKEN", "Token", "check", "format_token", "parse_token",
    "parse_value", "signed_payload", "validate_scope",
]
