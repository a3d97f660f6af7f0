"""Fixtures and hooks only; the plain helpers the tests share are in tests/support/."""

from __future__ import annotations

import logging
import os
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cdclake.settings import Settings
from tests.support import fresh_settings, make_settings  # still imported by tests/test_debezium_server.py
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


@pytest.fixture()
def settings(spark_home: Path) -> Settings:
    return fresh_settings(spark_home)


@pytest.fixture()
def airflow(monkeypatch: pytest.MonkeyPatch) -> FakeAirflow:
    """Airflow's REST API faked in-process for the receiver (tests/support/airflow.py)."""
    fake = FakeAirflow()
    monkeypatch.setattr("cdclake.airflow_api.AirflowClient", fake.client)
    return fake


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    # Tests talk to 127.0.0.1 only; a proxy from the environment must not intercept that.
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


# The real S3 server (SeaweedFS on 127.0.0.1), started once per session by the tests that ask.
from tests.s3server import s3server  # noqa: E402, F401
