"""A Spark session for one client's query: what it may reach is decided by the catalog it is
given, not by the statement.

The session is made on the query API's own Spark Connect server (cdclake.query.server), whose
JVM holds no catalog and no catalog database login at all, or, when
CDCLAKE_QUERY_SPARK_CONNECT_URL is empty, on the applies' server, which holds the apply's writing
catalog (JDBC, with the login). Either way, its catalog of the same name is Iceberg's REST catalog
pointed at cdclake's own REST server with a short-lived **read-only** token carrying the
client's ``tables`` patterns, so every table it loads is one the REST server lets that client
read, and a write through it (a commit, a create, a drop, a rename) is refused by that server
whatever statement asked for it. The session also cannot read files by path
(``spark.sql.runSQLOnFiles``), caches no table between statements (Iceberg's caching catalog
would keep answering from a 30-second-old snapshot), runs no SQL scripts, and puts its jobs in
the ``cdclake-queries`` scheduler pool (on a shared server, the Connect server fills it after
the applies': :mod:`cdclake.lake.scheduler`).

Each query gets a new session and releases it after: nothing one query sets or creates
(temporary views, configuration, current namespace) can be seen by the next.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, cast

from cdclake.config.settings import Settings
from cdclake.lake.scheduler import QUERY_POOL

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def query_catalog_conf(settings: Settings, token: str) -> dict[str, str]:
    """The session settings of a query session's catalog (the REST one) and its limits."""
    c = f"spark.sql.catalog.{settings.catalog_name}"
    return {
        c: "org.apache.iceberg.spark.SparkCatalog",
        f"{c}.type": "rest",
        f"{c}.uri": settings.query_catalog,
        # Every statement makes a new catalog in the server's JVM, which Spark never closes: nothing
        # of it may start a thread. Iceberg's OAuth2 manager (token refresh) and metrics reporter
        # would each start one that lives for good (measured: two per statement), so the token
        # goes as a plain header. (Its HTTP client's idle connections go with the catalog at a
        # garbage collection; Spark's driver asks for one every 30 minutes.)
        f"{c}.rest.auth.type": "none",
        f"{c}.header.Authorization": f"Bearer {token}",
        f"{c}.rest-metrics-reporting-enabled": "false",
        f"{c}.cache-enabled": "false",
        "spark.sql.defaultCatalog": settings.catalog_name,
        "spark.sql.runSQLOnFiles": "false",
        "spark.sql.scripting.enabled": "false",
        "spark.scheduler.pool": QUERY_POOL,
    }


UNREACHABLE_RETRY = {"max_retries": 3, "initial_backoff": 50, "backoff_multiplier": 4.0, "max_backoff": 1_000}
"""A query's wait for a Spark Connect server out of reach: about a second, then 503 (pyspark's
default waits 10 minutes, holding the statement's slot and the client's connection)."""

# What a shared server's catalog has that the REST one must not inherit: the catalog database's
# address and login. FileIO settings (an S3 endpoint and keys) are kept: the engine reads the
# data files with them (the query server has those alone).
_SERVER_ONLY = (".uri", ".jdbc.", ".catalog-impl", ".type", ".warehouse")


def confine(spark: SparkSession, settings: Settings, token: str) -> None:
    """Make ``spark`` (a new session, before its first statement: catalogs load on first use) a
    query session of the client whose REST token is ``token``."""
    c = f"spark.sql.catalog.{settings.catalog_name}"
    current: dict[str, Any] = dict(spark.conf.getAll) if hasattr(spark.conf, "getAll") else {}
    for key in current:
        if not key.startswith("spark.sql.catalog."):
            continue
        own = key.startswith(c + ".") and not any(part in key[len(c) :] for part in _SERVER_ONLY)
        if key != c and not own:
            spark.conf.unset(key)  # any other catalog, and the JDBC one's address and login
    for key, value in query_catalog_conf(settings, token).items():
        spark.conf.set(key, value)


def release(spark: SparkSession) -> None:
    """End a query session on the server and close its channel. Not ``spark.stop()``: in pyspark
    that also shuts down a thread pool every Connect session of the process shares, waiting
    under a lock for releases in flight, and the next query's session blocked on it."""
    from cdclake.lake.spark import connect_client

    client = connect_client(spark)
    if client is None:  # an in-process session: nothing held on a server
        return
    with contextlib.suppress(Exception):
        client.release_session()
    with contextlib.suppress(Exception):
        client._channel.close()  # see above: close() would stop the shared pool


@contextlib.contextmanager
def query_session(settings: Settings, token: str) -> Iterator[SparkSession]:
    """A new confined Spark Connect session on the query server (else the applies' server),
    released after."""
    from cdclake.lake.spark import connect_session
    from cdclake.query.server import query_engine

    url, server_token = query_engine(settings)
    # Not marking the process a Connect client: the query engine uses no pyspark.sql.functions.
    spark = connect_session(url, server_token, retry=UNREACHABLE_RETRY, mark_process=False)
    # Reattachable execution releases each finished operation later, from a thread pool: after
    # this session is released, those calls fail on the server (logged as errors there).
    cast(Any, spark).client.disable_reattachable_execute()
    try:
        confine(spark, settings, token)
        yield spark
    finally:
        release(spark)
