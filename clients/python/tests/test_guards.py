"""The PostgreSQL, MySQL (MariaDB) and Redis guards, through fence's guard
inside each (installed with fencectl guard install), with leases of a real
fenced, through psycopg2, PyMySQL and redis-py. They need make services'
servers (FENCE_TEST_POSTGRES, FENCE_TEST_MYSQL, FENCE_TEST_REDIS) and
Debian's python3-psycopg2, python3-pymysql and python3-redis: without them
the tests skip, under CI=true they fail."""

import os
import unittest
import urllib.parse

from support import Fenced, install_guard, mysql_server, needs, until

import fence
from fence import Client, FenceError, InvalidError, LostError, StaleError, Token, data_key, mark_key

F: Fenced
RUN = os.urandom(4).hex()  # the servers are shared with other runs: every scope is new


def setUpModule():
    global F
    F = Fenced().start()


def tearDownModule():
    F.stop()


class Guarded(unittest.TestCase):
    def setUp(self):
        self.client = Client(F.url, holder="py-db")
        self.addCleanup(self.client.close)

    def take_over(self, first):
        """take_over gives first's scope to a second holder behind the first
        one's back, released at fenced by ID while the first still believes
        it holds it (its next renewal is seconds away), as a paused holder
        would."""
        F.rpc("Release", {"scope": first.scope, "leaseId": first.lease_id})
        return self.client.acquire(first.scope, ttl=30)

    def assertStale(self, cm, presented, highest, seqs=None):
        err = cm.exception
        self.assertIsInstance(err, StaleError)
        self.assertEqual((err.presented, err.highest), (presented, highest))
        if seqs is not None:
            self.assertEqual((err.presented_seq, err.highest_seq), seqs)

    def reported(self):
        return F.metric("fence_stale_rejections_reported_total")


class TestPostgres(Guarded):
    def setUp(self):
        super().setUp()
        url = needs("FENCE_TEST_POSTGRES", "psycopg2")
        import psycopg2

        install_guard(url)
        self.url = url
        self.db = psycopg2.connect(url)
        self.addCleanup(self.db.close)

    def sql(self, text):
        with self.db.cursor() as cur:
            cur.execute(text)
        self.db.commit()

    def made(self, create, drop):
        """made runs create now and drop when the test ends."""
        self.sql(create)
        self.addCleanup(self.sql, drop)

    def table(self, name):
        t = f"py_{name}_{RUN}"
        self.made(f"CREATE TABLE {t} (id int PRIMARY KEY, owner text NOT NULL)", f"DROP TABLE {t}")
        return t

    def test_a_superseded_holders_write_is_refused_rolled_back_and_reported(self):
        t = self.table("orders")

        def write(owner):
            return lambda cur: cur.execute(
                f"INSERT INTO {t} VALUES (1, %s) ON CONFLICT (id) DO UPDATE SET owner = excluded.owner", (owner,)
            )

        a = self.client.acquire(f"py/pg/{RUN}", ttl=30)
        fence.pg_fenced(self.db, a, write("a"))
        b = self.take_over(a)
        fence.pg_fenced(self.db, b, write("b"))
        self.assertFalse(a.lost.is_set(), "a does not know yet")

        before = self.reported()
        with self.assertRaises(StaleError) as cm:
            fence.pg_fenced(self.db, a, write("a, late"))
        self.assertStale(cm, a.token, b.token)
        self.assertEqual(str(cm.exception), f'stale fencing token for "py/pg/{RUN}": token {a.token} was superseded by token {b.token}')
        self.assertTrue(a.lost.is_set(), "a stale answer marks the lease lost")
        self.assertIsInstance(a.error, LostError)
        with self.db.cursor() as cur:
            cur.execute(f"SELECT owner FROM {t}")
            self.assertEqual(cur.fetchall(), [("b",)], "the late write was rolled back")
        self.db.rollback()
        with self.assertRaises(LostError):
            fence.pg_fenced(self.db, a, write("again"))  # a lost lease does not even try
        self.client.reporter("postgresql").flush(10)
        self.assertEqual(self.reported(), before + 1, "the client reported the rejection to fenced")

        # The return value, and autocommit connections (an explicit BEGIN).
        self.db.autocommit = True
        got = fence.pg_fenced(self.db, b, lambda cur: (write("b2")(cur), "done")[1])
        self.assertEqual(got, "done")
        with self.assertRaises(StaleError):
            fence.pg_fenced(self.db, a.token_text, write("a, later"))
        with self.db.cursor() as cur:
            cur.execute(f"SELECT owner FROM {t}")
            self.assertEqual(cur.fetchall(), [("b2",)])
        self.db.autocommit = False
        b.release()

    def test_sequences_big_values_and_malformed_writes(self):
        def tok(value, scope=f"py/pg-seq/{RUN}"):
            return Token(1, scope, value)

        def advance(t, seq=0):
            with self.db.cursor() as cur:
                try:
                    fence.pg_advance(cur, t, seq)
                    self.db.commit()
                finally:
                    self.db.rollback()

        advance(tok(9007199254740993), 5)
        advance(tok(9007199254740993), 5)  # an equal sequence passes
        with self.assertRaises(StaleError) as cm:
            advance(tok(9007199254740993), 4)
        self.assertStale(cm, 9007199254740993, 9007199254740993, (4, 5))
        # 2^53 and 2^53+1 are one double: as ints they stay apart.
        with self.assertRaises(StaleError) as cm:
            advance(tok(9007199254740992))
        self.assertStale(cm, 9007199254740992, 9007199254740993)
        advance(tok(fence.MAX_TOKEN))
        with self.assertRaises(InvalidError):
            advance(tok(1, "bad scope"))  # FN400
        with self.assertRaises(InvalidError):
            fence.pg_advance(self.db, "fence:v1:x:1", seq=-1)

    def test_a_schema_of_its_own(self):
        import psycopg2

        schema = f"py_fence_{RUN}"
        self.made(f"CREATE SCHEMA {schema}", f"DROP SCHEMA {schema} CASCADE")
        sep = "&" if "?" in self.url else "?"
        install_guard(f"{self.url}{sep}options={urllib.parse.quote('-csearch_path=' + schema)}")
        scope = f"py/pg-schema/{RUN}"
        fence.pg_fenced(self.db, f"fence:v1:{scope}:7", lambda cur: None, schema=schema)
        with self.db.cursor() as cur:
            cur.execute(f"SELECT token FROM {schema}.fence_tokens WHERE scope = %s", (scope,))
            self.assertEqual(cur.fetchall(), [(7,)], "the mark is in the schema's own table")
        self.db.rollback()
        with self.assertRaises(StaleError):
            fence.pg_fenced(self.db, f"fence:v1:{scope}:6", lambda cur: None, schema=schema)
        self.assertEqual(self.db.info.transaction_status, psycopg2.extensions.TRANSACTION_STATUS_IDLE, "rolled back")

    def test_a_bad_schema_is_refused_before_any_query(self):
        class Recorder:
            autocommit = False

            def __init__(self):
                self.texts = []

            def cursor(self):
                return self

            def execute(self, text, args=None):
                self.texts.append(text)

            def close(self):
                pass

        for schema in ("", "fence.x", 'fence"; DROP TABLE fence_tokens; --', "1fence", "a" * 64, "fen ce"):
            db = Recorder()
            with self.assertRaises(InvalidError, msg=schema):
                fence.pg_advance(db, "fence:v1:orders:42", schema=schema)
            with self.assertRaises(InvalidError, msg=schema):
                fence.pg_fenced(db, "fence:v1:orders:42", lambda cur: None, schema=schema)
            self.assertEqual(db.texts, [], schema)
        db = Recorder()
        fence.pg_advance(db, "fence:v1:orders:42", 3, schema="fence")
        self.assertEqual(db.texts, ['SELECT "fence".fence_advance(%s::text, %s::bigint, %s::bigint)'])


class TestRedis(Guarded):
    def setUp(self):
        super().setUp()
        url = needs("FENCE_TEST_REDIS", "redis")
        import redis

        install_guard(url)
        self.r = redis.Redis.from_url(url, decode_responses=True)
        self.addCleanup(self.r.close)

    def test_a_superseded_holders_write_is_refused_changes_nothing_and_is_reported(self):
        scope = f"py/redis/{RUN}"
        key = data_key(scope, "owner")
        self.addCleanup(lambda: self.r.delete(mark_key(scope), key))

        a = self.client.acquire(scope, ttl=30)
        self.assertEqual(fence.redis_set(self.r, a, key, "a"), "OK")
        b = self.take_over(a)
        self.assertEqual(fence.redis_set(self.r, b, key, "b"), "OK")
        before = self.reported()
        with self.assertRaises(StaleError) as cm:
            fence.redis_set(self.r, a, key, "a, late")
        self.assertStale(cm, a.token, b.token)
        self.assertTrue(a.lost.is_set(), "a stale answer marks the lease lost")
        self.assertEqual(self.r.get(key), "b")
        with self.assertRaises(LostError):
            fence.redis_set(self.r, a, key, "again")
        self.client.reporter("redis").flush(10)
        self.assertEqual(self.reported(), before + 1, "the client reported the rejection to fenced")

        # The other calls, sequences, SET's options, and a key outside the scope.
        self.assertEqual(fence.redis_hset(self.r, b, data_key(scope, "h"), {"f": "1"}, seq=3), 1)
        with self.assertRaises(StaleError) as cm:
            fence.redis_incrby(self.r, b, data_key(scope, "n"), 1, seq=2)
        self.assertStale(cm, b.token, b.token, (2, 3))
        self.assertFalse(b.lost.is_set(), "a sequence refused under its own token does not end the lease")
        self.assertEqual(fence.redis_incrby(self.r, b, data_key(scope, "n"), 2, seq=3), 2)
        self.assertIsNone(fence.redis_set(self.r, b, key, "c", "NX"))  # SET ... NX on a key that exists
        with self.assertRaises(InvalidError):
            fence.redis_set(self.r, b, data_key("py/elsewhere", "x"), "v")
        self.assertEqual(fence.redis_del(self.r, b, [data_key(scope, "h"), data_key(scope, "n")]), 2)
        b.release()

    def test_values_beyond_2_53_compare_exactly(self):
        scope = f"py/redis-big/{RUN}"
        key = data_key(scope, "v")
        self.addCleanup(lambda: self.r.delete(mark_key(scope), key))
        fence.redis_set(self.r, f"fence:v1:{scope}:9007199254740993", key, "x")
        with self.assertRaises(StaleError) as cm:
            fence.redis_set(self.r, f"fence:v1:{scope}:9007199254740992", key, "y")
        self.assertStale(cm, 9007199254740992, 9007199254740993)
        self.assertEqual(self.r.get(key), "x")

    def test_an_explicit_reporter_for_tokens_without_a_lease(self):
        scope = f"py/redis-rep/{RUN}"
        key = data_key(scope, "v")
        self.addCleanup(lambda: self.r.delete(mark_key(scope), key))
        rep = fence.Reporter(self.client, "py-orders-cache", interval=3600)
        fence.redis_set(self.r, f"fence:v1:{scope}:5", key, "x")
        before = self.reported()
        with self.assertRaises(StaleError):
            fence.redis_set(self.r, f"fence:v1:{scope}:4", key, "y", reporter=rep)
        self.assertEqual(rep.pending(), 1)
        rep.close(10)
        until("reported", lambda: self.reported() == before + 1)



class TestMySQL(Guarded):
    def setUp(self):
        super().setUp()
        self.args, url = mysql_server()
        import pymysql

        install_guard(url)
        self.db = pymysql.connect(**self.args)
        self.addCleanup(self.db.close)

    def sql(self, text, args=None):
        with self.db.cursor() as cur:
            cur.execute(text, args)
            rows = cur.fetchall()
        self.db.commit()
        return rows

    def table(self, name, columns="id int PRIMARY KEY, owner text NOT NULL"):
        t = f"py_{name}_{RUN}"
        self.sql(f"CREATE TABLE {t} ({columns}) ENGINE=InnoDB")
        self.addCleanup(self.sql, f"DROP TABLE {t}")
        return t

    def test_a_superseded_holders_write_is_refused_rolled_back_and_reported(self):
        t = self.table("orders")

        def write(owner):
            return lambda cur: cur.execute(f"INSERT INTO {t} VALUES (1, %s) ON DUPLICATE KEY UPDATE owner = VALUES(owner)", (owner,))

        a = self.client.acquire(f"py/mysql/{RUN}", ttl=30)
        fence.mysql_fenced(self.db, a, write("a"))
        b = self.take_over(a)
        fence.mysql_fenced(self.db, b, write("b"))
        self.assertFalse(a.lost.is_set(), "a does not know yet")

        before = self.reported()
        with self.assertRaises(StaleError) as cm:
            fence.mysql_fenced(self.db, a, write("a, late"))
        self.assertStale(cm, a.token, b.token)
        self.assertEqual(cm.exception.scope, f"py/mysql/{RUN}")
        self.assertTrue(a.lost.is_set(), "a stale answer marks the lease lost")
        self.assertFalse(self.db.server_status & 1, "rolled back: no transaction left open")
        self.assertEqual(self.sql(f"SELECT owner FROM {t}"), (("b",),), "the late write was not made")
        with self.assertRaises(LostError):
            fence.mysql_fenced(self.db, a, write("again"))  # a lost lease does not even try
        self.client.reporter("mysql").flush(10)
        self.assertEqual(self.reported(), before + 1, "the client reported the rejection to fenced")

        got = fence.mysql_fenced(self.db, b, lambda cur: (write("b2")(cur), "done")[1])
        self.assertEqual(got, "done")
        with self.assertRaises(StaleError):
            fence.mysql_fenced(self.db, a.token_text, write("a, later"))
        self.assertEqual(self.sql(f"SELECT owner FROM {t}"), (("b2",),))

        # mysql_advance in a transaction of the caller's, which must roll back.
        with self.db.cursor() as cur:
            cur.execute("START TRANSACTION")
            with self.assertRaises(StaleError):
                fence.mysql_advance(cur, a.token_text)
        self.db.rollback()
        self.db.begin()
        with self.assertRaises(FenceError):
            fence.mysql_fenced(self.db, b, write("inside"))  # START TRANSACTION would commit the open one
        self.db.rollback()
        b.release()

    def test_sequences_big_values_long_scopes_and_malformed_writes(self):
        def tok(value, scope=f"py/mysql-seq/{RUN}"):
            return Token(1, scope, value)

        def advance(t, seq=0):
            with self.db.cursor() as cur:
                try:
                    cur.execute("START TRANSACTION")
                    fence.mysql_advance(cur, t, seq)
                    self.db.commit()
                finally:
                    self.db.rollback()

        advance(tok(9007199254740993), 5)
        advance(tok(9007199254740993), 5)  # an equal sequence passes
        with self.assertRaises(StaleError) as cm:
            advance(tok(9007199254740993), 4)
        self.assertStale(cm, 9007199254740993, 9007199254740993, (4, 5))
        with self.assertRaises(StaleError) as cm:
            advance(tok(9007199254740992))
        self.assertStale(cm, 9007199254740992, 9007199254740993)
        advance(tok(fence.MAX_TOKEN))
        # MySQL keeps 128 characters of the message, the scope last.
        long = f"py/mysql-long/{RUN}/" + "x" * 200
        advance(tok(7, long))
        with self.assertRaises(StaleError) as cm:
            advance(tok(6, long))
        self.assertStale(cm, 6, 7)
        self.assertEqual(cm.exception.scope, long)
        with self.assertRaises(InvalidError):
            advance(tok(1, "bad scope"))  # FN400
        with self.assertRaises(InvalidError):
            fence.mysql_advance(self.db, "fence:v1:x:1", seq=-1)

    def test_a_row_trigger_refuses_a_lower_token(self):
        t = self.table("rows", "id int PRIMARY KEY, owner text NOT NULL, fence_token bigint NOT NULL")
        self.sql(f"CREATE TRIGGER {t}_fence BEFORE UPDATE ON {t} FOR EACH ROW CALL fence_row_token('{t}', OLD.fence_token, NEW.fence_token)")
        scope = f"py/mysql-row/{RUN}"
        fence.mysql_fenced(self.db, f"fence:v1:{scope}:9", lambda cur: cur.execute(f"INSERT INTO {t} VALUES (1, 'nine', 9)"))
        with self.assertRaises(StaleError) as cm:
            # Another scope's mark lets it through; the row's token does not.
            fence.mysql_fenced(self.db, f"fence:v1:{scope}-other:8", lambda cur: cur.execute(f"UPDATE {t} SET owner = 'eight', fence_token = 8"))
        self.assertStale(cm, 8, 9)
        self.assertEqual(cm.exception.scope, t, "the trigger names its own scope")
        self.assertEqual(self.sql(f"SELECT owner FROM {t}"), (("nine",),))

    def test_a_bad_database_is_refused_before_any_query(self):
        class Recorder:
            server_status = 0

            def __init__(self):
                self.texts = []

            def cursor(self):
                return self

            def execute(self, text, args=None):
                self.texts.append(text)

            def commit(self):
                pass

            def close(self):
                pass

        for database in ("", "fence.x", "fence`; DROP TABLE fence_tokens; --", "a" * 65, "fen ce"):
            db = Recorder()
            with self.assertRaises(InvalidError, msg=database):
                fence.mysql_advance(db, "fence:v1:orders:42", database=database)
            with self.assertRaises(InvalidError, msg=database):
                fence.mysql_fenced(db, "fence:v1:orders:42", lambda cur: None, database=database)
            self.assertEqual(db.texts, [], database)
        db = Recorder()
        fence.mysql_advance(db, "fence:v1:orders:42", 3, database="fence")
        self.assertEqual(db.texts, ["CALL `fence`.fence_advance(%s, %s, %s)"])


if __name__ == "__main__":
    unittest.main()
