"""Apply one table's pending staging objects to its Iceberg table, exactly once.

infer the run's JSON types -> read staging again, each value parsed straight into its column's
table type (a value that does not convert quarantines its event) -> normalise -> drop exact
duplicates -> events an earlier run already logged are duplicates -> newest event per key ->
classify against the table and its tombstones (applied / superseded / late / duplicate) -> stage
the writes, each carrying its own consumed-staging watermark -> publish them in ONE catalog commit:

1. ``<table>__quarantine``  events whose values do not fit the table, with the reason (append)
2. ``<table>__changes``     every distinct, non-quarantined event with its outcome (append)
3. ``<table>__tombstones``  ordering value of deleted keys, so late events cannot resurrect them
4. ``<table>``              MERGE of the applied events + watermark + accounting

The writes are staged (:mod:`spark_jobs.stage`, Iceberg write-audit-publish) and published
together (:mod:`cdclake.lake.publish`): a crash before the publish leaves every table as it was
(the staged snapshots are in no table's history; expiry removes them), after it every table
holds the run. So a re-run after a crash anywhere gives the same tables, and a re-run on the
same staging data finds nothing pending and commits nothing. A table an older cdclake left with
its side tables committed ahead of it is finished first (:mod:`spark_jobs.pending`).

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
import contextlib
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from cdclake.config.settings import Settings, load
from cdclake.config.tables import load_table_config
from cdclake.contracts.names import Limits
from cdclake.contracts.watermark import phase_properties, position_properties, positions_of, total_properties
from cdclake.lake import holds, selection
from cdclake.lake.catalog import applied_summary
from cdclake.lake.locks import table_lock
from cdclake.lake.positions import greatest
from cdclake.staging import stores
from spark_jobs.audit import audit
from spark_jobs.commit import Commit, commit_table, fill_defaults, log_decisions
from spark_jobs.decide import IDS_AS_VALUES_AT_MOST, Tally, account, decide, mark_seen, narrow_join, settle
from spark_jobs.fit import fit, mark_unavailable
from spark_jobs.job import report, run_main, with_retries
from spark_jobs.maintain import refresh_tables, tidy, trim
from spark_jobs.pending import SIDE_TABLES, Pending, list_table, pending_of
from spark_jobs.read import drop_exact_duplicates, flatten, read_events
from spark_jobs.retyped import needed
from spark_jobs.stage import Stage
from spark_jobs.system import COPIES, OLDER_AUX_CRASH, OUTCOME, SimulatedCrash, crash
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


def apply_tables(
    spark: SparkSession,
    settings: Settings,
    tables: Sequence[str],
    max_objects: int,
    crash_at: str | None = None,
) -> list[dict[str, Any]]:
    """One run over ``tables``: each table's chosen objects staged, then everything the run wrote
    (the tables and their side tables) published in one catalog commit; a result per table."""
    listings = {t: list_table(spark, settings, t) for t in tables}
    # After the listing: a receipt is written before its objects, so every listed object's
    # transactions are known here (an object surveyed first could be taken as transaction-free).
    landings = selection.survey(stores.open_store(settings)) if settings.consistent_publish else {}
    choice = selection.choose(
        {t: ls.candidates for t, ls in listings.items()},
        max_objects,
        landings,
        consumed=lambda path: listings[path.split("/", 1)[0]].watermark.consumed(path.split("/", 1)[1]),
    )
    stage = Stage.for_run(spark, settings, tables[0])
    stage.properties = position_properties(_positions(settings, tables, choice.positions))
    results: list[dict[str, Any]] = []
    for t in tables:
        p = pending_of(listings[t], choice.objects[t] if landings else None, max_objects)
        result: dict[str, Any] = {"table": t, "objects": len(p.names), "pending_total": p.backlog}
        if choice.waiting.get(t):
            result["waiting"] = choice.waiting[t]  # objects of transactions not yet whole
        results.append(result)
        if p.names:
            stage_table(p, stage, result, crash_at)
    if stage.moves:
        crash("after-stage", crash_at)
        if _held(spark, settings, stage, tables, results):
            return results
        stage.publish()
        holds.clear(stores.open_store(settings), tables)
        crash("after-commit", crash_at)
        _upkeep(spark, settings, stage, results[0])
    for result in results:
        # After the publish, as its own commit: a second write of the table cannot stage under the
        # run's id (it would not see the MERGE), and the backfill is safe to redo (spark_jobs.backfill).
        fill_defaults(spark, settings, result["table"], result)
        result.setdefault("committed", False)
    if len(tables) > 1 or choice.held:
        results[0]["together"] = list(tables)
        results[0]["held"] = dict(list(choice.held.items())[:MAX_HELD_SHOWN])
    return results


def _upkeep(spark: SparkSession, settings: Settings, stage: Stage, result: dict[str, Any]) -> None:
    """After the publish, under the run's locks: each published table past its bounds trimmed
    (snapshots) and tidied (small files); what was done goes in ``result``."""
    published = stage.published
    for key, done, count in (
        ("trimmed", trim(spark, settings, {t: p.snapshots for t, p in published.items()}), "snapshots"),
        ("tidied", tidy(spark, settings, {t: p.small_files for t, p in published.items()}), "small_files"),
    ):
        for t, how in done.items():
            _say(f"{t}: {how[count]} {count.replace('_', ' ')}, {key} in {how['seconds']} s {how.get('error', '')}")
        if done:
            result[key] = done


def _held(
    spark: SparkSession, settings: Settings, stage: Stage, tables: Sequence[str], results: list[dict[str, Any]]
) -> bool:
    """Audit before publish: the tables' expectations on the staged snapshots. A failure no
    operator has released holds the whole run (nothing of it is published; the staged snapshots
    are left to expiry) and is recorded for cdc_freshness, the CLI and the Lakehouse page."""
    config = load_table_config(settings)
    failures = audit(spark, stage, {t: config.for_table(t) for t in tables})
    if not failures:
        return False
    store = stores.open_store(settings)
    waiting = holds.unreleased(store, failures)
    for r in results:
        r["expectations_failed"] = [f"{f.expectation}: {f.detail}" for f in failures if f.table == r["table"]]
    if not waiting:
        results[0]["released"] = sorted({f.table for f in failures})
        return False
    holds.hold(store, failures, list(tables))
    for r in results:
        r.update(committed=False, held_by_expectation=True)
    _say("publish held by expectations: " + "; ".join(f"{f.table}: {f.expectation}: {f.detail}" for f in waiting))
    return True


MAX_HELD_SHOWN = 20
"""Held transactions a result names (the rest are counted by wholeness, not listed)."""


def _positions(settings: Settings, tables: Sequence[str], reached: dict[str, str]) -> dict[str, str]:
    """Each source's position after this run: the greatest of what the tables' newest publishes
    reached and what this run's transactions reach (a run applying nothing of a source keeps
    carrying its position, so every snapshot of the unit says where it stands)."""
    found: dict[str, list[str]] = {s: [p] for s, p in reached.items()}
    for t in tables:
        for s, p in positions_of(applied_summary(settings, t)).items():
            found.setdefault(s, []).append(p)
    return {s: g for s, ps in found.items() if (g := greatest(ps)) is not None}


def stage_table(p: Pending, stage: Stage, result: dict[str, Any], crash_at: str | None) -> None:
    """One table's pending objects read, fitted, classified and written, staged in ``stage``."""
    with _static_plans(p.run.spark, p.events_at_most):
        _stage_table(p, stage, result, crash_at)


def _stage_table(p: Pending, stage: Stage, result: dict[str, Any], crash_at: str | None) -> None:
    spark, settings, table = p.run.spark, p.run.settings, p.run.table
    phases = Phases()
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
    small = p.events_at_most is not None and p.events_at_most <= IDS_AS_VALUES_AT_MOST
    fitted = fit(rows, target, limits, after, ids=small)
    phases.end("fit")
    # The cache fit() made goes whatever happens next: a retried commit conflict runs the apply
    # again, and a long-lived Connect server would keep every failed attempt's cache.
    try:
        resumed = p.names if p.resumed else ()
        marked, n_seen, n_seen_quarantined = mark_seen(p.run, fitted, resumed)
        phases.end("history")

        valid, quarantined, n_unresolved = settle(marked, fitted.unavailable, spark.table(ident))
        classified = decide(p.run, valid, narrow_join(fitted.distinct, p.rows))
        phases.end("classify")

        n_quarantined = fitted.quarantined - n_seen_quarantined + n_unresolved
        tally = account(table, classified, fitted, n_seen, n_quarantined)
        phases.end("count")

        crash("before-write", crash_at)
        write_staged(p, Decided(quarantined, classified, target, tally, fitted.unavailable), stage, phases, crash_at)
    finally:
        fitted.release()
    result.update(committed=True, **tally.counts, seconds=phases.total(), phases=phases.seconds)


ADAPTIVE = "spark.sql.adaptive.enabled"
ADAPTIVE_MIN_EVENTS = 100_000
"""A run of fewer events plans its Spark jobs statically (adaptive query execution off until its
end). AQE re-plans after every shuffle and broadcast stage and runs each as a job of its own: a
micro-batch was ~26 such jobs whose planning, not their data, was its cost (docs/benchmarks.md,
"Static plans for small runs"). A bigger run keeps it: there AQE's runtime join choices pay."""


def _static_plans(spark: SparkSession, events: int | None) -> contextlib.ExitStack:
    """Adaptive query execution off for a run of fewer than :data:`ADAPTIVE_MIN_EVENTS` (``events``:
    a bound from the objects' receipts, known before the read; None, an older receiver's
    objects: AQE stays); closing the stack puts the session's setting back (a Connect session
    outlives the run)."""
    stack = contextlib.ExitStack()
    if events is not None and events < ADAPTIVE_MIN_EVENTS:
        was = spark.conf.get(ADAPTIVE, None)
        spark.conf.set(ADAPTIVE, "false")
        stack.callback(lambda: spark.conf.set(ADAPTIVE, was) if was is not None else spark.conf.unset(ADAPTIVE))
    return stack


@dataclass(frozen=True)
class Decided:
    """What a run writes: its quarantined and classified events, the table's schema, the counts."""

    quarantined: DataFrame
    classified: DataFrame
    target: StructType
    tally: Tally
    unavailable: list[str]


def write_staged(p: Pending, d: Decided, staged: Stage, phases: Phases, crash_at: str | None) -> None:
    """The side tables' and the table's writes, staged under the run's id for its one publish
    (:mod:`spark_jobs.stage`)."""
    spark, settings, table = p.run.spark, p.run.settings, p.run.table
    log_decisions(p, d.quarantined, d.classified, d.target, d.tally, staged)
    _crash_after_side_tables(staged, crash_at)
    phases.end("side_tables")
    with Commit(spark, metrics_properties(settings, table, d.tally.counts, phases.seconds)):
        applied = d.classified.where(F.col(OUTCOME) == "applied")
        commit_table(p, applied, d.target, d.unavailable, d.tally, staged, crash_at)
    phases.end("merge")


def _crash_after_side_tables(staged: Stage, crash_at: str | None) -> None:
    """The test crash between the side tables and the table; with :data:`OLDER_AUX_CRASH` the side
    tables are published first, the state an older cdclake's crash there left."""
    if crash_at == OLDER_AUX_CRASH:
        staged.publish()
        raise SimulatedCrash(crash_at)
    crash("after-aux", crash_at)


def metrics_properties(
    settings: Settings, table: str, counts: dict[str, int], seconds: dict[str, float]
) -> dict[str, str]:
    """What the table's commit carries beside the watermark and this apply's counts: the running
    totals and the phase seconds so far, the durable record the REST catalog's /metrics reads
    (apply tasks are short-lived, maybe on other machines). Read under the table lock, so no
    other apply commits between this read and the commit; a conflict retry reads again."""
    return total_properties(applied_summary(settings, table), counts) | phase_properties(seconds)


def apply_table(
    spark: SparkSession, settings: Settings, table: str, max_objects: int, crash_at: str | None = None
) -> dict[str, Any]:
    """:func:`apply_tables` of one table (its result)."""
    return apply_tables(spark, settings, [table], max_objects, crash_at)[0]


def apply_with_retries(
    spark: SparkSession, settings: Settings, table: str, max_objects: int, attempts: int = 3
) -> dict[str, Any]:
    """:func:`apply_together` of one table (its result; the run may have applied its unit)."""
    results = apply_together(spark, settings, [table], max_objects, attempts)
    return next(r for r in results if r["table"] == table)


def apply_together(
    spark: SparkSession, settings: Settings, tables: Sequence[str], max_objects: int, attempts: int = 3
) -> list[dict[str, Any]]:
    """Each attempt holds the lock of every table it applies (cdclake.lake.locks, shared with
    compaction and expiry; taken in name order, so two runs sharing tables cannot deadlock)
    from listing to the publish (a staged snapshot is right only while main is still its parent),
    so maintenance never commits between its read and its commits (apache/iceberg #4996); a
    failure or crash releases them (at once, or after the TTL). The lock is first come first
    served and released between attempts, so a stream of applies does not starve maintenance.
    Holding it, the job refreshes the tables it reads and writes once it has found something to
    apply (another session's compaction may have committed while it waited). Optimistic-commit
    conflicts (another writer, e.g. through the REST catalog; a refused publish) re-run the whole
    apply, which re-reads the watermarks and so never applies anything twice.

    With the consistent publish on, the run's tables are the unit of ``tables``
    (:func:`cdclake.lake.selection.unit`): every table a landed transaction links to them."""
    attempt = 0

    def once() -> list[dict[str, Any]]:
        nonlocal attempt
        attempt += 1
        run = list(tables)
        if settings.consistent_publish:
            run = selection.unit(tables, selection.survey(stores.open_store(settings)))
        with contextlib.ExitStack() as held:
            for t in sorted(run):
                held.enter_context(table_lock(settings, t, "apply", ttl_s=APPLY_LOCK_TTL_S, say=_say))
            return apply_tables(spark, settings, run, max_objects)

    results = with_retries(f"on {', '.join(tables)}", once, attempts=attempts)
    for r in results:
        r["attempts"] = attempt
    return results


def _say(text: str) -> None:
    print(f"cdclake: {text}", file=sys.stderr, flush=True)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="spark_jobs.apply", description=(__doc__ or "").splitlines()[0])
    p.add_argument(
        "--table",
        required=True,
        action="append",
        help="staging table name (lower case); several: applied in one run and published together",
    )
    p.add_argument("--max-objects", type=int, default=None, help="cap on staging objects per table this run")
    return p.parse_args(argv)


def main(spark: SparkSession, argv: Sequence[str] | None = None) -> dict[str, Any]:
    """The run's result: one table's, or with several ``--table`` the first's with ``tables``
    holding each table's (what spark_jobs.group's drain reads: ``committed`` if any committed)."""
    args = parse_args(argv)
    settings = load()
    results = apply_together(spark, settings, args.table, args.max_objects or settings.max_objects_per_run)
    for r in results:
        report(r)
    if len(results) == 1:
        return results[0]
    return {"tables": results, "committed": any(r.get("committed") for r in results)}


if __name__ == "__main__":
    run_main("cdclake-apply", main)
