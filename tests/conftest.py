from __future__ import annotations

import contextlib
import itertools
import logging
import os
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cdclake import events, staging
from cdclake.reference import rows_by_key
from cdclake.settings import Settings, load
from cdclake.spark import catalog_conf

# Airflow reads its configuration once, at import: give it a throwaway home before any test
# imports it, so tests never touch ~/airflow or the demo's state.
_AIRFLOW_HOME = tempfile.mkdtemp(prefix="cdclake-test-airflow-")
os.environ["AIRFLOW_HOME"] = _AIRFLOW_HOME
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
os.environ["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = f"sqlite:///{_AIRFLOW_HOME}/airflow.db"


def _terminate(signum: int, frame: Any) -> None:
    # A CI timeout or `kill` sends SIGTERM: unwind like Ctrl-C so fixtures stop the servers,
    # JVMs and PostgreSQL clusters they started instead of leaving them holding ports.
    raise KeyboardInterrupt(f"signal {signum}")


signal.signal(signal.SIGTERM, _terminate)


def make_settings(home: Path, **overrides: Any) -> Settings:
    return load({"CDCLAKE_HOME": str(home)}, **overrides)


def stage(settings: Settings, batches: list[dict[str, Any]], landed_ms: int | None = None) -> list[staging.ObjectKey]:
    """Land batches the way the receiver does (decode, split per table, durable put)."""
    store = staging.LocalStaging(settings.staging_dir)
    keys = []
    for b in batches:
        batch = events.decode_batch(events.encode(b))
        for table, data in events.stage_lines(batch).items():
            key = staging.make_key(table, batch.source, batch.sequenceNumber, landed_ms)
            store.put(key, data)
            keys.append(key)
    return keys


@contextlib.contextmanager
def running_stack(home: Path, **overrides: Any) -> Iterator[Any]:
    """The embedded stack (LocalStack) on free 127.0.0.1 ports; nothing it started may outlive it."""
    from cdclake.local import LocalStack, free_port

    settings = make_settings(
        home,
        receiver_port=free_port(),
        airflow_port=free_port(),
        rest_port=free_port(),
        spark_connect_url=f"sc://127.0.0.1:{free_port()}",
        **overrides,
    )
    s = LocalStack(settings)
    with s:
        yield s
    assert not s.procs


def staged_event_count(settings: Settings) -> int:
    """Events that landed in staging. A batch re-sent within the same millisecond lands under the
    same object name (identical content, one object), so this can be below what was sent."""
    store = staging.LocalStaging(settings.staging_dir)
    return sum(len(store.get(k).splitlines()) for t in store.tables() for k in store.list(t))


@pytest.fixture(scope="session")
def spark_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("spark-home")


@pytest.fixture(scope="session")
def spark(spark_home: Path) -> Iterator[Any]:
    """One real local SparkSession (JVM start is the slow part) for every Spark test."""
    from cdclake.spark import session

    s = session(make_settings(spark_home), "cdclake-tests")
    s.sparkContext.setLogLevel("ERROR")
    yield s
    s.stop()
    # py4j logs "Closing down clientserver connection" at interpreter exit, after pytest has
    # closed its capture streams; that would print a spurious "--- Logging error ---".
    logging.getLogger("py4j").setLevel(logging.WARNING)


_namespaces = itertools.count()


def fresh_settings(spark_home: Path, **overrides: Any) -> Settings:
    """Settings on the session's catalog with a namespace and staging folder of their own."""
    n = next(_namespaces)
    return make_settings(spark_home, namespace=f"t{n}", staging_dir=spark_home / f"staging{n}", **overrides)


@pytest.fixture()
def settings(spark_home: Path) -> Settings:
    return fresh_settings(spark_home)


def apply_all(spark: Any, settings: Settings, crash_at: str | None = None) -> list[dict[str, Any]]:
    """Run the apply job once for every table with staging data."""
    from spark_jobs.apply import apply_table

    store = staging.LocalStaging(settings.staging_dir)
    return [apply_table(spark, settings, t, 10_000, crash_at=crash_at) for t in store.tables()]


def attach_catalog(spark: Any, settings: Settings) -> None:
    """Register another stack's catalog in a running session (catalogs load lazily by name)."""
    for key, value in catalog_conf(settings).items():
        if key.startswith(f"spark.sql.catalog.{settings.catalog_name}"):
            spark.conf.set(key, value)


def table_rows(spark: Any, ident: str) -> dict[str, dict[str, Any]]:
    return rows_by_key(spark.table(ident).collect())


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    # Tests talk to 127.0.0.1 only; a proxy from the environment must not intercept that.
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


# The real S3 server (SeaweedFS on 127.0.0.1), started once per session by the tests that ask.
from tests.s3server import s3server  # noqa: E402, F401
