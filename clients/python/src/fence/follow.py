"""Follower: the marks of fence's guards kept in step with the service
(docs/design.md, "Eager fencing"), as Go's guard/follow and `fencectl
guard follow` do.

A guard learns that a lease ended only when a newer token arrives. From
log format 8 on, the end of a lease (a release, an expiry) consumes its
scope's next token value, granted to nobody: its closing token, which the
watch stream carries. A Follower watches the scopes under a prefix and
advances each scope's mark to every grant's token and to every closing
token, so the ended lease's late writes are refused at the resource
before anyone else writes there, within the follower's delay. It moves a
mark only with the store's own monotonic advance, the rule writers obey,
so it never moves one back and never races a writer; writers change
nothing.
"""

from __future__ import annotations

import heapq
import logging
import random
import threading
import time
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Optional, Sequence, Tuple

from .errors import FenceError, InvalidError, MissedEventsError
from .token import MAX_TOKEN

if TYPE_CHECKING:
    from .client import Client
    from .watch import Event, Watch

__all__ = ["Follower", "MarkStore"]

log = logging.getLogger("fence.follow")

# Final: retrying cannot mend them.
_FATAL = ("invalid_argument", "permission_denied", "unauthenticated")

# The most marks one advance_many call carries: as many as one of fenced's
# batch calls, enough that a store's round trip and commit are shared by a
# busy service's grants, few enough that a batch the store fails costs
# little to send again.
_BATCH = 256


class MarkStore:
    """MarkStore is what a Follower needs of a guard's store (PgMarks,
    MySQLMarks, RedisMarks, or a class of your own with these methods;
    subclassing is not needed).

    advance(scope, token) moves scope's mark to token unless it is at or
    past it already, with the rule writers obey (the check and the record in
    one step), and returns True if the mark is now token, False if it was
    past it; it raises when the store failed, and is then retried.
    advance_many(marks), optional, does the same for a list of (scope,
    token) pairs of distinct scopes at once (one round trip, one commit)
    and returns their answers in order; when it raises, all of them are
    retried. scopes(prefix), optional, lists the scopes under prefix that have a
    mark: the follower reads their state from the service when it starts,
    so that a lease that ended while no follower ran is closed there too.
    """

    def advance(self, scope: str, token: int) -> bool:  # pragma: no cover - documentation
        raise NotImplementedError

    def advance_many(self, marks: Sequence[Tuple[str, int]]) -> List[bool]:  # pragma: no cover - documentation
        return [self.advance(s, t) for s, t in marks]

    def scopes(self, prefix: str) -> Iterable[str]:  # pragma: no cover - documentation
        return ()


class Follower:
    """Follower advances a store's marks from the watch stream of the scopes
    starting with prefix ("" for all): to each grant's token and to each
    ended lease's closing token, on daemon threads, from start() until
    stop().

    - It coalesces: a scope's mark is advanced once to the highest token it
      has heard of, however many events came meanwhile.
    - It batches: the marks that came while the store was busy go in one
      advance_many call, up to 256, oldest first, where the store has one
      (PgMarks, MySQLMarks and RedisMarks do: one transaction, one
      transaction, one pipeline), as Go's
      follower advances several scopes at once; else one at a time.
    - An advance the store fails (a dropped connection, a restarted server)
      is retried every retry_interval seconds (0.1, with jitter), never
      dropped, merged with what came since.
    - A broken watch (a disconnect, a fenced restarting, a leader's change)
      resumes from the last position read; when the service no longer
      holds those events (MissedEventsError: a restarted fenced, a new
      leader) it reads the state again: List for the held scopes, Get for
      the others whose lease it saw begin and not end (their last token is
      the closing it missed), and watches from now. At its start it reads
      the state too, and Gets each scope the store has a mark for, for the
      leases that ended while no follower ran. A lease granted and ended
      inside a gap stays open until its scope's next event.
    - It keeps in memory only the leases it knows held and the marks not
      yet recorded: a scope is forgotten once its closing is recorded, so
      a follower over short-lived scopes (one per job) stays as small as
      the leases held at once, and so does a resync.
    - It stops by itself only for what retrying cannot mend: an invalid
      prefix, missing credentials or permission, its client closed (then
      `error` says so and `stopped` is set).

    lag() is how many seconds behind the service it is; advanced and
    resyncs count its advances (including those the store found done) and
    its readings of the state after a watch that could not resume. A
    follower that is behind or stopped costs only that window, never
    safety: writers' own tokens keep the marks correct. Safe to use from
    several threads.
    """

    def __init__(self, client: "Client", store: Any, prefix: str = "", retry_interval: float = 0.1,
                 read_store_scopes: bool = True):
        self.client = client
        self.store = store
        self.prefix = prefix
        self.retry_interval = retry_interval
        self._read_store_scopes = read_store_scopes and callable(getattr(store, "scopes", None))
        self._advance_many = getattr(store, "advance_many", None)
        if not callable(self._advance_many):
            self._advance_many = None
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._pending: Dict[str, Tuple[int, float]] = {}   # scope → (token, since when) not yet applied
        self._inflight: Dict[str, Tuple[int, float]] = {}  # the mark being applied
        # scope → the token of the newest lease an event or a read of the
        # state showed held and no event has shown ended: what a resync Gets.
        self._open: Dict[str, int] = {}
        self._listed = False  # the store's scopes were read, at the start
        self._behind = 0.0   # wall clock since the watch broke or the state is being read (0: not)
        self._stop = threading.Event()
        self._watch: Optional["Watch"] = None
        self._threads: list = []
        self._advanced = 0
        self._resyncs = 0
        self._caught_up = threading.Event()
        #: position is where the watch resumes: the next_position read last (0 before).
        self.position = 0
        #: error is the failure that stopped the follower, or None.
        self.error: Optional[FenceError] = None
        #: last_store_error is the store's last failure, until an advance succeeds.
        self.last_store_error: Optional[BaseException] = None
        #: stopped is set when the follower has stopped, by stop() or by a final error.
        self.stopped = threading.Event()

    def __enter__(self) -> "Follower":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def start(self) -> "Follower":
        """start starts following, on two daemon threads (the watch, and the
        store's advances); it returns at once. It starts once."""
        with self._lock:
            if self._threads:
                raise FenceError("the follower was started already")
            self._behind = time.time()  # until the first answer
            self._threads = [
                threading.Thread(target=self._watch_loop, name=f"fence-follow watch {self.prefix!r}", daemon=True),
                threading.Thread(target=self._apply_loop, name=f"fence-follow apply {self.prefix!r}", daemon=True),
            ]
        for t in self._threads:
            t.start()
        return self

    def stop(self, timeout: Optional[float] = 10.0) -> None:
        """stop ends the watch at once and waits, at most timeout seconds, for
        the advance under way to finish; the marks not yet advanced stay
        where they are."""
        self._stop.set()
        with self._lock:
            w = self._watch
            self._wake.notify_all()
        if w is not None:
            w.close()
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(timeout)
        self.stopped.set()

    @property
    def advanced(self) -> int:
        """advanced counts the marks advanced in the store, including those
        the store found at or past the token already."""
        with self._lock:
            return self._advanced

    @property
    def resyncs(self) -> int:
        """resyncs counts the times the follower read the state again because
        its watch could not resume (out_of_range: a restarted fenced, a new
        leader, or events it was too slow for)."""
        with self._lock:
            return self._resyncs

    def lag(self) -> float:
        """lag is how far behind the service the follower is, in seconds: the
        age of the oldest grant or closing it has received but not yet
        recorded in the store, counted from when the service recorded it
        (so it includes the watch's delivery, and the difference of the two
        machines' wall clocks), or, while its watch is broken or it reads the
        state again, the time since it lost the stream. 0 when it has
        recorded everything it received."""
        now = time.time()
        with self._lock:
            lag = now - self._behind if self._behind else 0.0
            for _, at in list(self._pending.values()) + list(self._inflight.values()):
                lag = max(lag, now - at)
        return max(lag, 0.0)

    def wait_caught_up(self, timeout: Optional[float] = None) -> bool:
        """wait_caught_up waits until the watch has been answered and its
        state read, and every mark received is recorded (lag() is 0):
        True, or False after timeout seconds."""
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            if self._caught_up.is_set() and self.lag() == 0.0:
                return True
            if self.stopped.is_set():
                return False
            if end is not None and time.monotonic() >= end:
                return False
            time.sleep(0.005)

    # The watch.

    def _watch_loop(self) -> None:
        try:
            self._follow()
        except BaseException as err:  # a bug: say so rather than die silently
            log.exception("follow %r: the watch thread failed", self.prefix)
            self.error = err if isinstance(err, FenceError) else FenceError(f"follow {self.prefix!r}: {err!r}")
        finally:
            if self.error is not None:
                self._stop.set()
                with self._lock:
                    self._wake.notify_all()
                self.stopped.set()

    def _follow(self) -> None:
        pos = 0           # where to resume; 0: from now, with the held leases
        resync = True     # read the state once the watch is answered
        first = True      # the state read at the start is no resync
        backoff = 0.05

        def progress(nxt: int) -> None:
            # The service has taken the watch's start: what happens from
            # here on is in the stream, so the state read now misses nothing.
            nonlocal pos, resync, first, backoff
            backoff = 0.05
            if resync:
                try:
                    self._resync(counted=not first)
                except FenceError as err:
                    if not self._stop.is_set():
                        log.warning("follow %r: could not read the state again; retrying: %s", self.prefix, err)
                    # A quiet stream may answer nothing more for long: end
                    # this watch, and read the state again at the next.
                    with self._lock:
                        w = self._watch
                    if w is not None:
                        w.close()
                    return
                resync, first = False, False
            pos = nxt
            self.position = nxt
            self._caught_up_now()

        while not self._stop.is_set():
            if resync:
                pos = 0
            try:
                w = self.client.watch(self.prefix, pos, include_held=(pos == 0), progress=progress)
            except FenceError as e:  # the client is closed
                self.error = e
                log.error("follow %r: stopped: %s", self.prefix, e)
                return
            with self._lock:
                self._watch = w
            if self._stop.is_set():
                w.close()
            err: Optional[FenceError] = None
            try:
                for e in w:
                    if e.position and not resync:
                        pos = e.position + 1
                        self.position = pos
                    self._event(e)
            except FenceError as e:
                err = e
            finally:
                w.close()
            if self._stop.is_set():
                return
            self._lost()
            if isinstance(err, MissedEventsError):
                log.warning("follow %r: the service no longer holds the events to resume from; reading the state again: %s", self.prefix, err)
                resync = True
            elif isinstance(err, InvalidError) or (err is not None and err.code in _FATAL):
                self.error = err
                log.error("follow %r: stopped: %s", self.prefix, err)
                return
            else:
                log.warning("follow %r: the watch broke at position %d; resuming: %s", self.prefix, pos, err)
                if pos == 0:
                    # It never started: what ended meanwhile is known only
                    # from the state.
                    resync = True
            sleep = random.random() * backoff + 0.001
            backoff = min(2 * backoff, 2.0)
            if self._stop.wait(sleep):
                return

    def _lost(self) -> None:
        self._caught_up.clear()
        with self._lock:
            if not self._behind:
                self._behind = time.time()

    def _caught_up_now(self) -> None:
        with self._lock:
            self._behind = 0.0
        self._caught_up.set()

    def _resync(self, counted: bool) -> None:
        """_resync reads the current state of the scopes under the prefix: a
        held scope advances to its lease's token (its last token may be
        above it, after a token floor), a free one whose lease it saw begin
        and not end, or, the first time, that the store has a mark for, to
        its last token (its closing, from log format 8 on)."""
        if counted:
            with self._lock:
                self._resyncs += 1
        now = time.time()
        held = {l.scope: l.token for l in self.client.list(self.prefix)}
        with self._lock:
            scopes = set(self._open)
        listing = self._read_store_scopes and not self._listed
        if listing:
            try:
                scopes.update(s for s in self.store.scopes(self.prefix) if s.startswith(self.prefix))
            except Exception as err:
                raise FenceError(f"follow {self.prefix!r}: listing the store's scopes: {err}") from err
        for scope, token in held.items():
            self._want(scope, token, now)
            self._track(scope, token, True)
        for scope in sorted(scopes - set(held)):
            if self._stop.is_set():
                return
            st = self.client.get(scope)
            token = st.lease.token if st.lease is not None else st.last_token
            self._want(scope, token, now)
            self._track(scope, token, st.lease is not None)
        # Only now: after a failed read the next try reads all again, the
        # store's scopes too.
        self._listed = self._listed or listing

    def _event(self, e: "Event") -> None:
        if e.kind in ("granted", "held"):
            self._want(e.scope, e.token, e.time)
            self._track(e.scope, e.token, True)
        elif e.kind in ("released", "expired"):
            # Under a log format before 8 nothing is closed: the token itself
            # still refuses every older one.
            self._want(e.scope, max(e.token, e.closing), e.time)
            self._track(e.scope, e.token, False)
        elif e.kind == "lost" and e.current:
            self._want(e.scope, e.current, e.time)

    def _want(self, scope: str, token: int, at: float) -> None:
        """_want records that scope's mark should be at least token."""
        if token <= 0 or token > MAX_TOKEN:
            return
        now = time.time()
        if not at or at > now:
            at = now
        with self._lock:
            p = self._pending.get(scope)
            if p is None or token > p[0]:
                self._pending[scope] = (token, p[1] if p is not None else at)  # the oldest wait counts
                self._wake.notify_all()

    def _track(self, scope: str, token: int, held: bool) -> None:
        """_track records that the lease with token began (held) or that
        every lease of scope up to token ended (not held): a scope is read
        at a resync while a lease it saw begin has not been seen to end."""
        with self._lock:
            t = self._open.get(scope)
            if held and 0 < token <= MAX_TOKEN and token > (t or 0):
                self._open[scope] = token
            elif not held and t is not None and t <= token:
                del self._open[scope]

    # The store.

    def _apply_loop(self) -> None:
        """_apply_loop records the pending marks in the store, oldest first,
        a batch at a time (one mark at a time for a store without
        advance_many); the marks of a failed advance go back in line after a
        pause."""
        while True:
            with self._lock:
                while not self._pending and not self._stop.is_set():
                    self._wake.wait()
                if self._stop.is_set():
                    return
                n = _BATCH if self._advance_many is not None else 1
                scopes = heapq.nsmallest(n, self._pending, key=lambda s: self._pending[s][1])
                batch = [(scope, self._pending.pop(scope)) for scope in scopes]
                self._inflight.update(batch)
            err: Optional[BaseException] = None
            try:
                if self._advance_many is not None:
                    self._advance_many([(scope, m[0]) for scope, m in batch])
                else:
                    self.store.advance(batch[0][0], batch[0][1][0])
            except Exception as e:
                err = e
            with self._lock:
                for scope, m in batch:
                    del self._inflight[scope]
                    if err is not None:
                        p = self._pending.get(scope)
                        # Back in line, merged with what came meanwhile; the
                        # oldest wait counts.
                        self._pending[scope] = (max(m[0], p[0]) if p else m[0], m[1])
                if err is None:
                    self._advanced += len(batch)
                    self.last_store_error = None
                else:
                    self.last_store_error = err
            if err is not None:
                if self._stop.is_set():
                    return
                scope, m = batch[0]
                more = f" and {len(batch) - 1} other scopes" if len(batch) > 1 else ""
                log.warning("follow %r: could not advance %r to %d%s; retrying: %s", self.prefix, scope, m[0], more, err)
                self._stop.wait(self.retry_interval * (1 + random.random()))
