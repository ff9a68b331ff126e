"""Watch, Get and List against a real fenced, and the Follower keeping the
marks of the guards inside PostgreSQL and Redis (installed with fencectl
guard install) in step with it: a released or expired lease's late write
is refused before anyone else wrote with a follower and accepted without,
a mark is never moved back, a failed advance is retried, and the
follower resumes across a restart of fenced. The database tests need
make services' servers (FENCE_TEST_POSTGRES, FENCE_TEST_REDIS): without
them they skip, under CI=true they fail."""

import logging
import os
import queue
import signal
import threading
import time
import unittest
from concurrent.futures import ThreadPoolExecutor

from support import Fenced, Proxy, install_guard, mysql_server, needs, until

import fence
from fence import Client, Follower, InvalidError, MissedEventsError, StaleError

F: Fenced
RUN = os.urandom(4).hex()  # the servers are shared with other runs: every scope is new


def setUpModule():
    global F
    # The followers' warnings and errors (a broken watch, a failed advance,
    # a bad prefix) are what these tests cause on purpose.
    logging.getLogger("fence.follow").setLevel(logging.CRITICAL)
    F = Fenced().start()


def tearDownModule():
    F.stop()


def grant(f: Fenced, scope: str, ttl: str = "60s"):
    """grant acquires scope at f directly, with nobody to renew it: its
    token, its signed text and its lease ID."""
    status, body = f.rpc("Acquire", {"scope": scope, "holder": "py-follow", "ttl": ttl})
    assert status == 200, body
    return int(body["lease"]["token"]), body["lease"]["tokenText"], body["lease"]["leaseId"]


def release(f: Fenced, scope: str, lease_id: str) -> None:
    status, body = f.rpc("Release", {"scope": scope, "leaseId": lease_id})
    assert status == 200, body


class Collector:
    """Collector iterates a watch on a thread of its own, into a queue."""

    def __init__(self, w):
        self.w = w
        self.q: "queue.Queue" = queue.Queue()
        self.error = None
        self.t = threading.Thread(target=self.run, daemon=True)
        self.t.start()

    def run(self):
        try:
            for e in self.w:
                self.q.put(e)
        except BaseException as err:
            self.error = err

    def next(self, timeout=20.0):
        try:
            return self.q.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no event within {timeout}s (the watch's error: {self.error!r})") from None


def first(w, n=1, timeout=20.0):
    """first returns the first n events of w, or raises its error, within
    timeout seconds, and closes it."""
    col = Collector(w)
    try:
        end = time.monotonic() + timeout
        while col.q.qsize() < n and col.t.is_alive() and time.monotonic() < end:
            time.sleep(0.01)
        if col.q.qsize() < n and col.error is not None:
            raise col.error
        return [col.next(0) for _ in range(n)]
    finally:
        w.close()


class TestWatch(unittest.TestCase):
    def setUp(self):
        self.client = Client(F.url, holder="py-watch")
        self.addCleanup(self.client.close)

    def test_events_closing_tokens_resume_and_close(self):
        p = f"py/watch/{RUN}/"
        w = self.client.watch(p)
        self.addCleanup(w.close)
        col = Collector(w)
        until("the watch answered", lambda: w.next_position > 0)
        grant(F, f"py/elsewhere/{RUN}")  # another prefix: not in this stream
        a = self.client.acquire(p + "a", ttl=30)
        e = col.next()
        self.assertEqual((e.kind, e.scope, e.token, e.holder), ("granted", p + "a", a.token, "py-watch"))
        self.assertGreater(e.position, 0)
        self.assertEqual(e.ttl, 30.0)
        self.assertLess(abs(e.time - time.time()), 60)
        a.release()
        r = col.next()
        self.assertEqual((r.kind, r.scope, r.token), ("released", p + "a", a.token))
        self.assertEqual(r.closing, a.token + 1, "log format 8: the end of a lease consumes token N+1")
        self.assertGreater(r.position, e.position)
        self.assertEqual(r.lease_fingerprint, e.lease_fingerprint)
        self.assertEqual(w.next_position, r.position + 1)

        # A quiet stream closes at once, from another thread, without an error.
        time.sleep(0.2)
        w.close()
        col.t.join(5)
        self.assertFalse(col.t.is_alive(), "close() did not end the iteration")
        self.assertIsNone(col.error)
        self.assertTrue(col.q.empty(), "no event of another prefix")

        # Resumed where it was, it gets what happened meanwhile, in order.
        token, _, lease_id = grant(F, p + "b")
        release(F, p + "b", lease_id)
        got = first(self.client.watch(p, start_position=w.next_position), 2)
        self.assertEqual([(x.kind, x.scope, x.token, x.closing) for x in got],
                         [("granted", p + "b", token, 0), ("released", p + "b", token, token + 1)])
        self.assertEqual(got[0].position, w.next_position)

    def test_held_leases_and_the_end_frames_errors(self):
        p = f"py/held/{RUN}/"
        token, _, _ = grant(F, p + "x")
        h, = first(self.client.watch(p, include_held=True))
        self.assertEqual((h.kind, h.scope, h.token, h.position), ("held", p + "x", token, 0))

        with self.assertRaises(MissedEventsError) as cm:
            first(self.client.watch(p, start_position=1))
        self.assertEqual(cm.exception.code, "out_of_range")
        with self.assertRaises(InvalidError) as cm:
            first(self.client.watch("bad:prefix"))
        self.assertEqual(cm.exception.code, "invalid_argument")

    def test_a_node_that_stops_answering_ends_the_watch_instead_of_hanging(self):
        """A stopped fenced (SIGSTOP) keeps its connections open and quiet:
        its /healthz goes unanswered, the stream is cut and retried, and
        the watch ends with UnavailableError once the retries are spent."""
        g = Fenced().start()
        self.addCleanup(g.stop)
        c = Client(g.url, retry_timeout=2, call_timeout=1)
        self.addCleanup(c.close)
        w = c.watch("py/stopped/", health_interval=0.5)
        self.addCleanup(w.close)
        col = Collector(w)
        until("the watch answered", lambda: w.next_position > 0)
        g.proc.send_signal(signal.SIGSTOP)
        self.addCleanup(g.proc.send_signal, signal.SIGCONT)
        col.t.join(20)
        self.assertFalse(col.t.is_alive(), "the watch hangs on a stopped node")
        self.assertIsInstance(col.error, fence.UnavailableError)

    def test_closing_the_client_ends_its_watches(self):
        c = Client(F.url)
        w = c.watch(f"py/closing/{RUN}/")
        col = Collector(w)
        until("the watch answered", lambda: w.next_position > 0)
        c.close()
        col.t.join(5)
        self.assertFalse(col.t.is_alive(), "the watch outlived its client")
        self.assertIsNone(col.error)
        with self.assertRaises(fence.FenceError):
            c.watch("py/")

    def test_get_and_list(self):
        p = f"py/list/{RUN}/"
        free = self.client.get(p + "never")
        self.assertEqual((free.scope, free.lease, free.waiters), (p + "never", None, 0))
        self.assertGreater(free.last_token, 0, "a scope never granted: the token floor")
        toks = {s: grant(F, p + s) for s in ("b", "a", "c")}
        self.assertGreater(self.client.get(p + "never").last_token, 0)
        st = self.client.get(p + "a")
        self.assertEqual((st.lease.scope, st.lease.token, st.lease.holder), (p + "a", toks["a"][0], "py-follow"))
        self.assertEqual(st.lease.token_text, f"fence:v1:{p}a:{toks['a'][0]}")
        self.assertEqual(st.lease.ttl, 60.0)
        listed = self.client.list(p, page_size=2)  # two pages
        self.assertEqual([(x.scope, x.token) for x in listed], [(p + s, toks[s][0]) for s in ("a", "b", "c")])
        release(F, p + "a", toks["a"][2])
        self.assertEqual(self.client.get(p + "a").last_token, toks["a"][0] + 1)
        self.assertEqual([x.scope for x in self.client.list(p)], [p + "b", p + "c"])


class CountingClient(Client):
    """CountingClient is a Client that counts the Gets fenced answered."""

    gets = 0

    def get(self, scope, timeout=None):
        st = super().get(scope, timeout)
        self.gets += 1
        return st


def remembered(f: Follower) -> int:
    """remembered is how many scopes f keeps in memory: the leases it knows
    held, and the marks not yet recorded."""
    with f._lock:
        return len(set(f._open) | set(f._pending) | set(f._inflight))


class Marks:
    """Marks reads the marks of fence's guards in make services' PostgreSQL
    and Redis, with the guards installed."""

    def __init__(self, test: unittest.TestCase):
        self.pg_url = needs("FENCE_TEST_POSTGRES", "psycopg2")
        self.redis_url = needs("FENCE_TEST_REDIS", "redis")
        import psycopg2
        import redis

        install_guard(self.pg_url)
        install_guard(self.redis_url)
        self.db = psycopg2.connect(self.pg_url)
        self.db.autocommit = True
        test.addCleanup(self.db.close)
        self.r = redis.Redis.from_url(self.redis_url)
        test.addCleanup(self.r.close)

    def pg(self, scope: str) -> int:
        with self.db.cursor() as cur:
            cur.execute("SELECT token FROM fence_tokens WHERE scope = %s", (scope,))
            row = cur.fetchone()
        return int(row[0]) if row else 0

    def redis(self, scope: str) -> int:
        return int(self.r.hget(fence.mark_key(scope), "token") or 0)

    def write_pg(self, token_text: str) -> None:
        fence.pg_fenced(self.db, token_text, lambda cur: cur.execute("SELECT 1"))

    def write_redis(self, token_text: str) -> None:
        scope = fence.parse_token(token_text).scope
        fence.redis_set(self.r, token_text, fence.data_key(scope, "v"), token_text)


class Gated:
    """Gated is a store whose advances wait for gate, counting the marks
    each call carried."""

    def __init__(self, store):
        self.store = store
        self.calls = []
        self.entered = threading.Event()
        self.gate = threading.Event()

    def advance(self, scope, token):
        return self.advance_many([(scope, token)])[0]

    def advance_many(self, marks):
        self.calls.append(len(marks))
        self.entered.set()
        if not self.gate.wait(20):
            raise AssertionError("the gate never opened")
        return self.store.advance_many(marks)

    def scopes(self, prefix):
        return self.store.scopes(prefix)


class TestFollower(unittest.TestCase):
    def setUp(self):
        self.m = Marks(self)
        self.client = Client(F.url, holder="py-follower")
        self.addCleanup(self.client.close)

    def follow(self, client, store, prefix):
        f = Follower(client, store, prefix).start()
        self.addCleanup(f.stop)
        self.assertTrue(f.wait_caught_up(20), "the follower never caught up")
        return f

    def test_a_late_write_after_the_lease_ended_is_refused_with_a_follower_and_accepted_without(self):
        on, off = f"py/follow/{RUN}/on/", f"py/follow/{RUN}/off/"
        pg = fence.PgMarks(self.m.pg_url)
        self.addCleanup(pg.close)
        self.follow(self.client, pg, on)
        self.follow(self.client, fence.RedisMarks(self.m.r), on)
        for end in ("released", "expired"):
            for prefix in (on, off):
                with self.subTest(end=end, followed=prefix == on):
                    scope = prefix + end
                    token, text, lease_id = grant(F, scope, "60s" if end == "released" else "0.5s")
                    self.m.write_pg(text)
                    self.m.write_redis(text)
                    if end == "released":
                        release(F, scope, lease_id)
                    until("the lease's end", lambda: self.client.get(scope).lease is None)
                    if prefix == on:
                        until("the marks at the closing token",
                              lambda: (self.m.pg(scope), self.m.redis(scope)) == (token + 1, token + 1))
                        # The old holder's delayed writes; nobody else wrote.
                        with self.assertRaises(StaleError) as cm:
                            self.m.write_pg(text)
                        self.assertEqual((cm.exception.presented, cm.exception.highest), (token, token + 1))
                        with self.assertRaises(StaleError) as cm:
                            self.m.write_redis(text)
                        self.assertEqual((cm.exception.presented, cm.exception.highest), (token, token + 1))
                        # The next holder is above the closing, and writes.
                        nxt, ntext, _ = grant(F, scope)
                        self.assertEqual(nxt, token + 2)
                        self.m.write_pg(ntext)
                        self.m.write_redis(ntext)
                    else:
                        time.sleep(0.3)  # as long as a follower would have had
                        self.m.write_pg(text)  # the window a follower closes
                        self.m.write_redis(text)
                        self.assertEqual((self.m.pg(scope), self.m.redis(scope)), (token, token))

    def test_a_lease_that_ended_before_the_follower_started_is_closed_at_its_start(self):
        p = f"py/before/{RUN}/"
        token, text, lease_id = grant(F, p + "s")
        self.m.write_pg(text)
        self.m.write_redis(text)
        release(F, p + "s", lease_id)
        pg = fence.PgMarks(self.m.pg_url)
        self.addCleanup(pg.close)
        fp = self.follow(self.client, pg, p)
        fr = self.follow(self.client, fence.RedisMarks(self.m.r), p)
        self.assertEqual((self.m.pg(p + "s"), self.m.redis(p + "s")), (token + 1, token + 1))
        self.assertEqual((fp.resyncs, fr.resyncs), (0, 0), "reading the state at the start is no resync")
        with self.assertRaises(StaleError):
            self.m.write_pg(text)

    def test_never_moves_a_mark_back(self):
        p = f"py/back/{RUN}/"
        pg = fence.PgMarks(self.m.pg_url)
        self.addCleanup(pg.close)
        rm = fence.RedisMarks(self.m.r)
        high = (1 << 62) + 5  # another writer's token, far above fenced's
        self.m.write_pg(f"fence:v1:{p}high:{high}")
        self.m.write_redis(f"fence:v1:{p}high:{high}")
        self.assertFalse(pg.advance(p + "high", 7))
        self.assertFalse(rm.advance(p + "high", 7))
        self.assertTrue(pg.advance(p + "high", high), "at the mark: accepted, unchanged")
        self.assertTrue(rm.advance(p + "high", high), "at the mark: accepted, unchanged")
        self.assertEqual(sorted(self.m.r.keys("*{" + p + "high}*")),
                         sorted([fence.mark_key(p + "high").encode(), fence.data_key(p + "high", "v").encode()]),
                         "the writer's key and the mark: fence_advance writes nothing else")
        fp = self.follow(self.client, pg, p)
        fr = self.follow(self.client, rm, p)
        token, _, lease_id = grant(F, p + "high")
        release(F, p + "high", lease_id)
        later, _, _ = grant(F, p + "later")
        until("the later scope's marks", lambda: (self.m.pg(p + "later"), self.m.redis(p + "later")) == (later, later))
        self.assertTrue(fp.wait_caught_up(10) and fr.wait_caught_up(10))
        self.assertEqual((self.m.pg(p + "high"), self.m.redis(p + "high")), (high, high))
        self.assertGreaterEqual(fp.advanced, 3)
        self.assertGreaterEqual(fr.advanced, 3)

    def test_a_failed_advance_is_retried(self):
        """The follower's PostgreSQL connection is terminated between the
        grant and the release: the closing's first advance fails, and is
        retried on a new connection."""
        import psycopg2

        p = f"py/retry/{RUN}/"
        app = f"fence-follow-{RUN}"
        pg = fence.PgMarks(lambda: psycopg2.connect(self.m.pg_url, application_name=app))
        self.addCleanup(pg.close)
        f = self.follow(self.client, pg, p)
        token, _, lease_id = grant(F, p + "s")
        until("the grant's mark", lambda: self.m.pg(p + "s") == token)
        with self.m.db.cursor() as cur:
            cur.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s", (app,))
            self.assertEqual(cur.rowcount, 1)
        release(F, p + "s", lease_id)
        until("the closing recorded after a retry", lambda: self.m.pg(p + "s") == token + 1)
        self.assertTrue(f.wait_caught_up(10))
        self.assertEqual(f.lag(), 0.0)
        self.assertIsNone(f.last_store_error)

    def test_advance_many_answers_each_mark_and_never_moves_one_back(self):
        p = f"py/many/{RUN}/"
        pg = fence.PgMarks(self.m.pg_url)
        self.addCleanup(pg.close)
        high = (1 << 62) + 5
        self.m.write_pg(f"fence:v1:{p}high:{high}")
        self.m.write_redis(f"fence:v1:{p}high:{high}")
        for name, store, read in (("postgresql", pg, self.m.pg), ("redis", fence.RedisMarks(self.m.r), self.m.redis)):
            with self.subTest(store=name):
                marks = [(p + "high", 7), (p + "a", 3), (p + "b", 5), (p + "a2", 9)]
                self.assertEqual(store.advance_many(marks), [False, True, True, True])
                self.assertEqual([read(s) for s, _ in marks], [high, 3, 5, 9])
                self.assertEqual(store.advance_many([(p + "a", 2), (p + "b", 5)]), [False, True], "at the mark: accepted, unchanged")
                self.assertEqual(store.advance_many([]), [])
                for bad in ([(p + "c", 4), (p + "d", 0)], [(p + "c", 4), (p + "d", 1 << 63)]):
                    with self.assertRaises(InvalidError):
                        store.advance_many(bad)
                    self.assertEqual((read(p + "c"), read(p + "d")), (0, 0), "bad input changes nothing")
        with self.assertRaises(InvalidError):
            pg.advance_many([(p + "c", 4), (p + "c", 5)])
        self.assertEqual(self.m.pg(p + "c"), 0)

    def test_advance_many_when_a_writer_moves_a_mark_past_meanwhile(self):
        """A writer's uncommitted advance holds a scope's row when the batch
        reads it: the batch's advance waits, finds the mark past when the
        writer commits (FN409), and each mark goes again on its own."""
        import psycopg2

        p = f"py/raced/{RUN}/"
        app = f"fence-many-{RUN}"
        pg = fence.PgMarks(lambda: psycopg2.connect(self.m.pg_url, application_name=app))
        self.addCleanup(pg.close)
        writer = psycopg2.connect(self.m.pg_url)
        self.addCleanup(writer.close)
        self.assertTrue(pg.advance(p + "raced", 3))
        with writer.cursor() as cur:
            cur.execute("SELECT fence_advance(%s::text, 100::bigint, 0::bigint)", (p + "raced",))
        out: "queue.Queue" = queue.Queue()
        t = threading.Thread(target=lambda: out.put(pg.advance_many([(p + "other", 4), (p + "raced", 50)])), daemon=True)
        t.start()

        def waiting() -> bool:
            with self.m.db.cursor() as cur:
                cur.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s AND wait_event_type = 'Lock'", (app,))
                return cur.fetchone()[0] == 1

        until("the batch waiting for the writer's row", waiting)
        writer.commit()
        self.assertEqual(out.get(timeout=20), [True, False])
        self.assertEqual((self.m.pg(p + "other"), self.m.pg(p + "raced")), (4, 100))

    def test_the_marks_that_came_while_the_store_was_busy_go_in_one_batch(self):
        """The store's first advance is held until twenty more grants wait:
        they go in one advance_many call (one transaction, one pipeline),
        as Go's follower advances several scopes at once, not twenty."""
        pg = fence.PgMarks(self.m.pg_url)
        self.addCleanup(pg.close)
        for name, store, read in (("postgresql", pg, self.m.pg), ("redis", fence.RedisMarks(self.m.r), self.m.redis)):
            with self.subTest(store=name):
                p = f"py/batch/{RUN}/{name}/"
                gated = Gated(store)
                self.addCleanup(gated.gate.set)
                f = self.follow(self.client, gated, p)
                tokens = {p + "0": grant(F, p + "0")[0]}
                self.assertTrue(gated.entered.wait(20), "the first grant's advance never came")
                for i in range(1, 21):
                    tokens[p + str(i)] = grant(F, p + str(i))[0]
                until("twenty marks waiting behind the first", lambda: len(f._pending) == 20)
                gated.gate.set()
                self.assertTrue(f.wait_caught_up(20))
                self.assertEqual(gated.calls, [1, 20])
                self.assertEqual(f.advanced, 21)
                self.assertEqual({s: read(s) for s in tokens}, tokens)

    def test_resumes_within_a_term_and_across_a_restart_of_fenced(self):
        g = Fenced().start()
        self.addCleanup(g.stop)
        proxy = Proxy(g.url[len("http://"):])
        self.addCleanup(proxy.close)
        c = Client(proxy.url, holder="py-follower", retry_timeout=1)  # the follower's client, through the proxy
        self.addCleanup(c.close)
        p = f"py/restart/{RUN}/"
        rm = fence.RedisMarks(self.m.r)
        f = self.follow(c, rm, p)
        self.assertEqual(f.resyncs, 0)
        a, _, a_id = grant(g, p + "a")
        b, b_text, b_id = grant(g, p + "b")
        until("a's and b's grants", lambda: (self.m.redis(p + "a"), self.m.redis(p + "b")) == (a, b))

        # Cut off within a term: the release is in the leader's events,
        # and the resumed watch brings it.
        proxy.cut()
        until("the follower notices", lambda: f.lag() > 0)
        release(g, p + "a", a_id)
        time.sleep(0.3)
        self.assertEqual(self.m.redis(p + "a"), a)
        proxy.mend()
        until("a's closing after the follower resumed", lambda: self.m.redis(p + "a") == a + 1)
        self.assertEqual(f.resyncs, 0, "a cut within a term is resumed, not read again")

        # Cut off across a restart: the new term's leader has none of the
        # old one's events; b is released before the follower is back, so
        # only the state (Get) tells of it.
        proxy.cut()
        g.restart()
        release(g, p + "b", b_id)
        closing = Client(g.url).get(p + "b").last_token
        self.assertGreater(closing, b)
        high = (1 << 62) + 5
        self.m.write_redis(f"fence:v1:{p}a:{high}")  # another writer, far ahead
        proxy.mend()
        until("b's closing, read from the state", lambda: self.m.redis(p + "b") == closing, timeout=40)
        self.assertGreaterEqual(f.resyncs, 1)
        with self.assertRaises(StaleError):
            self.m.write_redis(b_text)  # b's late write, before anyone else wrote
        self.assertTrue(f.wait_caught_up(20))
        self.assertEqual(self.m.redis(p + "a"), high, "the resync moved a mark back")
        # And it follows the new term's stream.
        d, _, _ = grant(g, p + "d")
        until("d's grant, from the new stream", lambda: self.m.redis(p + "d") == d)
        f.stop()
        self.assertTrue(f.stopped.is_set())
        self.assertFalse(any(t.is_alive() for t in f._threads), "stop() left a thread running")
        self.assertIsNone(f.error)

    def test_forgets_each_short_lived_scope_once_closed_and_resyncs_without_reading_them(self):
        """A long-lived follower over many short-lived scopes (one per job)
        remembers the leases held, not every scope it saw; across a restart
        of fenced its resync Gets at most the leases it knew held, not every
        scope it saw or the store has a mark for, and still closes the one
        that ended meanwhile."""
        g = Fenced().start()
        self.addCleanup(g.stop)
        proxy = Proxy(g.url[len("http://"):])
        self.addCleanup(proxy.close)
        c = CountingClient(proxy.url, holder="py-follower", retry_timeout=1)  # the follower's, through the proxy
        self.addCleanup(c.close)
        p = f"py/jobs/{RUN}/"
        self.addCleanup(lambda: [self.m.r.delete(k) for k in self.m.r.scan_iter(match=fence.mark_key(p + "*"))])
        f = self.follow(c, fence.RedisMarks(self.m.r), p)

        # Three leases stay held; 2,000 jobs each take a scope of their own
        # and release it, 8 at a time.
        held, jobs = 3, 2000
        kept = [grant(g, f"{p}held-{i}") for i in range(held)]
        tokens = {}

        def job(i: int) -> None:
            token, _, lease_id = grant(g, f"{p}{i}")
            tokens[i] = token
            release(g, f"{p}{i}", lease_id)

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(job, range(jobs)))
        until("every job's closing recorded",
              lambda: all(self.m.redis(f"{p}{i}") == t + 1 for i, t in tokens.items()), timeout=60)
        self.assertTrue(f.wait_caught_up(20))
        until(f"the follower to remember the {held} held leases only, not 2,000 closed scopes", lambda: remembered(f) == held)

        # Cut off across a restart: the new term's leader has none of the
        # old one's events. A held lease is released meanwhile.
        proxy.cut()
        g.restart()
        release(g, f"{p}held-0", kept[0][2])
        closing = Client(g.url).get(f"{p}held-0").last_token
        c.gets = 0
        proxy.mend()
        until("the released lease's closing, read from the state", lambda: self.m.redis(f"{p}held-0") == closing, timeout=40)
        self.assertTrue(f.wait_caught_up(20))
        self.assertGreaterEqual(f.resyncs, 1)
        # Each read of the state (a failed one too) Gets the leases it knew
        # held, at most: not the 2,000 scopes of the jobs.
        self.assertLessEqual(c.gets, held * f.resyncs,
                             "Gets in the resyncs: want at most the leases known held, not one per scope ever seen")
        until(f"the follower to remember the {held - 1} leases still held", lambda: remembered(f) == held - 1)

    def test_a_bad_prefix_or_a_closed_client_stops_it(self):
        f = Follower(self.client, fence.RedisMarks(self.m.r), "bad:prefix").start()
        self.addCleanup(f.stop)
        self.assertTrue(f.stopped.wait(20))
        self.assertIsInstance(f.error, InvalidError)

        c = Client(F.url)
        g = self.follow(c, fence.RedisMarks(self.m.r), f"py/closed/{RUN}/")
        c.close()
        self.assertTrue(g.stopped.wait(20), "a follower whose client closed runs on")
        self.assertIn("closed", str(g.error))


class TestMySQLFollower(unittest.TestCase):
    """The Follower over make services' MariaDB, through MySQLMarks."""

    def setUp(self):
        self.args, url = mysql_server()
        import pymysql

        install_guard(url)
        self.db = pymysql.connect(autocommit=True, **self.args)
        self.addCleanup(self.db.close)
        self.marks = fence.MySQLMarks(self.args)
        self.addCleanup(self.marks.close)
        self.client = Client(F.url, holder="py-mysql-follower")
        self.addCleanup(self.client.close)

    def mark(self, scope: str) -> int:
        with self.db.cursor() as cur:
            cur.execute("SELECT token FROM fence_tokens WHERE scope = %s", (scope,))
            row = cur.fetchone()
        return int(row[0]) if row else 0

    def write(self, token_text: str) -> None:
        fence.mysql_fenced(self.db, token_text, lambda cur: cur.execute("SELECT 1"))

    def test_advance_and_advance_many_never_move_a_mark_back(self):
        p = f"py/mysql-many/{RUN}/"
        high = (1 << 62) + 5
        self.write(f"fence:v1:{p}high:{high}")
        self.assertFalse(self.marks.advance(p + "high", 7))
        self.assertTrue(self.marks.advance(p + "high", high), "at the mark: accepted, unchanged")
        marks = [(p + "high", 7), (p + "a", 3), (p + "b", 5)]
        self.assertEqual(self.marks.advance_many(marks), [False, True, True])
        self.assertEqual([self.mark(s) for s, _ in marks], [high, 3, 5])
        self.assertEqual(sorted(self.marks.scopes(p)), [p + "a", p + "b", p + "high"])
        self.assertEqual(self.marks.advance_many([]), [])
        for bad in ([(p + "c", 4), (p + "d", 0)], [(p + "c", 4), (p + "d", 1 << 63)], [(p + "c", 4), ("bad scope", 1)]):
            with self.assertRaises(InvalidError):
                self.marks.advance_many(bad)
            self.assertEqual((self.mark(p + "c"), self.mark(p + "d")), (0, 0), "bad input changes nothing")
        with self.assertRaises(InvalidError):
            fence.MySQLMarks(self.args, database="a.b")

    def test_a_late_write_after_the_lease_ended_is_refused_and_marks_go_in_batches(self):
        p = f"py/mysql-follow/{RUN}/"
        gated = Gated(self.marks)
        self.addCleanup(gated.gate.set)
        f = Follower(self.client, gated, p).start()
        self.addCleanup(f.stop)
        self.assertTrue(f.wait_caught_up(20), "the follower never caught up")
        token, text, lease_id = grant(F, p + "0")
        self.assertTrue(gated.entered.wait(20), "the first grant's advance never came")
        tokens = {p + "0": token}
        for i in range(1, 21):
            tokens[p + str(i)] = grant(F, p + str(i))[0]
        until("twenty marks waiting behind the first", lambda: len(f._pending) == 20)
        gated.gate.set()
        self.assertTrue(f.wait_caught_up(20))
        self.assertEqual(gated.calls, [1, 20])
        self.assertEqual({s: self.mark(s) for s in tokens}, tokens)

        self.write(text)
        release(F, p + "0", lease_id)
        until("the closing token's mark", lambda: self.mark(p + "0") == token + 1)
        with self.assertRaises(StaleError) as cm:
            self.write(text)  # the old holder's delayed write; nobody else wrote
        self.assertEqual((cm.exception.presented, cm.exception.highest), (token, token + 1))

    def test_a_failed_advance_is_retried_on_a_new_connection(self):
        import pymysql

        p = f"py/mysql-retry/{RUN}/"
        conns = []

        def connect():
            c = pymysql.connect(**self.args)
            conns.append(c)
            return c

        marks = fence.MySQLMarks(connect)
        self.addCleanup(marks.close)
        f = Follower(self.client, marks, p).start()
        self.addCleanup(f.stop)
        self.assertTrue(f.wait_caught_up(20))
        token, _, lease_id = grant(F, p + "s")
        until("the grant's mark", lambda: self.mark(p + "s") == token)
        with self.db.cursor() as cur:
            cur.execute("KILL %s", (conns[-1].thread_id(),))
        release(F, p + "s", lease_id)
        until("the closing recorded after a retry", lambda: self.mark(p + "s") == token + 1)
        self.assertTrue(f.wait_caught_up(10))
        self.assertEqual(len(conns), 2, "one new connection after the killed one")
        self.assertIsNone(f.last_store_error)


if __name__ == "__main__":
    unittest.main()
