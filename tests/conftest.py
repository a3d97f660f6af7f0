"""Fixtures and hooks only; the plain helpers the tests share are in tests/support/."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cdclake.config.settings import Settings
from tests.support import fresh_settings, make_settings
from tests.support.airflow import FakeAirflow

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


# A test (or a fixture it uses) that starts a process or listens on a port must say so with one
# of these markers; `make test-fast` deselects them all. Unmarked tests run under the guard below.
MAY_START = ("server", "spark", "e2e")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    """Unmarked tests are unit tests: starting a process or binding a TCP port (fixtures included)
    fails the test with a message naming the marker to add."""
    if any(item.get_closest_marker(m) for m in MAY_START):
        return (yield)
    why = f"{item.nodeid} (or a fixture it set up) is not marked server/spark/e2e, so it may not"
    spawn = subprocess.Popen._execute_child  # type: ignore[attr-defined]
    bind = socket.socket.bind

    def no_spawn(self: Any, args: Any, *rest: Any, **kw: Any) -> Any:
        if list(args)[:2] == ["file", "-b"]:  # platform.architecture(), which croniter's import calls
            return spawn(self, args, *rest, **kw)
        pytest.fail(f"{why} start a process ({args!r}): mark it @pytest.mark.server", pytrace=False)

    def no_listen(self: socket.socket, address: Any) -> None:
        if self.family in (socket.AF_INET, socket.AF_INET6):
            pytest.fail(f"{why} bind a TCP/UDP port ({address!r}): mark it @pytest.mark.server", pytrace=False)
        bind(self, address)

    subprocess.Popen._execute_child = no_spawn  # type: ignore[attr-defined]
    socket.socket.bind = no_listen  # type: ignore[method-assign,assignment]
    try:
        return (yield)
    finally:
        subprocess.Popen._execute_child = spawn  # type: ignore[attr-defined]
        socket.socket.bind = bind  # type: ignore[method-assign]


@pytest.fixture(scope="session")
def spark_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("spark-home")


@pytest.fixture(scope="session")
def spark(spark_home: Path) -> Iterator[Any]:
    """One real local SparkSession (JVM start is the slow part) for every Spark test."""
    from cdclake.lake.spark import session

    s = session(make_settings(spark_home), "cdclake-tests")
    s.sparkContext.setLogLevel("ERROR")
    yield s
    s.stop()
    # py4j logs at interpreter exit, after pytest has closed its capture streams: "Closing down
    # clientserver connection" on its own logger, and a finalizer's failed send to the stopped JVM
    # on the root logger (INFO passes once Airflow has configured logging). Either would print a
    # spurious "--- Logging error ---" (seen once in a CI run).
    logging.getLogger("py4j").setLevel(logging.WARNING)
    logging.getLogger().setLevel(logging.WARNING)


@pytest.fixture(scope="session")
def connect_url(spark: Any) -> Iterator[str]:
    """A Spark Connect server in the test session's JVM (tests/support/query.py), for the query API."""
    from tests.support.query import connect_server

    with connect_server(spark) as url:
        yield url


@pytest.fixture()
def settings(spark_home: Path) -> Settings:
    return fresh_settings(spark_home)


@pytest.fixture()
def airflow(monkeypatch: pytest.MonkeyPatch) -> FakeAirflow:
    """Airflow's REST API faked in-process for the receiver (tests/support/airflow.py)."""
    fake = FakeAirflow()
    monkeypatch.setattr("cdclake.orchestration.airflow_api.AirflowClient", fake.client)
    return fake


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    # Tests talk to 127.0.0.1 only; a proxy from the environment must not intercept that.
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


# The real S3 server (SeaweedFS on 127.0.0.1), started once per session by the tests that ask.
from tests.support.s3server import s3server  # noqa: E402, F401
