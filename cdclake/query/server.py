"""The query API's own Spark Connect server (CDCLAKE_QUERY_SPARK_CONNECT_URL): a JVM apart from the
applies', holding no catalog at all, at the lowest CPU priority.

Spark never preempts a running task, so scheduler pools in one JVM cannot keep a query's long
tasks from making an apply wait (docs/benchmarks.md, "Apply under query load"); the kernel preempts. The
query server runs ``nice -n CDCLAKE_QUERY_SPARK_NICE`` (19 by default): whenever the applies' JVM
wants a core, the kernel gives it that core and the query tasks get what is left. Started in a
session of its own (the embedded stack starts every component so), it is also its own
*autogroup* when the kernel groups by session (``/proc/sys/kernel/sched_autogroup_enabled``),
and a nice value only weighs against threads of the same autogroup: :func:`lower_priority` gives
the autogroup the same niceness, or ``nice`` alone would change nothing (docs/benchmarks.md, "Apply under query load").

Its JVM is given the Iceberg runtime and AWS bundle jars, Iceberg's SQL extensions and, for an S3
warehouse, the S3FileIO properties a query session's REST catalog reads data files with; no
JDBC catalog, no catalog database login, no Hadoop S3A. Each query session makes its catalog
itself, the REST one with the client's read-only token (cdclake.query.session): the apply's
writing catalog is not in this JVM to be reached. It runs in local mode whatever
CDCLAKE_SPARK_MASTER says: its driver runs its tasks, so its niceness covers every query task
(executors on a cluster's workers would run at the workers' priority, and a standalone master
gives the long-lived apply server every free core).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path

from cdclake.config.settings import Settings
from cdclake.lake.scheduler import scheduler_conf
from cdclake.lake.spark import (
    CONNECT_TOKEN_ENV,
    EXTENSIONS,
    cluster_conf,
    connect_conf,
    connect_token,
    driver_conf,
    jar_paths,
    s3fileio_conf,
    server_command,
    stored_token,
)

QUERY_JARS = ("iceberg-spark-runtime-", "iceberg-aws-bundle-")
DEFAULT_PORT = 15003


def query_server_settings(settings: Settings) -> Settings:
    """``settings`` as the query server's JVM sees them: local mode (``settings.spark_master``
    when it is local, else every core of the machine), its own memory, a loopback driver."""
    master = settings.spark_master if settings.spark_master.startswith("local") else "local[*]"
    return dataclasses.replace(
        settings,
        spark_master=master,
        spark_driver_memory=settings.query_spark_driver_memory,
        spark_driver_host="127.0.0.1",
    )


def query_server_conf(settings: Settings, host: str, port: int) -> dict[str, str]:
    """The query server's Spark settings: no catalog, the FileIO properties its sessions' REST
    catalog inherits (cdclake.query.session.confine keeps them), the scheduler's pools (FAIR
    between statements, all in the queries' pool)."""
    q = query_server_settings(settings)
    jars = [j for j in jar_paths(q) if Path(j).name.startswith(QUERY_JARS)]
    return {
        "spark.jars": ",".join(jars),
        **EXTENSIONS,
        **s3fileio_conf(q),
        **driver_conf(q),
        **cluster_conf(q),
        **scheduler_conf(q),
        **connect_conf(q, host, port),
    }


def query_server_command(settings: Settings, host: str = "127.0.0.1", port: int = DEFAULT_PORT) -> list[str]:
    """``nice -n <CDCLAKE_QUERY_SPARK_NICE> spark-submit ...`` of the query server. Start it in a
    session of its own with :func:`query_server_env` in its environment, then
    :func:`lower_priority` its pid."""
    nice = settings.query_spark_nice
    prefix = ["nice", "-n", str(nice)] if nice else []
    q = query_server_settings(settings)
    return server_command(q, "cdclake-spark-connect-query", query_server_conf(settings, host, port), prefix)


def query_token(settings: Settings, create: bool = False) -> str:
    """CDCLAKE_QUERY_SPARK_CONNECT_TOKEN, else the one the embedded stack keeps in the state folder
    (made with ``create``), else empty."""
    return settings.query_spark_connect_token or stored_token(settings.home / "spark" / "query-connect.token", create)


def query_server_env(settings: Settings) -> dict[str, str]:
    token = query_token(settings)
    return {CONNECT_TOKEN_ENV: token} if token else {}


def query_server_environ(settings: Settings, base: Mapping[str, str]) -> dict[str, str]:
    """The query server's process environment: ``base`` without cdclake's settings and Airflow's
    (the catalog database's URL and login, the apply server's token, Airflow's secrets; the JVM
    reads none of them: its settings are its command line and properties file), with its token."""
    keep = {k: v for k, v in base.items() if not k.startswith(("CDCLAKE_", "AIRFLOW"))}
    return {**keep, **query_server_env(settings)}


def query_engine(settings: Settings) -> tuple[str, str]:
    """``(url, token)`` of the Spark Connect server the query API runs statements on: the query
    server, or the applies' when CDCLAKE_QUERY_SPARK_CONNECT_URL is empty (``("", ...)``: none)."""
    if settings.query_spark_connect_url:
        return settings.query_spark_connect_url, query_token(settings)
    return settings.spark_connect_url, connect_token(settings)


def lower_priority(pid: int, nice: int) -> bool:
    """Give the autogroup of ``pid``, the leader of a session of its own, niceness ``nice`` (as
    ``nice -n`` gave the process): under autogrouping the kernel divides the CPU between
    autogroups first, by the autogroup's own nice value. False when there is nothing to set (no
    autogrouping, ``pid`` not a session leader: its session may hold its starter's terminal)."""
    path = Path(f"/proc/{pid}/autogroup")
    if not nice or not path.exists():
        return False
    with contextlib.suppress(OSError):
        if os.getsid(pid) != pid:
            return False
        path.write_text(str(nice))
        return True
    return False
