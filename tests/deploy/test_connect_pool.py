"""cdclake.lake.connect_pool: closing a Spark Connect session (pyspark's client ``close()``, which
its ``__del__`` runs in whatever thread the garbage collector does) must not shut down the
release pool every session of the process shares. Run from one of that pool's threads, pyspark's
shutdown joins the thread itself and holds its class lock forever: a fresh-clone run of
tests/e2e/test_consistency.py hung so (py-spy: ``SparkSession.__del__`` -> ``close`` ->
``shutdown`` inside a release worker, every later query waiting on the lock)."""

from __future__ import annotations

import concurrent.futures

from cdclake.lake.connect_pool import keep_release_pool


def test_a_close_from_a_release_thread_neither_deadlocks_nor_stops_the_shared_pool() -> None:
    from pyspark.sql.connect.client.reattach import ExecutePlanResponseReattachableIterator as Iterator

    keep_release_pool()
    pool = Iterator._get_or_create_release_thread_pool()
    closed = pool.submit(Iterator.shutdown)  # what a session's __del__ does there
    closed.result(timeout=30)  # without the fix: the worker joins itself, this times out
    assert Iterator._get_or_create_release_thread_pool() is pool
    assert pool.submit(lambda: 42).result(timeout=30) == 42  # still serving the other sessions
    assert isinstance(pool, concurrent.futures.ThreadPoolExecutor)
