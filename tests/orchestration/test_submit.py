"""A Spark Connect task (cdclake.launch.submit.run_on_connect) whose server is out of reach
fails within its retry budget and says which server and where to look, for the task log; the
job's own errors pass through as they are."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from cdclake.config.settings import PROJECT_ROOT
from cdclake.dev.stack import free_port
from cdclake.launch import submit
from tests.support import make_settings


def main(spark: Any, argv: list[str]) -> dict[str, Any]:
    """A job whose first step asks the server something."""
    return {"one": spark.sql("SELECT 1").collect()[0][0]}


@pytest.mark.server
def test_a_lost_connect_server_fails_the_task_soon_and_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # connect_session marks the process a Connect client; undone after, for the classic sessions.
    monkeypatch.setenv("SPARK_CONNECT_MODE_ENABLED", "1")
    url = f"sc://127.0.0.1:{free_port()}"  # nothing listens there
    settings = make_settings(tmp_path, spark_connect_url=url)
    quick = {**submit.CONNECT_RETRY, "max_retries": 2, "max_backoff": 200}
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="lost the Spark Connect server at " + url) as err:
        submit.run_on_connect(settings, __name__, [], retry=quick)  # main() below
    assert "cdclake status" in str(err.value) and "UNAVAILABLE" in str(err.value)
    assert time.monotonic() - t0 < 60  # pyspark's own policy would wait 10 minutes
    # docs/deployment.md quotes this very line, for its example server (issue 29, item 7).
    port = url.rsplit(":", 1)[1]
    logged = f"RuntimeError: {err.value}".replace(f"127.0.0.1:{port}", "127.0.0.1:15002")
    readme = " ".join((PROJECT_ROOT / "docs" / "deployment.md").read_text(encoding="utf-8").split())
    assert f"`` {logged} ``" in readme, logged


def test_a_jobs_own_error_is_left_as_it_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    class Session:
        stopped = False

        def stop(self) -> None:
            Session.stopped = True

    def job(spark: Any, module: str, argv: Any) -> Any:
        raise ValueError("a bug in the job")

    monkeypatch.setattr("cdclake.lake.spark.connect_session", lambda *a: Session())
    monkeypatch.setattr(submit, "run_job", job)
    settings = make_settings(tmp_path, spark_connect_url="sc://127.0.0.1:1")
    with pytest.raises(ValueError, match="a bug in the job"):
        submit.run_on_connect(settings, "spark_jobs.apply", [])
    assert Session.stopped
