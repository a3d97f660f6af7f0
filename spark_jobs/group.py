"""Run one job (``spark_jobs.<module>.main``) several times in turn, in one Spark session: how a
DAG task applies (or maintains) a group of tables, and how an apply task keeps draining.

A DAG maps at most ``CDCLAKE_MAX_MAPPED_TASKS`` tasks (Airflow refuses a task mapped over more
than 1,024 items), so with more tables than that each task gets a group::

    spark_jobs/group.py --module spark_jobs.apply --runs '[["--table", "a", ...], ["--table", "b", ...]]'

A run that fails does not stop the rest of its group; the task fails after them, naming the
failed runs, and Airflow's retry runs the group again: every job is idempotent (a table applied
on the first try finds nothing pending on the second).

``--drain-seconds S`` (``CDCLAKE_APPLY_DRAIN_S`` for ``cdc_apply``): after the first pass, every
run goes again, pass after pass, until a pass in which no run's result says it committed, or
``S`` seconds have gone since the task began. Every run, not only those that committed: a table
that found nothing in one pass would otherwise wait for the next DAG run, queued behind this one
for up to ``S`` seconds (a run with nothing pending costs a listing, no Spark job). A steady
stream is then applied micro-batch after micro-batch inside one task, instead of paying a DAG
run (scheduler, plan, task start) per micro-batch and waiting for the slowest table of the run.
Each micro-batch is its own job call: its own ``CDCLAKE_RESULT`` line and commit, and the
table's lock is released between them, so maintenance is not starved. A run that fails leaves
the loop.

``--discover JSON`` (``cdc_apply``'s plan, when it applies every table): between passes, the
drain also takes on the runs of tables that got pending objects after the plan and fall to this
task (:class:`cdclake.orchestration.apply_plan.Discovery`); they drain with the others from then
on. JSON: ``{"taken": [tables the plan gave to any task], "task": i, "tasks": n, "max_objects": m}``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from pyspark.sql import SparkSession

from spark_jobs.job import run_main

log = logging.getLogger("cdclake.group")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--module", required=True, help="job module with main(spark, argv), e.g. spark_jobs.apply")
    p.add_argument("--runs", required=True, help="JSON list of argv lists, one per run, in order")
    p.add_argument("--drain-seconds", type=float, default=0.0, help="keep re-running runs that committed (0: once)")
    p.add_argument("--discover", default="", help="JSON: take on tables pending after the plan (see the module doc)")
    return p.parse_args(argv)


def committed(result: Any) -> bool:
    """Did this run change its table? (The apply's result says so; other jobs never drain.)"""
    return isinstance(result, dict) and bool(result.get("committed"))


def main(spark: SparkSession, argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    runs: list[list[str]] = json.loads(args.runs)
    discover = None
    if args.discover:
        from cdclake.config.settings import load
        from cdclake.orchestration.apply_plan import Discovery

        discover = Discovery(load(), **json.loads(args.discover))
    return drain(spark, importlib.import_module(args.module).main, runs, args.drain_seconds, discover=discover)


def drain(
    spark: SparkSession,
    job: Callable[[SparkSession, list[str]], Any],
    runs: list[list[str]],
    seconds: float = 0.0,
    clock: Callable[[], float] = time.monotonic,
    discover: Callable[[], list[list[str]]] | None = None,
) -> dict[str, Any]:
    """Every run once, then all again while some run commits and ``seconds`` last, with the runs
    ``discover`` finds between passes (see the module doc)."""
    deadline = clock() + seconds
    results: list[Any] = []
    failed: list[str] = []
    todo, passes = runs, 0
    while todo:
        passes += 1
        again: list[list[str]] = []
        any_committed = False
        for i, run in enumerate(todo):
            try:
                result = job(spark, list(run))
            except Exception as exc:  # the rest of the group still runs; the task fails at the end
                log.exception("run %d of %d (%s) failed", i + 1, len(todo), " ".join(run))
                failed.append(f"{' '.join(run)}: {type(exc).__name__}: {exc}")
                continue
            results.append(result)
            again.append(run)
            any_committed = any_committed or committed(result)
        left = deadline - clock()
        found = discover() if discover is not None and left > 0 else []
        for run in found:
            print(f"cdclake: drain: taking on {' '.join(run)} (pending since the plan)", flush=True)
        runs = runs + found
        todo = again + found if left > 0 and (any_committed or found) else []
        if todo:
            print(f"cdclake: drain pass {passes + 1}: {len(todo)} of {len(runs)} runs, {left:.0f}s left", flush=True)
    if failed:
        raise RuntimeError(f"{len(failed)} of {len(runs)} runs of {job.__module__} failed: " + "; ".join(failed))
    return {"runs": results, "passes": passes}


if __name__ == "__main__":
    run_main("cdclake-group", main)
