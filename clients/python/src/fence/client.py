"""The client of fenced, over Connect's JSON protocol (docs/protocol.md,
"Leases over HTTP/JSON"): POST /fence.v1.LeaseService/METHOD with a JSON
body, with nothing but the standard library.

A Lease keeps itself alive on a thread of its own and sets its `lost`
event the moment its authority ends; see Lease for the rules it follows.
"""

from __future__ import annotations

import atexit
import json
import math
import os
import random
import secrets
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
import weakref
from datetime import datetime, timezone
from http.client import HTTPException
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union

from .errors import (
    FenceError,
    HeldError,
    InvalidError,
    LostError,
    MissedEventsError,
    NotHolderError,
    StaleError,
    UnavailableError,
    WaitTimeoutError,
)

if TYPE_CHECKING:
    from .watch import Watch

__all__ = ["Client", "Lease", "HeldLease", "ScopeState", "Rejection", "Reporter", "MAX_REPORT"]

_SERVICE = "fence.v1.LeaseService"

#: MAX_REPORT is the most rejections one ReportRejections call takes.
MAX_REPORT = 1000


class _Info:
    __slots__ = ("scope", "token", "token_text", "lease_id", "holder", "ttl")

    def __init__(self, body: Any):
        lease = body.get("lease") if isinstance(body, dict) else None
        if not isinstance(lease, dict) or not isinstance(lease.get("leaseId"), str) or "token" not in lease:
            raise FenceError(f"fenced answered no lease: {json.dumps(body)[:200]}")
        self.scope: str = lease.get("scope", "")
        self.token: int = int(lease["token"])  # a decimal string in JSON: exact beyond 2^53
        self.token_text: str = lease.get("tokenText") or f"fence:v1:{self.scope}:{self.token}"
        self.lease_id: str = lease["leaseId"]
        self.holder: str = lease.get("holder", "")
        self.ttl: float = _parse_duration(lease.get("ttl"))


class HeldLease:
    """HeldLease is a lease as Get, List and everyone but its holder see it:
    no lease ID, and the token's unsigned text form. token is an exact int;
    ttl and expires_in (as the service saw it when it answered) are
    seconds; granted_at is the service's wall clock, in seconds since the
    epoch."""

    __slots__ = ("scope", "token", "holder", "ttl", "expires_in", "granted_at", "token_text")

    def __init__(self, scope: str, token: int, holder: str = "", ttl: float = 0.0,
                 expires_in: float = 0.0, granted_at: float = 0.0, token_text: str = ""):
        self.scope = scope
        self.token = token
        self.holder = holder
        self.ttl = ttl
        self.expires_in = expires_in
        self.granted_at = granted_at
        self.token_text = token_text

    @classmethod
    def _of(cls, d: Dict[str, Any]) -> "HeldLease":
        from .watch import _parse_time

        scope = d.get("scope", "")
        token = int(d.get("token", "0"))
        return cls(scope, token, d.get("holder", ""), _parse_duration(d.get("ttl")),
                   _parse_duration(d.get("expiresIn")), _parse_time(d.get("grantedAt")),
                   d.get("tokenText") or f"fence:v1:{scope}:{token}")

    def __repr__(self) -> str:
        return f"<fence.HeldLease {self.scope} token={self.token} holder={self.holder!r}>"


class ScopeState:
    """ScopeState is what Get reports of a scope: lease, its current lease
    (None when it is free); last_token, at or above every token the scope
    was issued and below its next (a free scope's is the closing token of
    its last lease, from log format 8 on, or a token floor set since; a
    scope never granted has the floor); waiters, the acquires in its
    line."""

    __slots__ = ("scope", "lease", "last_token", "waiters")

    def __init__(self, scope: str, lease: Optional[HeldLease], last_token: int, waiters: int = 0):
        self.scope = scope
        self.lease = lease
        self.last_token = last_token
        self.waiters = waiters

    def __repr__(self) -> str:
        held = f"held token={self.lease.token}" if self.lease else "free"
        return f"<fence.ScopeState {self.scope} {held} last_token={self.last_token}>"


def _duration_text(seconds: float) -> str:
    """_duration_text writes seconds as a protobuf JSON duration ("0.5s")."""
    text = f"{seconds:.9f}".rstrip("0").rstrip(".")
    return f"{text}s"


def _parse_duration(d: Any) -> float:
    """_parse_duration reads a protobuf JSON duration ("1.999893167s") as seconds."""
    if not isinstance(d, str) or not d.endswith("s"):
        return 0.0
    try:
        v = float(d[:-1])
    except ValueError:
        return 0.0
    return v if math.isfinite(v) else 0.0


def _default_holder() -> str:
    prog = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"
    return f"{prog or 'python'}-{os.getpid()}@{socket.gethostname()}"[:128]


def _rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _from_connect(body: Dict[str, Any]) -> FenceError:
    """_from_connect turns a Connect error body into this package's errors,
    as Go's wire.FromConnect does. fenced sends each detail's fields in JSON
    under "debug", beside the protobuf bytes."""
    code = body.get("code", "")
    msg = body.get("message") or code
    conflict: Dict[str, Any] = {}
    violation: Dict[str, Any] = {}
    for d in body.get("details") or []:
        if not isinstance(d, dict):
            continue
        if d.get("type") == "fence.v1.LeaseConflict":
            conflict = d.get("debug") or {}
        elif d.get("type") == "fence.v1.FieldViolation":
            violation = d.get("debug") or {}
    if code == "invalid_argument":
        return InvalidError(violation.get("field", ""), msg)
    if code == "aborted":
        return HeldError(
            msg,
            scope=conflict.get("scope", ""),
            holder=conflict.get("holder", ""),
            token=int(conflict.get("token", "0")),
            expires_in=_parse_duration(conflict.get("expiresIn")),
        )
    if code == "failed_precondition":
        return LostError(
            msg,
            scope=conflict.get("scope", ""),
            token=int(conflict.get("lostToken", "0")),
            current=int(conflict.get("token", "0")),
            reason=conflict.get("reason") or "no longer the current lease",
            code=code,
        )
    if code == "not_found":
        return NotHolderError(msg, code)
    if code in ("unavailable", "canceled", "unknown"):
        # connect-go calls a reset stream "canceled" and an answer cut off by
        # a crash "unknown": the service going away.
        return UnavailableError(msg, code)
    if code == "deadline_exceeded":
        return WaitTimeoutError(msg, code)
    if code == "out_of_range":
        return MissedEventsError(msg, code)
    return FenceError(msg, code)


def _wrap(op: str, scope: str, err: FenceError) -> FenceError:
    """_wrap names the operation and scope in err's message, keeping its class and fields."""
    prefix = f'{op} "{scope}": '
    if not err.message.startswith(prefix):
        err.message = prefix + err.message
        err.args = (err.message,)
    return err


class Rejection:
    """Rejection is one write a guard refused as stale, as reported to
    fenced: the scope, the token presented, the highest the guard had
    accepted, and when (wall clock, seconds since the epoch)."""

    __slots__ = ("scope", "presented", "highest", "time")

    def __init__(self, scope: str, presented: int, highest: int, when: Optional[float] = None):
        self.scope = scope
        self.presented = presented
        self.highest = highest
        self.time = time.time() if when is None else when

    @classmethod
    def of(cls, err: StaleError) -> "Rejection":
        """of makes the Rejection of a guard's StaleError."""
        return cls(err.scope, err.presented, err.highest)

    def _json(self) -> Dict[str, Any]:
        return {
            "scope": self.scope,
            "presentedToken": str(self.presented),
            "highestToken": str(self.highest),
            "time": _rfc3339(self.time),
        }


class Client:
    """Client talks to fenced: one node, or the nodes of a cluster (any node
    takes any call, forwarding to the leader). It sends its calls to one
    address at a time, and moves to the next, wrapping around, when a call
    finds that node unavailable, as the Go client does. It is safe to share
    between threads; make one per process.

    addrs is fenced's API address ("http://127.0.0.1:7480"; "host:port" is
    taken as http), or a cluster's addresses: a list, or comma-separated.
    holder names the holder of its leases for people (default
    program-pid@host). bearer is a token for a fenced that runs with
    --auth-file. retry_timeout bounds, in seconds, how long one call keeps
    retrying while the service is unreachable or has no leader (10; 0 makes
    a single attempt); call_timeout bounds one attempt of a call that does
    not wait in line (10 s). report_rejections (True) makes the guards of
    this package send the stale rejections they see for this client's
    leases to fenced, as Go's guardreport does (see Reporter).
    """

    def __init__(
        self,
        addrs: Union[str, Sequence[str]],
        holder: Optional[str] = None,
        bearer: Optional[str] = None,
        retry_timeout: float = 10.0,
        call_timeout: float = 10.0,
        report_rejections: bool = True,
    ):
        items = addrs.split(",") if isinstance(addrs, str) else list(addrs)
        bases = []
        for a in items:
            a = a.strip()
            if not a:
                continue
            if "://" not in a:
                a = "http://" + a
            if not (a.startswith("http://") or a.startswith("https://")):
                raise InvalidError("address", f"{a!r} is not an http:// or https:// address of fenced")
            bases.append(a.rstrip("/"))
        if not bases:
            raise InvalidError("address", "no fenced address given")
        self._bases: List[str] = bases
        self._cur = 0
        self._holder = (holder if holder is not None else _default_holder())
        self._headers = {"Content-Type": "application/json", "Connect-Protocol-Version": "1"}
        if bearer is not None:
            self._headers["Authorization"] = f"Bearer {bearer}"
        self._retry_timeout = retry_timeout
        self._call_timeout = call_timeout
        self._report = report_rejections
        self._lock = threading.Lock()
        self._leases: "weakref.WeakSet[Lease]" = weakref.WeakSet()
        self._watches: "weakref.WeakSet[Watch]" = weakref.WeakSet()
        self._reporters: Dict[str, Reporter] = {}
        self._closed = False
        # No proxies: fenced is reached directly, whatever http_proxy says.
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    @property
    def addresses(self) -> List[str]:
        """addresses are the nodes the client calls, in order."""
        return list(self._bases)

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def acquire(
        self,
        scope: str,
        ttl: float = 10.0,
        holder: Optional[str] = None,
        wait: bool = False,
        timeout: Optional[float] = None,
        request_id: Optional[str] = None,
        drift_margin: Optional[float] = None,
    ) -> "Lease":
        """acquire acquires a lease on scope for ttl seconds and keeps it
        alive on a thread until it is released or lost (see Lease).

        A held scope raises a HeldError, unless wait is true: then the
        acquire queues behind the holder, first come first served, until it
        is granted or timeout seconds pass (WaitTimeoutError; None waits as
        long as it takes). Transient failures are retried, at the next node
        when there are several, with the same request ID, so one acquire
        never takes two tokens. request_id (at most 64 bytes, secret) makes a
        retried acquire, even in another process, return the grant of an
        earlier attempt; by default each acquire makes a fresh one.
        drift_margin (seconds; default a twentieth of the TTL, at least 5 ms)
        is how much earlier than its TTL the lease gives up its authority.
        """
        if self._closed:
            raise FenceError(f'acquire "{scope}": the client is closed')
        if not isinstance(ttl, (int, float)) or not math.isfinite(ttl) or ttl <= 0:
            raise InvalidError("ttl", f'acquire "{scope}": ttl {ttl!r} is not a positive number of seconds')
        if timeout is not None and (not math.isfinite(timeout) or timeout <= 0):
            raise InvalidError("timeout", f'acquire "{scope}": timeout {timeout!r} is not a positive number of seconds')
        req = {
            "scope": scope,
            "holder": holder if holder is not None else self._holder,
            "ttl": _duration_text(ttl),
            "wait": bool(wait),
            "requestId": request_id if request_id is not None else secrets.token_hex(16),
        }
        deadline = None if timeout is None else time.monotonic() + timeout
        body, first, retried = self._call("acquire", scope, "Acquire", req, deadline=deadline, waiting=bool(wait))
        info = _Info(body)
        sent = first
        # The local validity counts from the send time, which precedes the
        # service's deadline: the service starts it when it grants, after the
        # request was sent. Not so a grant that an earlier attempt obtained,
        # whose deadline started before this send: a retry, or an earlier
        # call with the request ID the caller chose. Then one renewal gives
        # the validity a send time of its own. So does a wait in line longer
        # than a third of the TTL, so that a lease starts with at least the
        # validity a keep-alive leaves it.
        if retried or request_id is not None or time.monotonic() - sent > info.ttl / 3:
            sent = time.monotonic()
            try:
                renewed, _, _ = self._call("acquire", scope, "Renew", {"scope": scope, "leaseId": info.lease_id})
                info.token_text = _Info(renewed).token_text
            except BaseException:
                self._release_quietly(info)
                raise
        margin = drift_margin if drift_margin is not None else max(info.ttl / 20, 0.005)
        lease = Lease(self, info, sent, margin)
        with self._lock:
            closed = self._closed
            if not closed:
                self._leases.add(lease)
        if closed:
            # close() overtook this acquire: it must not outlive the client.
            lease._lose("the client was closed")
            self._release_quietly(info)
            raise FenceError(f'acquire "{scope}": the client is closed')
        lease._start()
        return lease

    def get(self, scope: str, timeout: Optional[float] = None) -> ScopeState:
        """get reports scope (Get): its current lease, if any, its last token
        and its waiters. Anyone may call it; the lease comes without its ID."""
        deadline = None if timeout is None else time.monotonic() + timeout
        body, _, _ = self._call("get", scope, "Get", {"scope": scope}, deadline=deadline)
        lease = body.get("lease")
        return ScopeState(
            body.get("scope", scope),
            HeldLease._of(lease) if isinstance(lease, dict) else None,
            int(body.get("lastToken", "0")),
            int(body.get("waiters", 0)),
        )

    def list(self, prefix: str = "", page_size: int = 0, timeout: Optional[float] = None) -> List[HeldLease]:
        """list reports the leases held on the scopes starting with prefix
        ("" for all) in scope order (List), reading every page (page_size
        leases an answer; 0, the service's 1000)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        out: List[HeldLease] = []
        page = ""
        while True:
            req: Dict[str, Any] = {"prefix": prefix}
            if page_size:
                req["pageSize"] = int(page_size)
            if page:
                req["pageToken"] = page
            body, _, _ = self._call("list", prefix, "List", req, deadline=deadline)
            out += [HeldLease._of(d) for d in body.get("leases") or [] if isinstance(d, dict)]
            page = body.get("nextPageToken") or ""
            if not page:
                return out

    def watch(
        self,
        prefix: str = "",
        start_position: int = 0,
        include_held: bool = False,
        progress: Optional[Callable[[int], None]] = None,
        health_interval: float = 2.0,
    ) -> "Watch":
        """watch streams the lease events of the scopes starting with prefix
        ("" for all), as the service's leader records them: an iterator of
        Events (see Watch). The leader records a renewal of a lease a quarter
        of its TTL apart at least, one loss a lease and one rejection a
        stale token of a scope, rejections in a tenth of the events it
        keeps at most (docs/protocol.md, "Watch"). start_position is 0 to begin now, or the
        next_position of an earlier watch to resume it. include_held begins
        with a "held" event for every lease held under the prefix.
        progress(next_position), when given, is called after each response
        of the stream, events or none: at least once a connection as soon as
        the service has taken its start, so a watcher knows that what
        happens from then on is in the stream. health_interval is how often
        (seconds; 0: never) the node's /healthz is asked while the stream is
        open: a node that does not answer within it has its stream cut and
        resumed at the next. Close it (close(), or with) when done."""
        from .watch import Watch

        if self._closed:
            raise FenceError(f'watch "{prefix}": the client is closed')
        start = int(start_position)
        if start < 0 or start > (1 << 64) - 1:
            raise InvalidError("start_position", f'watch "{prefix}": start position {start_position!r} is not from 0 to 2^64-1')
        w = Watch(self, prefix, start, include_held, progress, health_interval)
        with self._lock:
            closed = self._closed
            if not closed:
                self._watches.add(w)
        if closed:
            raise FenceError(f'watch "{prefix}": the client is closed')
        return w

    def report_rejections(self, guard: str, rejections: Iterable[Rejection], dropped: int = 0, timeout: Optional[float] = None) -> None:
        """report_rejections sends stale rejections a guard saw to fenced
        (ReportRejections), at most MAX_REPORT at a time: its status page,
        metrics and watchers show them. guard names the guarded resource for
        people ("orders-db"). Reporter batches them off the write path."""
        items = [r._json() for r in rejections]
        if len(items) > MAX_REPORT:
            raise InvalidError("rejections", f"{len(items)} rejections, at most {MAX_REPORT} a call")
        req: Dict[str, Any] = {"guard": guard, "rejections": items}
        if dropped:
            req["dropped"] = str(dropped)
        deadline = None if timeout is None else time.monotonic() + timeout
        self._call("report", guard, "ReportRejections", req, deadline=deadline)

    def reporter(self, guard: str) -> "Reporter":
        """reporter returns the client's Reporter for the guard name, made on
        first use and closed by close()."""
        with self._lock:
            r = self._reporters.get(guard)
            if r is None:
                r = Reporter(self, guard)
                self._reporters[guard] = r
            return r

    def _report_stale(self, guard: str, err: StaleError) -> None:
        if self._report and not self._closed:
            self.reporter(guard).rejected(err)

    def close(self, timeout: float = 5.0) -> None:
        """close ends every lease the client keeps alive (their lost events
        are set) and releases them, best effort, closes its watches (their
        iterations stop), and sends the rejections its reporters still
        hold. Later acquires and watches fail."""
        with self._lock:
            self._closed = True
            held = list(self._leases)
            reporters = list(self._reporters.values())
            watches = list(self._watches)
        for w in watches:
            w.close()
        for lease in held:
            try:
                lease.release()
            except FenceError:
                pass
        for r in reporters:
            try:
                r.close(timeout)
            except FenceError:
                pass

    def _forget(self, lease: "Lease") -> None:
        with self._lock:
            self._leases.discard(lease)

    def _renew(self, info: _Info, timeout: float) -> _Info:
        body, _, _ = self._call(
            "renew", info.scope, "Renew", {"scope": info.scope, "leaseId": info.lease_id},
            retry_timeout=0, attempt_timeout=timeout,
        )
        return _Info(body)

    def _release(self, info: _Info) -> int:
        body, _, _ = self._call("release", info.scope, "Release", {"scope": info.scope, "leaseId": info.lease_id}, releasing=True)
        return int(body.get("token", "0")) if isinstance(body, dict) else 0

    def _release_quietly(self, info: _Info) -> None:
        # Best effort: the lease would expire on its TTL anyway.
        try:
            self._release(info)
        except FenceError:
            pass

    def _call(
        self,
        op: str,
        scope: str,
        method: str,
        req: Dict[str, Any],
        deadline: Optional[float] = None,
        waiting: bool = False,
        retry_timeout: Optional[float] = None,
        attempt_timeout: Optional[float] = None,
        releasing: bool = False,
    ) -> Tuple[Any, float, bool]:
        """_call makes one API call, retrying while the service is
        unavailable, for at most retry_timeout seconds (and never past
        deadline). It returns the answer, the send time of the attempt that
        succeeded (time.monotonic()), and whether earlier attempts were
        made. A release whose earlier attempt may have been applied takes a
        "lost" answer as done."""
        budget = self._retry_timeout if retry_timeout is None else retry_timeout
        give_up = time.monotonic() + budget
        if deadline is not None:
            give_up = min(give_up, deadline)
        backoff = 0.02
        attempt = 0
        while True:
            sent = time.monotonic()
            node = self._cur
            try:
                if deadline is not None and sent >= deadline:
                    raise WaitTimeoutError(f"{method}: the timeout passed before fenced answered", "deadline_exceeded")
                body = self._post(self._bases[node], method, req, deadline, waiting, attempt_timeout)
                return body, sent, attempt > 0
            except (LostError, NotHolderError) as err:
                if releasing and attempt > 0:
                    # An earlier attempt may have released it: either way the
                    # lease is no longer ours, which is what release asks.
                    return {}, sent, True
                raise _wrap(op, scope, err) from None
            except UnavailableError as err:
                sleep = random.random() * backoff + 0.001
                self._move_on(node)
                if time.monotonic() + sleep > give_up:
                    raise _wrap(op, scope, err) from None
                time.sleep(sleep)
                backoff = min(2 * backoff, 0.1)  # as the Go client: a new leader is found soon after it serves
                attempt += 1
            except FenceError as err:
                raise _wrap(op, scope, err) from None

    def _move_on(self, node: int) -> None:
        """_move_on makes the node after node the current one, after a call
        to node found it unavailable. Only the call that saw the failure
        moves on: concurrent calls failing on the same node must not skip
        the next one."""
        with self._lock:
            if self._cur == node:
                self._cur = (node + 1) % len(self._bases)

    def _post(
        self,
        base: str,
        method: str,
        req: Dict[str, Any],
        deadline: Optional[float],
        waiting: bool,
        attempt_timeout: Optional[float],
    ) -> Any:
        """_post sends one Connect unary call and decodes its answer or error."""
        url = f"{base}/{_SERVICE}/{method}"
        headers = dict(self._headers)
        if deadline is not None:
            left = max(deadline - time.monotonic(), 0.001)
            headers["Connect-Timeout-Ms"] = str(max(int(left * 1000), 1))
            # fenced answers deadline_exceeded at the deadline; the socket
            # waits a little longer for that answer.
            sock_timeout: Optional[float] = left + 5.0
        elif waiting:
            sock_timeout = None  # a wait in line lasts as long as it takes
        else:
            sock_timeout = self._call_timeout
        if attempt_timeout is not None:
            sock_timeout = attempt_timeout if sock_timeout is None else min(sock_timeout, attempt_timeout)
        data = json.dumps(req).encode("utf-8")
        request = urllib.request.Request(url, data=data, headers=headers, method="POST")
        status = 200
        reason = "OK"
        try:
            with self._opener.open(request, timeout=sock_timeout) as res:
                text = res.read()
        except urllib.error.HTTPError as err:
            status, reason = err.code, err.reason
            try:
                text = err.read()
            except (OSError, HTTPException) as cut:
                raise UnavailableError(f"{url}: answer cut off: {cut}") from cut
            finally:
                err.close()
        except (urllib.error.URLError, OSError, HTTPException) as err:
            cause = getattr(err, "reason", err)
            raise UnavailableError(f"{url}: {cause}") from err
        if 200 <= status < 300:
            try:
                return json.loads(text)
            except ValueError:
                pass
        raise self._answer_error(url, status, reason, text)

    @staticmethod
    def _answer_error(url: str, status: int, reason: str, text: bytes) -> FenceError:
        """_answer_error is the error of an answer that is not a success:
        fenced's JSON error, or a proxy's (502, 503 and 504 are unavailable)."""
        try:
            body = json.loads(text)
        except ValueError:
            body = None
        if not isinstance(body, dict) or not isinstance(body.get("code"), str):
            # Not fenced's answer: a proxy, or a node going down.
            msg = f"{url}: {status} {reason}: {text[:200].decode('utf-8', 'replace')}"
            if 502 <= status <= 504:
                return UnavailableError(msg)
            return FenceError(msg)
        return _from_connect(body)


class Lease:
    """Lease is a held lease that keeps itself alive: a thread renews it
    every third of its TTL, and it reports itself lost, setting its `lost`
    event, as soon as it can no longer be sure it holds the scope:

    - fenced answers that it is not the current lease (failed_precondition,
      not_found);
    - its local validity runs out: the send time of its last confirmed
      renewal (at first, of its acquire) plus the TTL, minus the drift
      margin, on this process's monotonic clock (time.monotonic()), passes
      without a newer confirmation;
    - its holder calls mark_lost, for example after a guard refused its
      token as stale (this package's guards do it themselves);
    - it is released, or its Client is closed.

    `error` then says why (a LostError). Reading `lost`, `error` or calling
    raise_if_lost() also checks the clock, so a process that was paused (a
    SIGSTOP, a swapped-out VM) past its validity finds the lease lost as
    soon as it runs again, before its keep-alive thread had a chance to. A
    lost lease stays lost; acquire a new one, which has a greater token.
    Safe to use from several threads. As a context manager it releases on
    exit (a lease already lost is left as it is).
    """

    def __init__(self, client: Client, info: _Info, sent: float, margin: float):
        self.scope: str = info.scope
        #: The fencing token: compare it as an int; it may exceed 2^53.
        self.token: int = info.token
        #: The lease ID renews and releases the lease: keep it secret, never log it.
        self.lease_id: str = info.lease_id
        self.holder: str = info.holder
        #: The TTL fenced granted, in seconds.
        self.ttl: float = info.ttl
        self.drift_margin: float = margin
        self._client = client
        self._info = info
        self._token_text = info.token_text
        self._sent = sent
        self._valid_until = sent + info.ttl - margin
        self._lock = threading.Lock()
        self._lost = threading.Event()
        self._error: Optional[LostError] = None
        self._expired = False
        self._thread = threading.Thread(target=self._keep_alive, name=f"fence-keepalive {self.scope}", daemon=True)

    def __repr__(self) -> str:
        # No lease ID: it is a secret.
        state = "lost" if self._lost.is_set() else "held"
        return f"<fence.Lease {self.scope} token={self.token} {state}>"

    def __enter__(self) -> "Lease":
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            self.release()
        except LostError:
            pass

    @property
    def token_text(self) -> str:
        """token_text is the token's text form to send with writes
        (Fencing-Token): the newest fenced gave, signed by the key that
        signs now, since each renewal signs it again."""
        with self._lock:
            return self._token_text

    @property
    def lost(self) -> threading.Event:
        """lost is set when the lease is lost or released. Reading it checks
        the local validity against the clock first."""
        self._check_clock()
        return self._lost

    @property
    def error(self) -> Optional[LostError]:
        """error is None while the lease is held, then why it ended."""
        self._check_clock()
        with self._lock:
            return self._error

    @property
    def valid_until(self) -> float:
        """valid_until is the local deadline of the lease's authority on the
        time.monotonic() clock: later than time.monotonic() while valid."""
        with self._lock:
            return self._valid_until

    def remaining(self) -> float:
        """remaining is how many seconds of validity are left (0 when lost)."""
        if self.error is not None:
            return 0.0
        return max(self.valid_until - time.monotonic(), 0.0)

    def raise_if_lost(self) -> None:
        """raise_if_lost raises the LostError if the lease is lost or released."""
        err = self.error
        if err is not None:
            raise err

    def wait_lost(self, timeout: Optional[float] = None) -> bool:
        """wait_lost blocks until the lease is lost (True) or timeout
        seconds pass (False). Unlike lost.wait, it also wakes at the local
        validity's end when the keep-alive thread could not run."""
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            if self.lost.is_set():
                return True
            now = time.monotonic()
            step = self.valid_until - now
            if end is not None:
                if now >= end:
                    return False
                step = min(step, end - now)
            self._lost.wait(max(step, 0.001))

    def mark_lost(self, reason: Any) -> None:
        """mark_lost ends the lease's authority locally: call it when a guard
        refuses the lease's token as stale. The lease stops renewing; it is
        not released, as a newer holder may already own the scope. Retrying
        the refused write with this token can never succeed."""
        self._lose(f"marked lost by its holder: {reason}")

    def release(self) -> None:
        """release stops renewing and frees the scope at fenced. Releasing a
        lease that is already lost only stops it, and raises its LostError."""
        err = self.error
        if err is not None:
            raise err
        self._lose("released by its holder")
        self._client._release(self._info)

    def _start(self) -> None:
        self._thread.start()

    def _check_clock(self) -> None:
        if not self._lost.is_set() and time.monotonic() >= self.valid_until:
            self._lose(f"no renewal confirmed within the TTL of {_duration_text(self.ttl)} (local validity ran out)", expired=True)

    def _lose(self, reason: Union[str, LostError], expired: bool = False) -> None:
        """_lose records the first reason the lease ended and stops it.
        expired says that the local validity ran out: the keep-alive thread
        then releases the lease as it ends."""
        with self._lock:
            if self._error is not None:
                return
            self._expired = expired
            if isinstance(reason, str):
                reason = LostError(
                    f'lease on "{self.scope}" with token {self.token} is lost: {reason}',
                    scope=self.scope, token=self.token, reason=reason,
                )
            self._error = reason
        self._client._forget(self)
        self._lost.set()

    def _keep_alive(self) -> None:
        """_keep_alive runs _renewals, and when the lease has ended because
        its local validity ran out, releases it: the service may have
        granted a renewal whose answer came too late, and a release frees
        the scope only while this lease is current, so it takes nothing
        from a newer holder."""
        self._renewals()
        with self._lock:
            expired = self._expired
        if expired:
            self._client._release_quietly(self._info)

    def _renewals(self) -> None:
        """_renewals renews the lease every third of its TTL, counted from
        the send time its validity counts from, and ends the lease when
        fenced says it is lost or its local validity runs out. It runs until
        the lease ends, which it does by the validity deadline at the
        latest: a renewal whose answer has not come by then is abandoned."""
        every = self.ttl / 3
        nxt = self._sent + every
        while True:
            valid = self.valid_until
            if self._lost.wait(max(min(nxt, valid) - time.monotonic(), 0)):
                return
            now = time.monotonic()
            if now >= valid:
                self._check_clock()
                return
            if now < nxt:
                continue
            sent = time.monotonic()
            outcome: List[Any] = []
            done = threading.Event()

            def renew(timeout: float = max(valid - sent, 0.001)) -> None:
                try:
                    outcome.append(self._client._renew(self._info, timeout))
                except BaseException as err:  # handed to the keep-alive thread
                    outcome.append(err)
                done.set()

            threading.Thread(target=renew, name=f"fence-renew {self.scope}", daemon=True).start()
            # An answer after the validity ends comes too late to extend it.
            while not done.wait(max(min(valid - time.monotonic(), 0.05), 0)):
                if self._lost.is_set() or time.monotonic() >= valid:
                    break
            if self._lost.is_set():
                return
            if not done.is_set():
                continue  # the validity ran out: the next turn ends the lease
            res = outcome[0]
            if isinstance(res, _Info):
                with self._lock:
                    self._valid_until = max(self._valid_until, sent + self.ttl - self.drift_margin)
                    self._token_text = res.token_text
                nxt = sent + every
            elif isinstance(res, (LostError, NotHolderError)):
                self._lose(
                    LostError(
                        f'lease on "{self.scope}" with token {self.token} is lost: {res.message}',
                        scope=self.scope, token=self.token,
                        current=res.current if isinstance(res, LostError) else 0,
                        reason=res.reason if isinstance(res, LostError) else res.message,
                        code=res.code,
                    )
                )
                return
            else:
                # Transient: try again soon, while the lease is still valid.
                nxt = time.monotonic() + max(self.ttl / 20, 0.01)


class Reporter:
    """Reporter sends a guard's stale rejections to fenced in batches, off
    the write path, as Go's guard/guardreport does: fenced's status page,
    its metrics (fence_stale_rejections_reported_total) and its watchers
    show which holders kept writing after losing their lease.

    rejected() never blocks on the network: it puts the rejection in a
    bounded buffer (buffer, 1000), and a daemon thread sends the buffer
    every interval seconds (1). When the buffer is full, rejections are
    dropped and counted, and the count is sent with the next batch.
    Reporting is best effort: a guard's decision never depends on it. What
    is still buffered is sent by flush(), close(), the client's close(), and
    at the interpreter's exit (for at most two seconds). Safe to share
    between threads.
    """

    def __init__(self, client: Client, guard: str, interval: float = 1.0, buffer: int = 1000):
        self._client = client
        self.guard = guard
        self._interval = interval
        self._limit = max(buffer, 1)
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._buf: List[Rejection] = []
        self._dropped = 0
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self.last_error: Optional[FenceError] = None
        _live_reporters.add(self)

    def rejected(self, err: Union[StaleError, Rejection]) -> None:
        """rejected buffers a stale rejection for the next batch, or counts
        it as dropped when the buffer is full."""
        r = err if isinstance(err, Rejection) else Rejection.of(err)
        with self._lock:
            if len(self._buf) < self._limit:
                self._buf.append(r)
            else:
                self._dropped += 1
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(target=self._loop, name=f"fence-report {self.guard}", daemon=True)
                self._thread.start()

    def pending(self) -> int:
        """pending is how many rejections wait to be sent."""
        with self._lock:
            return len(self._buf)

    def flush(self, timeout: Optional[float] = None) -> None:
        """flush sends what is buffered now and returns when fenced has it;
        on failure what was not sent goes back in the buffer, and the error
        is raised."""
        with self._send_lock:
            while True:
                with self._lock:
                    batch = self._buf[:MAX_REPORT]
                    self._buf = self._buf[MAX_REPORT:]
                    dropped, self._dropped = self._dropped, 0
                if not batch and not dropped:
                    return
                try:
                    self._client.report_rejections(self.guard, batch, dropped, timeout=timeout)
                except FenceError:
                    with self._lock:
                        # Put the batch back in front of what came since, as
                        # far as it fits; the rest counts as dropped.
                        keep = min(len(batch), max(self._limit - len(self._buf), 0))
                        self._buf = batch[:keep] + self._buf
                        self._dropped += dropped + len(batch) - keep
                    raise

    def close(self, timeout: Optional[float] = 5.0) -> None:
        """close stops the background sending and sends what is left,
        giving up after timeout seconds."""
        self._stop.set()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout)
        self.flush(timeout)

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self.flush(max(self._interval, 5.0))
                self.last_error = None
            except FenceError as err:
                if self.last_error is None:
                    print(f"fence: reporting stale rejections of {self.guard!r} to fenced failed; will retry: {err}", file=sys.stderr)
                self.last_error = err


_live_reporters: "weakref.WeakSet[Reporter]" = weakref.WeakSet()


@atexit.register
def _flush_at_exit() -> None:
    for r in list(_live_reporters):
        if r.pending() or r._dropped:
            try:
                r.flush(2.0)
            except FenceError:
                pass
