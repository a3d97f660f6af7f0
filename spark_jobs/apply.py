"""Apply one table's pending staging objects to its Iceberg table, exactly once.

infer the run's JSON types -> read staging again, each value parsed straight into its column's
table type (a value that does not convert quarantines its event) -> normalise -> drop exact
duplicates -> events an earlier run already logged are duplicates -> newest event per key ->
classify against the table and its tombstones (applied / superseded / late / duplicate) -> commit,
each commit carrying its own consumed-staging watermark:

1. ``<table>__quarantine``  events whose values do not fit the table, with the reason (append)
2. ``<table>__changes``     every distinct, non-quarantined event with its outcome (append)
3. ``<table>__tombstones``  ordering value of deleted keys, so late events cannot resurrect them
4. ``<table>``              MERGE of the applied events + watermark + accounting, one commit

Steps 1-3 run before 4 and each skips objects its own watermark already holds, so a crash at any
point followed by a re-run gives the same tables: the re-run first finishes exactly the crashed
run's objects (those a side table's watermark holds and the table's does not), objects that
landed since wait for the next run. Re-running on the same staging data finds nothing pending
and commits nothing.

The steps live in their own modules: :mod:`spark_jobs.pending` (what this run consumes),
:mod:`spark_jobs.read`, :mod:`spark_jobs.table` (the table's schema and options),
:mod:`spark_jobs.fit`, :mod:`spark_jobs.decide` (with :mod:`spark_jobs.unavailable`) and
:mod:`spark_jobs.commit`; here, their order.

Run by the ``cdc_apply`` DAG: on Spark Connect (the default), ``main`` runs in the task's own
process (:func:`cdclake.launch.submit.run_job`); with ``CDCLAKE_SPARK_CONNECT_URL`` empty,
through spark-submit::

    spark-submit --jars ... --conf ... spark_jobs/apply.py --table orders
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from cdclake.config.settings import Settings, load
from cdclake.config.tables import load_table_config
from cdclake.contracts.names import Limits
from cdclake.contracts.watermark import phase_properties, total_properties
from cdclake.lake.catalog import applied_summary
from cdclake.lake.locks import table_lock
from spark_jobs.commit import Commit, commit_table, fill_defaults, log_decisions
from spark_jobs.decide import account, decide, mark_seen, narrow_join, settle
from spark_jobs.fit import fit, mark_unavailable
from spark_jobs.job import report, run_main, with_retries
from spark_jobs.maintain import refresh_tables
from spark_jobs.pending import SIDE_TABLES, list_pending
from spark_jobs.read import drop_exact_duplicates, flatten, read_events
from spark_jobs.retyped import needed
from spark_jobs.system import COPIES, OUTCOME, crash
from spark_jobs.table import ensure_table

APPLY_LOCK_TTL_S = 120.0
"""A killed apply blocks its table for at most this long; a live one renews every third of it."""


class Phases:
    """Wall seconds per step, for the log line and benchmarks."""

    def __init__(self) -> None:
        self.start = self.mark = time.monotonic()
        self.seconds: dict[str, float] = {}

    def end(self, name: str) -> None:
        now = time.monotonic()
        self.seconds[name] = round(now - self.mark, 2)
        self.mark = now

    def total(self) -> float:
        return round(time.monotonic() - self.start, 2)


def apply_table(
    spark: SparkSession,
    settings: Settings,
    table: str,
    max_objects: int,
    crash_at: str | None = None,
) -> dict[str, Any]:
    phases = Phases()
    p = list_pending(spark, settings, table, max_objects)
    result: dict[str, Any] = {"table": table, "objects": len(p.names), "pending_total": p.backlog}
    if not p.names:
        result["committed"] = False
        fill_defaults(spark, settings, table, result)
        return result
    if p.resumed:
        result["resumed"] = True
    ident = p.run.ident()
    # Another session's compaction may have committed since this session last read the tables;
    # only now, with something to apply: a drain lists quiet tables pass after pass.
    refresh_tables(spark, [ident, *(p.run.ident(s) for s in SIDE_TABLES)])
    phases.end("list")

    existing = spark.table(ident).schema if spark.catalog.tableExists(ident) else None
    events, after, declared = read_events(spark, p.uris, existing, p.recorded)
    phases.end("read")  # JSON schema inference (a pass over the files) unless the receipts recorded it

    rows = needed(mark_unavailable(flatten(drop_exact_duplicates(events, copies=COPIES))), existing)
    limits = Limits.of(settings)
    options = load_table_config(settings).for_table(table)
    target = ensure_table(spark, ident, rows, options=options, limits=limits, defaults=declared, crash_at=crash_at)
    fitted = fit(rows, target, limits, after)
    phases.end("fit")
    # The cache fit() made goes whatever happens next: a retried commit conflict runs apply_table
    # again, and a long-lived Connect server would keep every failed attempt's cache.
    try:
        marked, n_seen, n_seen_quarantined = mark_seen(p.run, fitted.rows, fitted.ranges, p.names if p.resumed else ())
        phases.end("history")

        valid, quarantined, n_unresolved = settle(marked, fitted.unavailable, spark.table(ident))
        classified = decide(p.run, valid, narrow_join(fitted.distinct, p.rows))
        phases.end("classify")

        n_quarantined = fitted.quarantined - n_seen_quarantined + n_unresolved
        tally = account(table, classified, fitted, n_seen, n_quarantined)
        phases.end("count")

        crash("before-write", crash_at)
        log_decisions(p, quarantined, classified, target, tally)
        crash("after-aux", crash_at)
        phases.end("side_tables")

        with Commit(spark, metrics_properties(settings, table, tally.counts, phases.seconds)):
            commit_table(p, classified.where(F.col(OUTCOME) == "applied"), target, fitted.unavailable, tally, crash_at)
        crash("after-commit", crash_at)
        phases.end("merge")
        fill_defaults(spark, settings, table, result)
    finally:
        fitted.release()
    result.update(committed=True, **tally.counts, seconds=phases.total(), phases=phases.seconds)
    return result


def metrics_properties(
    settings: Settings, table: str, counts: dict[str, int], seconds: dict[str, float]
) -> dict[str, str]:
    """What the table's commit carries beside the watermark and this apply's counts: the running
    totals and the phase seconds so far, the durable record the REST catalog's /metrics reads
    (apply tasks are short-lived, maybe on other machines). Read under the table lock, so no
    other apply commits between this read and the commit; a conflict retry reads again."""
    return total_properties(applied_summary(settings, table), counts) | phase_properties(seconds)


def apply_with_retries(
    spark: SparkSession, settings: Settings, table: str, max_objects: int, attempts: int = 3
) -> dict[str, Any]:
    """Each attempt holds the table's lock (cdclake.lake.locks, shared with compaction and expiry)
    from listing to the last commit, so maintenance never commits between its read and its
    commits (apache/iceberg #4996); a failure or crash releases it (at once, or after the TTL).
    The lock is first come first served and released between attempts, so a stream of applies
    does not starve maintenance. Holding it, the job refreshes the tables it reads and writes
    once it has found something to apply (another session's compaction may have committed while
    it waited). Optimistic-commit
    conflicts (another writer, e.g. through the REST catalog) re-run the whole apply, which
    re-reads the watermarks and so never applies anything twice."""
    attempt = 0

    def once() -> dict[str, Any]:
        nonlocal attempt
        attempt += 1
        with table_lock(settings, table, "apply", ttl_s=APPLY_LOCK_TTL_S, say=_say):
            return apply_table(spark, settings, table, max_objects)

    result = with_retries(f"on {table}", once, attempts=attempts)
    result["attempts"] = attempt
    return result


def _say(text: str) -> None:
    print(f"cdclake: {text}", file=sys.stderr, flush=True)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="spark_jobs.apply", description=(__doc__ or "").splitlines()[0])
    p.add_argument("--table", required=True, help="staging table name (lower case)")
    p.add_argument("--max-objects", type=int, default=None, help="cap on staging objects this run")
    return p.parse_args(argv)


def main(spark: SparkSession, argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    settings = load()
    result = apply_with_retries(spark, settings, args.table, args.max_objects or settings.max_objects_per_run)
    report(result)
    return result


if __name__ == "__main__":
    run_main("cdclake-apply", main)
