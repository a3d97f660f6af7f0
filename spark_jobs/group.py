"""Run one job (``spark_jobs.<module>.main``) several times in turn, in one Spark session: how a
DAG task applies (or maintains) a group of tables.

A DAG maps at most ``CDCLAKE_MAX_MAPPED_TASKS`` tasks (Airflow refuses a task mapped over more
than 1,024 items), so with more tables than that each task gets a group::

    spark_jobs/group.py --module spark_jobs.apply --runs '[["--table", "a", ...], ["--table", "b", ...]]'

A run that fails does not stop the rest of its group; the task fails after them, naming the
failed runs, and Airflow's retry runs the group again: every job is idempotent (a table applied
on the first try finds nothing pending on the second).
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
from collections.abc import Sequence
from typing import Any

from pyspark.sql import SparkSession

from spark_jobs.job import run_main

log = logging.getLogger("cdclake.group")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--module", required=True, help="job module with main(spark, argv), e.g. spark_jobs.apply")
    p.add_argument("--runs", required=True, help="JSON list of argv lists, one per run, in order")
    return p.parse_args(argv)


def main(spark: SparkSession, argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    runs: list[list[str]] = json.loads(args.runs)
    job = importlib.import_module(args.module)
    results: list[Any] = []
    failed: list[str] = []
    for i, run in enumerate(runs):
        try:
            results.append(job.main(spark, list(run)))
        except Exception as exc:  # the rest of the group still runs; the task fails at the end
            log.exception("run %d of %d (%s) failed", i + 1, len(runs), " ".join(run))
            failed.append(f"{' '.join(run)}: {type(exc).__name__}: {exc}")
    if failed:
        raise RuntimeError(f"{len(failed)} of {len(runs)} runs of {args.module} failed: " + "; ".join(failed))
    return {"runs": results}


if __name__ == "__main__":
    run_main("cdclake-group", main)
