"""What every Spark job (apply, compaction, expiry, a group of runs) shares: how it starts under
spark-submit, the result line it prints, and how it retries a commit that lost a race."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from pyspark.sql import SparkSession

T = TypeVar("T")


def run_main(app_name: str, main: Callable[[SparkSession, Sequence[str]], Any]) -> None:
    """The job as a script: under spark-submit the catalog conf and jars come from the command line."""
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
    names a conflict."""
    text = str(exc)
    return "CommitFailedException" in text or ("ValidationException" in text and "onflict" in text)


def commit_or_validation_failure(exc: BaseException) -> bool:
    """:func:`commit_conflict`, or any failed validation: a maintenance procedure plans again
    from the table as it is, so every validation failure is worth another attempt."""
    text = str(exc)
    return "CommitFailedException" in text or "ValidationException" in text


def with_retries(
    what: str, fn: Callable[[], T], retry_on: Callable[[BaseException], bool] = commit_conflict, attempts: int = 3
) -> T:
    """``fn()``, again (after 1 s, 2 s, ...) while it fails with what ``retry_on`` accepts;
    ``what`` completes the log line ("on orders", "in rewrite_manifests orders")."""
    for attempt in range(1, attempts + 1):
        try:
            return fn()
        except Exception as exc:
            if attempt == attempts or not retry_on(exc):
                raise
            print(f"cdclake: commit conflict {what} (attempt {attempt}), retrying", file=sys.stderr)
            time.sleep(attempt)
    raise AssertionError("unreachable")
