"""The story of fence with a Python holder, as the TypeScript client's
test/story.test.ts plays it: holders take turns at one scope, each pausing
past its lease, and each one's late write is refused inside PostgreSQL
(fence_advance, SQLSTATE FN409) and Redis (FCALL fence_set, STALE) by the
guards that `fencectl guard install` put there. The values left are the
newer holder's.

Round 1: a Python holder's process is paused (SIGSTOP) while a Python
holder takes over and writes. Round 2: a shell writer with no fence
library (fencectl, psql, redis-cli: the TypeScript client's
test/story-writer.sh) pauses while a Python holder takes over and writes.

No clock decides the order. A pause ends only once the newer holder has
written, and the newer holder is granted the scope (waiting in line) only
once the paused one's lease expired at fenced, so every pause is past the
TTL however slow the machine. The waits are bounded at a minute or two.
"""

import json
import os
import re
import signal
import subprocess
import sys
import threading
import unittest

from support import HERE, REPO, SRC, Fenced, go_bin, install_guard, needs, until

import fence
from fence import Client, data_key, mark_key

TTL = 2.0  # every lease of the story but the newer holders'
WAIT = 60.0


class Lines:
    """Lines collects a child process's stdout and stderr as they come."""

    def __init__(self, proc):
        self.proc = proc
        self.out = []
        self.err = []
        for stream, into in ((proc.stdout, self.out), (proc.stderr, self.err)):
            threading.Thread(target=self._read, args=(stream, into), daemon=True).start()

    @staticmethod
    def _read(stream, into):
        for line in stream:
            into.append(line)

    def stdout(self):
        return "".join(self.out)

    def stderr(self):
        return "".join(self.err)


class TestStory(unittest.TestCase):
    def setUp(self):
        self.pg_url = needs("FENCE_TEST_POSTGRES", "psycopg2")
        self.redis_url = needs("FENCE_TEST_REDIS", "redis")
        import psycopg2
        import redis

        install_guard(self.pg_url)
        install_guard(self.redis_url)
        self.fenced = Fenced().start()
        self.addCleanup(self.fenced.stop)
        self.client = Client(self.fenced.url, holder="py-story")
        self.addCleanup(self.client.close)
        self.db = psycopg2.connect(self.pg_url)
        self.db.autocommit = True
        self.addCleanup(self.db.close)
        self.r = redis.Redis.from_url(self.redis_url, decode_responses=True)
        self.addCleanup(self.r.close)

        # The servers are shared with other runs: the scope, table and key are new.
        run = os.urandom(4).hex()
        self.scope = f"py/story/{run}"
        self.table = f"py_story_{run}"
        self.key = data_key(self.scope, "value")
        self.sql(f"CREATE TABLE {self.table} (id int PRIMARY KEY, value text NOT NULL)")
        self.sql(f"INSERT INTO {self.table} VALUES (1, 'none')")
        self.addCleanup(self.sql, "DELETE FROM fence_tokens WHERE scope = %s", (self.scope,))
        self.addCleanup(self.sql, f"DROP TABLE {self.table}")
        self.addCleanup(self.r.delete, mark_key(self.scope), self.key)
        self.env = {
            **os.environ,
            "PYTHONPATH": SRC,
            "FENCECTL": go_bin("fencectl"),
            "FENCE_ADDR": self.fenced.url,
            "FENCE_TEST_POSTGRES": self.pg_url,
            "FENCE_TEST_REDIS": self.redis_url,
            "STORY_SCOPE": self.scope,
            "STORY_TABLE": self.table,
        }

    def sql(self, text, args=None):
        with self.db.cursor() as cur:
            cur.execute(text, args)
            return cur.fetchall() if cur.description else None

    def values(self):
        return [self.sql(f"SELECT value FROM {self.table}")[0][0], self.r.get(self.key)]

    def update(self, value):
        return lambda cur: cur.execute(f"UPDATE {self.table} SET value = %s WHERE id = 1", (value,))

    def write(self, lease, value):
        fence.pg_fenced(self.db, lease, self.update(value))
        self.assertEqual(fence.redis_set(self.r, lease, self.key, value), "OK")

    def start(self, args, env):
        proc = subprocess.Popen(args, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        self.addCleanup(lambda: proc.poll() is None and (proc.kill(), proc.wait()))
        for s in (proc.stdin, proc.stdout, proc.stderr):
            self.addCleanup(s.close)
        return proc, Lines(proc)

    def test_a_paused_python_holder_is_refused_at_postgres_and_redis(self):
        detail = lambda p, h: f"scope={self.scope} presented_token={p} highest_token={h}"  # noqa: E731
        reported = self.fenced.metric("fence_stale_rejections_reported_total")

        # Round 1: the Python holder A, in a process of its own, writes A1
        # and is paused; the Python holder B takes over and writes B1.
        a, a_out = self.start([sys.executable, os.path.join(HERE, "story_holder.py")], {**self.env, "STORY_TTL": str(TTL)})
        until("A's first write", lambda: a_out.out or a.poll() is not None, WAIT)
        self.assertIsNone(a.poll(), f"A exited:\n{a_out.stderr()}")
        a_token = int(json.loads(a_out.out[0])["token"])
        self.assertEqual(self.values(), ["A1", "A1"])
        os.kill(a.pid, signal.SIGSTOP)
        try:
            # B waits in line: fenced grants it once A's lease expired, which
            # it does because A, stopped, cannot renew.
            b = self.client.acquire(self.scope, ttl=30, wait=True, timeout=WAIT)
            self.assertGreater(b.token, a_token)
            self.write(b, "B1")
        finally:
            os.kill(a.pid, signal.SIGCONT)
        a.stdin.write("go on\n")
        a.stdin.flush()
        self.assertEqual(a.wait(WAIT), 0, a_out.stderr())
        got = json.loads(a_out.out[1])
        # A runs again: its lease is lost (reading lost checks the clock),
        # the guards refuse to write under it, and the late write it sends
        # anyway with its old token is refused by both databases.
        self.assertTrue(got["lost"], got)
        self.assertIn(f"no renewal confirmed within the TTL of {TTL:g}s", got["error"])
        self.assertEqual(got["lease_write"], "LostError")
        for name in ("postgresql", "redis"):
            self.assertEqual(got[name]["presented"], str(a_token), name)
            self.assertEqual(got[name]["highest"], str(b.token), name)
            self.assertEqual(
                got[name]["message"], f'stale fencing token for "{self.scope}": token {a_token} was superseded by token {b.token}'
            )
        self.assertEqual(self.values(), ["B1", "B1"], "the row and the key hold B's value")
        # A's client reported both refusals to fenced before it exited.
        self.assertEqual(self.fenced.metric("fence_stale_rejections_reported_total"), reported + 2)

        # The same late write straight at the databases, without this package.
        import psycopg2

        with self.assertRaises(psycopg2.Error) as cm:
            with self.db.cursor() as cur:
                cur.execute("BEGIN")
                try:
                    cur.execute("SELECT fence_advance(%s, %s::bigint, 0)", (self.scope, a_token))
                finally:
                    cur.execute("ROLLBACK")
        self.assertEqual(cm.exception.pgcode, "FN409")
        self.assertEqual(cm.exception.diag.message_detail, detail(a_token, b.token) + " presented_seq=0 highest_seq=0")
        with self.assertRaises(Exception) as cm:
            self.r.execute_command("FCALL", "fence_set", 2, mark_key(self.scope), self.key, a_token, 0, "A1 late")
        self.assertEqual(str(cm.exception), f"STALE {detail(a_token, b.token)} presented_seq=0 highest_seq=0")
        self.assertEqual(self.values(), ["B1", "B1"])
        b.release()

        # Round 2: the shell writer P (fencectl, psql, redis-cli) holds the
        # scope, writes B2 and pauses, unrenewed; the Python holder C takes
        # over and writes C2; P's late write is refused by both databases.
        writer = os.path.join(REPO, "clients", "typescript", "test", "story-writer.sh")
        p, p_out = self.start(["bash", writer, "hold", "B2", "B2_late"], {**self.env, "STORY_TTL": f"{int(TTL * 1000)}ms"})
        until("P's first write", lambda: re.search(r"^wrote \d+$", p_out.stdout(), re.M) or p.poll() is not None, WAIT)
        self.assertIsNone(p.poll(), f"P exited before it wrote:\n{p_out.stderr()}")
        p_token = int(re.search(r"^wrote (\d+)$", p_out.stdout(), re.M).group(1))
        self.assertGreater(p_token, b.token)
        self.assertEqual(self.values(), ["B2", "B2"])
        c = self.client.acquire(self.scope, ttl=30, wait=True, timeout=WAIT)
        self.assertGreater(c.token, p_token)
        self.write(c, "C2")
        p.stdin.write("go on\n")
        p.stdin.flush()
        self.assertEqual(p.wait(2 * WAIT), 3, f"P's late write:\n{p_out.stderr()}")  # 1 | 2: both refused
        lines = p_out.stderr().rstrip("\n").split("\n")
        self.assertEqual(
            lines[0], f'ERROR:  FN409: stale fencing token for "{self.scope}": token {p_token} was superseded by token {c.token}'
        )
        self.assertEqual(lines[-1], f"redis-cli: STALE {detail(p_token, c.token)} presented_seq=0 highest_seq=0")
        self.assertEqual(self.values(), ["C2", "C2"], "the row and the key hold C's value")
        self.assertFalse(c.lost.is_set())
        c.release()


if __name__ == "__main__":
    unittest.main()
