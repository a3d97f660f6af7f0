"""How a DAG runs one Spark job (``spark_jobs.<module>.main(spark, argv)``), in one place.

Two ways, chosen by ``CDCLAKE_SPARK_CONNECT_URL``:

* set: the task opens a session on the long-lived Spark Connect server with the server's token
  (CDCLAKE_SPARK_CONNECT_TOKEN, cdclake.lake.spark.connect_session) and calls the job's ``main`` in the
  task's own process. A session costs milliseconds; the catalog, jars and a warm JVM are the
  server's. (Not ``@task.pyspark``: through its Airflow connection pyspark sends a token over TLS
  only, which the Connect server does not speak.)
* empty: ``spark-submit`` per task (Airflow connection ``spark_default``), a fresh driver JVM each
  time (seconds of start-up before the job's first step: docs/benchmarks.md, "A JVM per task"),
  which needs no server.

The plan task and the operator must agree, and both read the same setting. The mapped kwargs are
stored in Airflow's database (XCom) and shown in its UI: they never hold a credential.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import re
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from cdclake.config.settings import Settings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

SUBMIT_CONN_ID = "spark_default"


def submit_kwargs(settings: Settings, module: str, args: Sequence[str], name: str) -> dict[str, Any]:
    """One ``spark-submit`` of ``module`` (e.g. ``spark_jobs.apply``) with the catalog, jars and
    the interpreter that has cdclake installed."""
    from cdclake.lake.spark import credentials_file, jar_conf, job_conf, split_credentials

    spec = importlib.util.find_spec(module)
    if spec is None or not spec.origin:
        raise RuntimeError(f"{module} is not importable: run `make setup`")
    jars = jar_conf(settings)
    conf, credentials = split_credentials(
        {
            **{k: v for k, v in jars.items() if k != "spark.jars"},
            **job_conf(settings),
            "spark.pyspark.python": sys.executable,
            "spark.pyspark.driver.python": sys.executable,
        }
    )
    properties = credentials_file(settings, credentials)
    return {
        "application": spec.origin,
        "application_args": list(args),
        "conf": conf,
        "jars": jars.get("spark.jars"),
        "name": name,
        # The credentials: a 0600 file the task's spark-submit reads (the plan task that writes
        # it runs where the apply tasks do: the scheduler's machine, LocalExecutor).
        "properties_file": str(properties) if properties else None,
    }


def job_kwargs(settings: Settings, module: str, args: Sequence[str], name: str) -> dict[str, Any]:
    """The mapped kwargs of one job for the operator :func:`spark_job_operator` builds."""
    if settings.spark_connect_url:
        return {"module": module, "argv": list(args)}
    return submit_kwargs(settings, module, args, name)


def group_kwargs(
    settings: Settings,
    module: str,
    runs: Sequence[Sequence[str]],
    name: str,
    drain_s: float = 0,
    discover: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The mapped kwargs of one task that runs ``module`` once per argv in ``runs``, in turn, and
    with ``drain_s`` again while they commit, taking on what ``discover`` finds between passes
    (``spark_jobs.group``); a single run that does not drain is the plain job."""
    if len(runs) == 1 and not drain_s:
        return job_kwargs(settings, module, runs[0], name)
    args = ["--module", module, "--runs", json.dumps([list(r) for r in runs])]
    if drain_s:
        args += ["--drain-seconds", str(drain_s)]
        if discover is not None:
            args += ["--discover", json.dumps(discover)]
    return job_kwargs(settings, "spark_jobs.group", args, name)


def run_job(spark: SparkSession, module: str, argv: Sequence[str]) -> dict[str, Any]:
    """``module.main(spark, argv)``; the result made JSON-safe for XCom."""
    result = importlib.import_module(module).main(spark, list(argv))
    out: dict[str, Any] = json.loads(json.dumps(result, default=str))
    return out


CONNECT_RETRY = {"max_retries": 8, "initial_backoff": 50, "backoff_multiplier": 4.0, "max_backoff": 10_000}
"""A task's wait for a Spark Connect server out of reach: about 45 s, the sum of the backoffs above
(50 ms, four times longer each retry, at most 10 s; pyspark's default: 10 minutes).
A server that restarted has lost the task's session anyway; the task fails and says why, and the
next run applies what this one did not."""


def run_on_connect(
    settings: Settings, module: str, argv: Sequence[str], retry: dict[str, Any] = CONNECT_RETRY
) -> dict[str, Any]:
    """:func:`run_job` in a session on the Connect server; losing the server is a RuntimeError
    that names it and where to look, for the task log."""
    from cdclake.lake.spark import connect_failed, connect_session, connect_token
    from cdclake.query.queries import error_line

    url = settings.spark_connect_url
    try:
        spark = connect_session(url, connect_token(settings), retry)
        try:
            return run_job(spark, module, argv)
        finally:
            with contextlib.suppress(Exception):
                spark.stop()
    except Exception as exc:
        if not connect_failed(exc):
            raise
        # gRPC's text is a multi-line dump of the call: its status and details say what happened.
        details = re.search(r'details = "([^"]*)"', str(exc))
        why = details.group(1) if details else error_line(exc)
        status = exc.getGrpcStatusCode().name  # type: ignore[attr-defined]
        raise RuntimeError(
            f"lost the Spark Connect server at {url} (down or restarted; `cdclake status`, "
            f"$CDCLAKE_HOME/logs/spark-connect.log): {status}: {why}"
        ) from exc


def spark_job_operator(
    task_id: str, max_active: int, connect_max_active: int | None = None, settings: Settings | None = None
) -> Any:
    """The partial operator a DAG expands over :func:`job_kwargs` (``.expand_kwargs(plan())``).

    ``max_active`` caps parallel spark-submits (each a driver JVM); ``connect_max_active`` caps
    parallel sessions on the one Connect server, where a task is a light Python process."""
    from cdclake.config.settings import load

    settings = settings or load()
    if settings.spark_connect_url:
        from airflow.sdk import task

        parallel = connect_max_active or max_active

        @task(task_id=task_id, max_active_tis_per_dagrun=parallel)
        def run(module: str, argv: list[str]) -> dict[str, Any]:
            return run_on_connect(load(), module, argv)  # the task's own environment, where the token is

        return run

    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

    return SparkSubmitOperator.partial(task_id=task_id, conn_id=SUBMIT_CONN_ID, max_active_tis_per_dagrun=max_active)
