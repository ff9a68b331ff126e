"""The client against a real fenced."""

import http.server
import os
import signal
import subprocess
import sys
import threading
import time
import unittest

from support import needs_cryptography, SRC, Fenced, until

import fence
from fence import Client, HeldError, InvalidError, LostError, UnavailableError, WaitTimeoutError

F: Fenced


def setUpModule():
    global F
    F = Fenced().start()


def tearDownModule():
    F.stop()


class TestLease(unittest.TestCase):
    def setUp(self):
        self.client = Client(F.url, holder="py-test")
        self.addCleanup(self.client.close)

    @needs_cryptography
    def test_acquire_signed_token_release(self):
        lease = self.client.acquire("py/acquire", ttl=5)
        self.assertIsInstance(lease.token, int)
        self.assertGreaterEqual(lease.token, 1)
        self.assertEqual(lease.holder, "py-test")
        self.assertEqual(lease.ttl, 5)
        self.assertFalse(lease.lost.is_set())
        self.assertIsNone(lease.error)
        tok = fence.parse_token(lease.token_text)
        self.assertEqual((tok.version, tok.scope, tok.value), (3, "py/acquire", lease.token))
        fence.RemoteKeySet(F.url).verify(tok)
        self.assertNotIn(lease.lease_id, repr(lease), "the lease ID is a secret")

        lease.release()
        self.assertTrue(lease.lost.is_set())
        self.assertIsInstance(lease.error, LostError)
        self.assertIn("released by its holder", str(lease.error))
        with self.assertRaises(LostError):
            lease.release()
        with self.client.acquire("py/acquire", ttl=5) as again:
            self.assertGreater(again.token, lease.token, "a new grant has a greater token")
        self.assertTrue(again.lost.is_set())
        self.assertEqual(F.rpc("Get", {"scope": "py/acquire"})[1].get("lease"), None, "released on exit")

    def test_errors_carry_the_servers_answer(self):
        a = self.client.acquire("py/held", ttl=5, holder="first")
        with self.assertRaises(HeldError) as cm:
            self.client.acquire("py/held", ttl=5)
        err = cm.exception
        self.assertEqual((err.scope, err.holder, err.token, err.code), ("py/held", "first", a.token, "aborted"))
        self.assertGreater(err.expires_in, 0)
        self.assertRegex(str(err), r'^acquire "py/held": scope "py/held" is held by "first" with token \d+')
        a.release()

        with self.assertRaises(InvalidError) as cm:
            self.client.acquire("py/bad scope")
        self.assertEqual(cm.exception.field, "scope")
        self.assertIn("has ' ' at byte", str(cm.exception))
        with self.assertRaises(InvalidError) as cm:
            self.client.acquire("py/ttl", ttl=0.05)
        self.assertEqual(cm.exception.field, "ttl")
        with self.assertRaises(InvalidError):
            self.client.acquire("py/ttl", ttl=-1)
        with self.assertRaises(UnavailableError):
            Client("http://127.0.0.1:9", retry_timeout=0).acquire("py/down")

    def test_wait_in_line(self):
        a = self.client.acquire("py/wait", ttl=5)
        got = []
        t = threading.Thread(target=lambda: got.append(self.client.acquire("py/wait", ttl=5, wait=True, timeout=30)))
        t.start()
        until("b waits in line", lambda: F.rpc("Get", {"scope": "py/wait"})[1].get("waiters") == 1)
        a.release()
        t.join(30)
        self.assertEqual(len(got), 1)
        self.assertGreater(got[0].token, a.token)

        # A wait that times out holds nothing, and leaves the line.
        start = time.monotonic()
        with self.assertRaises(WaitTimeoutError) as cm:
            self.client.acquire("py/wait", ttl=5, wait=True, timeout=0.5)
        self.assertIsInstance(cm.exception, TimeoutError)
        self.assertLess(time.monotonic() - start, 10)
        self.assertNotIn("waiters", F.rpc("Get", {"scope": "py/wait"})[1])
        got[0].release()

    def test_keep_alive_renews_and_refreshes_the_token_text(self):
        lease = self.client.acquire("py/keepalive", ttl=0.6)
        first = lease.valid_until
        time.sleep(2.0)  # more than three TTLs
        self.assertFalse(lease.lost.is_set(), lease.error)
        self.assertGreater(lease.valid_until, first + 1.0, "renewals moved the validity")
        self.assertGreater(lease.remaining(), 0)
        self.assertEqual(fence.parse_token(lease.token_text).value, lease.token)
        lease.release()

    def test_validity_counts_from_the_send_time_with_the_drift_margin(self):
        before = time.monotonic()
        lease = self.client.acquire("py/validity", ttl=10)
        after = time.monotonic()
        self.assertEqual(lease.drift_margin, 0.5)  # a twentieth of the TTL
        self.assertGreaterEqual(lease.valid_until, before + 10 - 0.5)
        self.assertLessEqual(lease.valid_until, after + 10 - 0.5)
        lease.release()
        small = self.client.acquire("py/validity", ttl=0.1)
        self.assertEqual(small.drift_margin, 0.005)  # at least 5 ms
        small.release()
        own = self.client.acquire("py/validity", ttl=10, drift_margin=2)
        self.assertLessEqual(own.valid_until, time.monotonic() + 8)
        own.release()

    def test_lost_when_fenced_refuses_a_renewal(self):
        a = self.client.acquire("py/lost", ttl=0.9)
        F.rpc("Release", {"scope": "py/lost", "leaseId": a.lease_id})  # behind its back
        b = Client(F.url, holder="b").acquire("py/lost", ttl=30)
        self.assertTrue(a.lost.wait(5), "lost is set at the next renewal")
        err = a.error
        self.assertIsInstance(err, LostError)
        self.assertEqual(err.code, "failed_precondition")
        self.assertEqual(err.current, b.token)
        self.assertEqual(err.token, a.token)
        self.assertIn("is lost", str(err))
        with self.assertRaises(LostError):
            a.raise_if_lost()
        b.release()

    def test_lost_when_the_validity_runs_out_without_a_confirmed_renewal(self):
        # fenced paused: renewals go unanswered, and the lease ends at its
        # local validity, on the monotonic clock, not before.
        own = Fenced().start()
        self.addCleanup(own.stop)
        c = Client(own.url, retry_timeout=0)
        lease = c.acquire("py/validity-out", ttl=1.0)
        valid_until = lease.valid_until
        os.kill(own.proc.pid, signal.SIGSTOP)
        try:
            self.assertTrue(lease.wait_lost(10))
            lost_at = time.monotonic()
            self.assertGreaterEqual(lost_at, valid_until)
            self.assertLess(lost_at, valid_until + 1.0, "set by the keep-alive thread at the deadline")
            self.assertIn("no renewal confirmed within the TTL of 1s (local validity ran out)", str(lease.error))
        finally:
            os.kill(own.proc.pid, signal.SIGCONT)

    def test_mark_lost_stops_renewing_without_releasing(self):
        a = self.client.acquire("py/mark", ttl=30)
        a.mark_lost("a guard said so")
        self.assertTrue(a.lost.is_set())
        self.assertIn("marked lost by its holder: a guard said so", str(a.error))
        self.assertEqual(F.rpc("Get", {"scope": "py/mark"})[1]["lease"]["token"], str(a.token), "not released")
        F.rpc("Release", {"scope": "py/mark", "leaseId": a.lease_id})

    def test_close_releases_every_lease(self):
        c = Client(F.url)
        leases = [c.acquire(f"py/close/{i}", ttl=30) for i in range(3)]
        c.close()
        for lease in leases:
            self.assertTrue(lease.lost.is_set())
            self.assertEqual(F.rpc("Get", {"scope": lease.scope})[1].get("lease"), None)
        with self.assertRaises(fence.FenceError):
            c.acquire("py/close/again")


class TestRetries(unittest.TestCase):
    def test_request_id_returns_the_first_grant_renewed(self):
        rid = os.urandom(16).hex()
        c1 = Client(F.url, holder="rid")
        c2 = Client(F.url, holder="rid")
        a = c1.acquire("py/rid", ttl=30, request_id=rid)
        b = c2.acquire("py/rid", ttl=30, request_id=rid)  # as a retry in another process would
        self.assertEqual((b.token, b.lease_id), (a.token, a.lease_id))
        a.release()
        with self.assertRaises(LostError):
            c2.acquire("py/rid", ttl=30, request_id=rid)  # its grant has ended
        c1.close()
        c2.close()

    def test_failover_to_the_next_node(self):
        # A node down (nothing listens on port 9) and one answering 503
        # without fenced's JSON, as a proxy before a dead node: the client
        # moves on to the node that answers, and stays there.
        class Proxy(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                self.send_response(503)
                self.send_header("Content-Type", "text/plain")
                self.end_headers()
                self.wfile.write(b"no upstream")

            def log_message(self, *a):
                pass

        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Proxy)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        self.addCleanup(srv.server_close)
        self.addCleanup(srv.shutdown)
        proxy = f"http://127.0.0.1:{srv.server_address[1]}"
        c = Client(f"http://127.0.0.1:9, {proxy}, {F.url.replace('http://', '')}")
        self.assertEqual(c.addresses[2], F.url)
        lease = c.acquire("py/failover", ttl=1)
        time.sleep(1.2)  # renewals go to the node that answered
        self.assertFalse(lease.lost.is_set(), lease.error)
        lease.release()
        c.close()
        with self.assertRaises(UnavailableError) as cm:
            Client([proxy], retry_timeout=0.2).acquire("py/failover")
        self.assertIn("503", str(cm.exception))


class TestReporting(unittest.TestCase):
    def test_report_rejections_and_the_reporter(self):
        c = Client(F.url)
        before = F.metric("fence_stale_rejections_reported_total")
        c.report_rejections("py-direct", [fence.Rejection("py/report", 41, 42)])
        self.assertEqual(F.metric("fence_stale_rejections_reported_total"), before + 1)

        r = fence.Reporter(c, "py-reporter", interval=3600, buffer=2)
        for i in range(3):
            r.rejected(fence.StaleError("py/report", 40 + i, 50))
        self.assertEqual(r.pending(), 2)
        dropped = F.metric("fence_stale_rejections_dropped_total")
        r.flush(10)
        self.assertEqual(r.pending(), 0)
        self.assertEqual(F.metric("fence_stale_rejections_reported_total"), before + 3)
        self.assertEqual(F.metric("fence_stale_rejections_dropped_total"), dropped + 1)

        # The background thread sends without being asked.
        quick = c.reporter("py-quick")
        quick._interval = 0.05
        quick.rejected(fence.StaleError("py/report", 1, 2))
        until("the reporter sent it", lambda: F.metric("fence_stale_rejections_reported_total") == before + 4)
        c.close()

    def test_a_failed_send_keeps_the_batch(self):
        r = fence.Reporter(Client("http://127.0.0.1:9", retry_timeout=0), "py-down", interval=3600)
        r.rejected(fence.StaleError("py/report", 1, 2))
        with self.assertRaises(UnavailableError):
            r.flush(1)
        self.assertEqual(r.pending(), 1)


class TestIdleProcess(unittest.TestCase):
    def test_a_process_that_holds_nothing_exits_by_itself(self):
        code = (
            "import sys, fence\n"
            "c = fence.Client(sys.argv[1])\n"
            "l = c.acquire('py/idle', ttl=30)\n"
            "l.release()\n"
            "l2 = c.acquire('py/idle', ttl=30)\n"
            "l2.mark_lost('done')\n"
            "print('done', flush=True)\n"
        )
        start = time.monotonic()
        r = subprocess.run([sys.executable, "-c", code, F.url], capture_output=True, text=True, timeout=30,
                           env={**os.environ, "PYTHONPATH": SRC})
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout, "done\n")
        self.assertLess(time.monotonic() - start, 10)
        F.rpc("Release", {"scope": "py/idle", "leaseId": "0" * 32})


if __name__ == "__main__":
    unittest.main()
