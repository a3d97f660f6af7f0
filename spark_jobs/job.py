"""What every Spark job (apply, compaction, expiry, a group of runs) shares: how it starts under
spark-submit, the result line it prints, and how it retries a commit that lost a race."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import tenacity
from pyspark.sql import SparkSession

T = TypeVar("T")


def run_main(app_name: str, main: Callable[[SparkSession, Sequence[str]], Any]) -> None:
    """The job as a script: under spark-submit the catalog conf and jars come from the command line.
    On Spark Connect the DAG's task calls the same ``main`` in a session of its own
    (cdclake.launch.submit.run_job)."""
    spark = SparkSession.builder.appName(app_name).getOrCreate()
    try:
        main(spark, sys.argv[1:])
    finally:
        spark.stop()


def report(result: dict[str, Any]) -> None:
    """One greppable line: Airflow's task log shows it."""
    print("CDCLAKE_RESULT " + json.dumps(result, sort_keys=True, default=str), flush=True)


def commit_conflict(exc: BaseException) -> bool:
    """Another writer committed first: Iceberg's optimistic commit failed, or its validation
    names a conflict. The apply's predicate: its other validation failures (a schema change the
    table refuses) fail the same way again, and one attempt re-reads and re-fits the whole run.
    A refused publish (cdclake.lake.publish) raises pyiceberg's CommitFailedException, whose text
    does not name its class as a Java error's does: matched by class name, so this module needs
    no pyiceberg import."""
    text = str(exc)
    by_class = any(c.__name__ == "CommitFailedException" for c in type(exc).__mro__)
    return by_class or "CommitFailedException" in text or ("ValidationException" in text and "onflict" in text)


def commit_or_validation_failure(exc: BaseException) -> bool:
    """:func:`commit_conflict`, or any failed validation: maintenance's predicate. A maintenance
    procedure plans again from the table as it is, so every validation failure is worth another
    attempt; a rewrite that a concurrent delete overtook fails validation without naming a
    conflict ("found new position delete for replaced data file")."""
    text = str(exc)
    return "CommitFailedException" in text or "ValidationException" in text


def _sleep(seconds: float) -> None:
    time.sleep(seconds)  # looked up per call, so a test's monkeypatched time.sleep applies


def with_retries(
    what: str, fn: Callable[[], T], retry_on: Callable[[BaseException], bool] = commit_conflict, attempts: int = 3
) -> T:
    """``fn()``, again (after 1 s, 2 s, ...) while it fails with what ``retry_on`` accepts, at
    most ``attempts`` times in all; then its last error. The one commit retry of every job: the
    apply passes :func:`commit_conflict` (the default), maintenance
    :func:`commit_or_validation_failure`. ``what`` completes the log line ("on orders", "in
    rewrite_manifests orders")."""

    def say(state: tenacity.RetryCallState) -> None:
        print(f"cdclake: commit conflict {what} (attempt {state.attempt_number}), retrying", file=sys.stderr)

    retrying = tenacity.Retrying(
        stop=tenacity.stop_after_attempt(attempts),
        wait=tenacity.wait_incrementing(start=1, increment=1),
        # Exceptions only, as ever: an interrupt or SystemExit is never retried.
        retry=tenacity.retry_if_exception(lambda exc: isinstance(exc, Exception) and retry_on(exc)),
        before_sleep=say,
        sleep=_sleep,
        reraise=True,
    )
    return retrying(fn)
