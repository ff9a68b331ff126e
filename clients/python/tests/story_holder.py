"""The Python holder of test_story.py, in a process of its own so that the
test can pause it (SIGSTOP) while it holds the lease.

    story_holder.py

It acquires STORY_SCOPE for STORY_TTL seconds at FENCE_ADDR, writes "A1"
to the row (PostgreSQL, FENCE_TEST_POSTGRES, table STORY_TABLE) and the key
{SCOPE}:value (Redis, FENCE_TEST_REDIS) through this package's guards, and
prints {"token": ...}. Then it reads a line from stdin: the test pauses the
process before it sends one. Once it runs again it prints what it finds:
whether its lease is lost and why, whether the guards refuse to write under
the lost lease, and what the databases answer to the late write it sends
anyway with its old token. It closes its client, which sends the
rejections it saw to fenced, and exits 0.
"""

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))

import psycopg2  # noqa: E402
import redis  # noqa: E402

import fence  # noqa: E402


def main() -> None:
    scope = os.environ["STORY_SCOPE"]
    table = os.environ["STORY_TABLE"]
    client = fence.Client(os.environ["FENCE_ADDR"], holder="py-story-holder")
    db = psycopg2.connect(os.environ["FENCE_TEST_POSTGRES"])
    r = redis.Redis.from_url(os.environ["FENCE_TEST_REDIS"], decode_responses=True)
    key = fence.data_key(scope, "value")

    def update(value):
        return lambda cur: cur.execute(f"UPDATE {table} SET value = %s WHERE id = 1", (value,))

    lease = client.acquire(scope, ttl=float(os.environ["STORY_TTL"]))
    fence.pg_fenced(db, lease, update("A1"))
    fence.redis_set(r, lease, key, "A1")
    print(json.dumps({"token": str(lease.token)}), flush=True)

    sys.stdin.readline()  # the test pauses the process before this line comes

    out = {"lost": lease.lost.is_set(), "error": str(lease.error)}
    try:
        fence.pg_fenced(db, lease, update("A1 late"))
        out["lease_write"] = "written"
    except fence.LostError as err:
        out["lease_write"] = "LostError" if err is lease.error else f"another LostError: {err}"
    # The late write sent anyway, with the old token's text, as a holder
    # that ignores its lease would: the databases refuse it.
    rep = client.reporter("py-story")
    for name, write in (
        ("postgresql", lambda: fence.pg_fenced(db, lease.token_text, update("A1 late"), reporter=rep)),
        ("redis", lambda: fence.redis_set(r, lease.token_text, key, "A1 late", reporter=rep)),
    ):
        try:
            write()
            out[name] = "written"
        except fence.StaleError as err:
            out[name] = {"presented": str(err.presented), "highest": str(err.highest), "message": str(err)}
    client.close()  # sends the two rejections to fenced
    db.close()
    r.close()
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
