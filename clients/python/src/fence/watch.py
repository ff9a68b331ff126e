"""Watch: the lease events of the scopes under a prefix, over Connect's
streaming protocol in JSON (docs/protocol.md, "Watch"), with nothing but
the standard library.

The request is one frame (a flags byte, a 4-byte big-endian length, a
WatchRequest in JSON) posted as application/connect+json; the answer is a
body of frames, each a WatchResponse, ended by a frame of flags 0x02 whose
JSON holds the stream's error, or {} for none. A body that ends without
that frame was cut off.
"""

from __future__ import annotations

import json
import random
import socket
import ssl
import struct
import threading
import time
import urllib.error
import urllib.parse
from http.client import HTTPConnection, HTTPException, HTTPResponse, HTTPSConnection
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, Optional

from .client import _from_connect, _parse_duration, _wrap
from .errors import FenceError, UnavailableError
from .keys import _parse_time as _parse_rfc3339

if TYPE_CHECKING:
    from .client import Client

__all__ = ["Event", "Watch", "EVENT_KINDS"]

#: EVENT_KINDS maps the protocol's kinds to Event.kind, Go's names.
EVENT_KINDS = {
    "EVENT_KIND_GRANTED": "granted",    # a new lease began, with a new token
    "EVENT_KIND_RENEWED": "renewed",    # its holder renewed it; same token (a quarter TTL apart at least)
    "EVENT_KIND_RELEASED": "released",  # its holder released it
    "EVENT_KIND_EXPIRED": "expired",    # the service expired it
    "EVENT_KIND_LOST": "lost",          # a renewal was answered lost (once a lease)
    "EVENT_KIND_REJECTED": "rejected",  # a guard refused a write with this stale token (once a token of a scope)
    "EVENT_KIND_HELD": "held",          # held when the watch began (include_held)
}

_END = 0x02
_COMPRESSED = 0x01
_MAX_FRAME = 64 << 20


def _parse_time(v: Any) -> float:
    """_parse_time reads an RFC 3339 UTC time ("2026-12-05T21:52:32.729368935Z")
    as seconds since the epoch (0.0 when absent or not of that form)."""
    if not isinstance(v, str) or not v:
        return 0.0
    try:
        return _parse_rfc3339(v)
    except ValueError:
        return 0.0


def _int(v: Any) -> int:
    """_int reads a 64-bit integer of the JSON mapping (a decimal string, or
    a number), 0 when absent."""
    if v is None:
        return 0
    return int(v)


class Event:
    """Event is one lease event of a watch.

    position orders the events (0 for "held"); a watch resumed at
    position + 1 continues right after it. kind is "granted", "renewed",
    "released", "expired", "lost", "rejected" or "held" ("unknown(NAME)"
    for a kind this client does not know). token is the lease's token (for
    "rejected", the token a guard refused); closing, for "released" and
    "expired", the token value the end of the lease consumed and granted to
    nobody (log format 8 on; 0 before, or when token was the maximum): a
    guard whose mark is advanced to it refuses token. current is, for
    "lost", the scope's token then (0 if free) and, for "rejected", the
    highest the guard had accepted; guard names that guard. time is when the
    service recorded it (for "held", the grant; for "rejected", the refusal)
    in seconds since the epoch, by the service's clock. lease_fingerprint
    tells leases apart and reveals nothing of the lease ID. Tokens are exact
    ints.
    """

    __slots__ = ("position", "kind", "scope", "token", "holder", "lease_fingerprint",
                 "ttl", "time", "current", "guard", "closing")

    def __init__(self, position: int, kind: str, scope: str, token: int, holder: str = "",
                 lease_fingerprint: str = "", ttl: float = 0.0, time: float = 0.0,
                 current: int = 0, guard: str = "", closing: int = 0):
        self.position = position
        self.kind = kind
        self.scope = scope
        self.token = token
        self.holder = holder
        self.lease_fingerprint = lease_fingerprint
        self.ttl = ttl
        self.time = time
        self.current = current
        self.guard = guard
        self.closing = closing

    @classmethod
    def _of(cls, e: Dict[str, Any]) -> "Event":
        k = e.get("kind", "")
        return cls(
            position=_int(e.get("position")),
            kind=EVENT_KINDS.get(k, f"unknown({k})"),
            scope=e.get("scope", ""),
            token=_int(e.get("token")),
            holder=e.get("holder", ""),
            lease_fingerprint=e.get("leaseIdPrefix", ""),  # the field's name predates fingerprints
            ttl=_parse_duration(e.get("ttl")),
            time=_parse_time(e.get("time")),
            current=_int(e.get("currentToken")),
            guard=e.get("guard", ""),
            closing=_int(e.get("closingToken")),
        )

    def __repr__(self) -> str:
        extra = f" closing={self.closing}" if self.closing else ""
        return f"<fence.Event {self.position} {self.kind} {self.scope} token={self.token}{extra}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Event) and all(getattr(self, s) == getattr(other, s) for s in self.__slots__)


class Watch:
    """Watch is an iterator of the Events of a watch: Client.watch makes it.

    It reconnects across a broken connection, a node that stops answering
    its /healthz, or a leader's change (unavailable), to the client's next
    node, with backoff, for at most the client's retry_timeout since the
    last answer, and resumes where it was, so no event is skipped or
    repeated. It raises the stream's final error as the client's error
    classes: MissedEventsError when the service no longer holds the events
    to resume from (read the state again, with Client.list or include_held,
    and watch from 0), InvalidError for a bad prefix, FenceError with code
    "permission_denied" or "unauthenticated", UnavailableError once the
    retries are spent.

    next_position is where to resume after what has been read: the last
    event's position + 1, or the stream's nextPosition after each response.
    close() ends it from any thread, at once, however long the stream was
    quiet; the iteration then stops without an error. As a context manager
    it closes on exit. One thread iterates; close() may come from another.
    """

    def __init__(self, client: "Client", prefix: str, start_position: int, include_held: bool,
                 progress: Optional[Callable[[int], None]], health_interval: float):
        self._client = client
        self.prefix = prefix
        self.next_position = int(start_position)
        self._held = bool(include_held)
        self._progress = progress
        self._health_interval = health_interval
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._sock: Optional[socket.socket] = None
        self._gen = self._run()

    def __iter__(self) -> "Watch":
        return self

    def __next__(self) -> Event:
        if self._closed.is_set():
            self._gen.close()
            raise StopIteration
        return next(self._gen)

    def __enter__(self) -> "Watch":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        """closed tells whether close() was called."""
        return self._closed.is_set()

    def close(self) -> None:
        """close ends the watch and its connection; a blocked iteration
        returns at once, without an error. Safe from any thread, and more
        than once."""
        self._closed.set()
        with self._lock:
            sock = self._sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _run(self) -> Iterator[Event]:
        c = self._client
        backoff = 0.02
        give_up = time.monotonic() + c._retry_timeout
        while not self._closed.is_set():
            node = c._cur
            base = c._bases[node]
            try:
                for resp in self._stream(base):
                    # An answer starts the retry budget afresh.
                    backoff, give_up = 0.02, time.monotonic() + c._retry_timeout
                    for raw in resp.get("events") or []:
                        e = Event._of(raw)
                        if e.position:
                            self.next_position = e.position + 1
                        yield e
                    # A connection broken among the held pages asks for them
                    # again: they resume at the start position.
                    self._held = bool(resp.get("moreHeld"))
                    self.next_position = _int(resp.get("nextPosition"))
                    if self._progress is not None:
                        self._progress(self.next_position)
                if self._closed.is_set():
                    return
                # The service ended the stream without an error, which it
                # does not do: a broken connection.
                raise UnavailableError(f"{base}: the watch stream ended")
            except UnavailableError as err:
                if self._closed.is_set():
                    return
                c._move_on(node)
                sleep = random.random() * backoff + 0.001
                if time.monotonic() + sleep > give_up:
                    raise _wrap("watch", self.prefix, err) from None
                if self._closed.wait(sleep):
                    return
                backoff = min(2 * backoff, 0.1)
            except FenceError as err:
                if self._closed.is_set():
                    return
                raise _wrap("watch", self.prefix, err) from None

    def _stream(self, base: str) -> Iterator[Dict[str, Any]]:
        """_stream runs one connection of the watch at base and yields its
        responses; it returns when the stream ends without its end frame, or
        the watch is closed, and raises the end frame's error."""
        c = self._client
        u = urllib.parse.urlsplit(base)
        path = (u.path.rstrip("/") + "/fence.v1.LeaseService/Watch")
        req: Dict[str, Any] = {"prefix": self.prefix, "startPosition": str(self.next_position)}
        if self._held:
            req["includeHeld"] = True
        body = json.dumps(req).encode("utf-8")
        headers = {k: v for k, v in c._headers.items() if k != "Content-Type"}
        headers["Content-Type"] = "application/connect+json"
        conn: HTTPConnection
        if u.scheme == "https":
            conn = HTTPSConnection(u.hostname or "", u.port, timeout=c._call_timeout, context=ssl.create_default_context())
        else:
            conn = HTTPConnection(u.hostname or "", u.port, timeout=c._call_timeout)
        watchdog: Optional[threading.Thread] = None
        stop_watchdog = threading.Event()
        try:
            try:
                conn.request("POST", path, struct.pack(">BI", 0, len(body)) + body, headers)
                sock = conn.sock
                with self._lock:
                    self._sock = sock
                if self._closed.is_set():
                    return
                res = conn.getresponse()
                if res.status != 200:
                    text = res.read()
                    raise c._answer_error(f"{base}{path}", res.status, res.reason, text)
                # A watch is quiet while nothing happens: no read timeout.
                # A node that stops answering is found by its /healthz.
                if sock is not None:
                    sock.settimeout(None)
                if self._health_interval > 0:
                    watchdog = threading.Thread(
                        target=self._watchdog, args=(base, sock, stop_watchdog),
                        name=f"fence-watch-health {self.prefix!r}", daemon=True,
                    )
                    watchdog.start()
                while True:
                    head = _read_exact(res, 5)
                    if len(head) < 5:
                        return  # cut off
                    flags, length = struct.unpack(">BI", head)
                    if length > _MAX_FRAME:
                        raise UnavailableError(f"{base}: a watch frame of {length} bytes")
                    data = _read_exact(res, length)
                    if len(data) < length:
                        return  # cut off
                    if flags & _COMPRESSED:
                        raise FenceError(f"{base}: a compressed watch frame, which this client did not ask for")
                    msg = json.loads(data) if data else {}
                    if flags & _END:
                        err = msg.get("error") if isinstance(msg, dict) else None
                        if isinstance(err, dict) and err.get("code"):
                            raise _from_connect(err)
                        return
                    yield msg
            except (OSError, HTTPException, ValueError) as err:
                if self._closed.is_set():
                    return
                raise UnavailableError(f"{base}: watch: {err}") from err
        finally:
            stop_watchdog.set()
            with self._lock:
                self._sock = None
            try:
                conn.close()
            except Exception:
                pass

    def _watchdog(self, base: str, sock: Optional[socket.socket], stop: threading.Event) -> None:
        """_watchdog asks the node's /healthz every health_interval seconds
        while the stream is open, as the Go client does during a call, and
        cuts the connection when the node does not answer in time: a node
        that stopped (SIGSTOP, a frozen VM) never closes it."""
        c = self._client
        interval = self._health_interval
        while not stop.wait(interval):
            try:
                with c._opener.open(f"{base}/healthz", timeout=interval) as r:
                    r.read()
            except urllib.error.HTTPError:
                continue  # it answered
            except Exception:
                if stop.is_set():
                    return
                if sock is not None:
                    try:
                        sock.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                return


def _read_exact(res: HTTPResponse, n: int) -> bytes:
    """_read_exact reads n bytes of the body, fewer only at its end."""
    parts = []
    left = n
    while left > 0:
        b = res.read(left)
        if not b:
            break
        parts.append(b)
        left -= len(b)
    return b"".join(parts)
