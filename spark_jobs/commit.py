"""Writing a run's decisions, each write carrying its own consumed-staging watermark:

1. ``<table>__quarantine``  events whose values do not fit the table, with the reason and the
                            staged line (append; :mod:`spark_jobs.quarantine`)
2. ``<table>__changes``     every distinct, non-quarantined event with its outcome (append)
3. ``<table>__tombstones``  ordering value of deleted keys, so late events cannot resurrect them (append)
4. ``<table>``              MERGE of the applied events + watermark + accounting

Each write is staged (:mod:`spark_jobs.stage`), not committed: the run publishes all of them in
one catalog commit. Steps 1-3 each skip the objects their own watermark already holds
(:mod:`spark_jobs.pending`: only a table an older cdclake left with its side tables ahead)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from cdclake.config.settings import Settings
from cdclake.contracts import history
from cdclake.contracts.watermark import count_properties
from cdclake.lake.catalog import load_table
from cdclake.lake.spark import table_ident
from spark_jobs import backfill
from spark_jobs.decide import TRUNCATE, Tally
from spark_jobs.maintain import refresh_tables
from spark_jobs.pending import CHANGES, HISTORY_OBJECT, QUARANTINE, TOMBSTONES, Pending, aux_watermark
from spark_jobs.quarantine import quarantine_rows, staged_lines
from spark_jobs.sqltext import col, quote
from spark_jobs.stage import PROPERTY_PREFIX, WAP_ID_CONF, Stage
from spark_jobs.system import (
    IMAGE_BEFORE,
    KEEP,
    KEY,
    METADATA,
    OBJECT,
    OP,
    ORDER,
    OUTCOME,
    SEQ,
    SOURCE,
    TRANSACTION,
    SimulatedCrash,
    ordering,
)
from spark_jobs.table import align_to, ensure_table

Build = Callable[[list[str]], DataFrame]  # a side table's rows of the given objects


def log_decisions(
    p: Pending, quarantined: DataFrame, classified: DataFrame, target: StructType, t: Tally, stage: Stage
) -> None:
    """Steps 1-3: the side tables, staged."""
    uris = dict(zip(p.names, p.uris, strict=True))
    lines = staged_lines(p.run.spark, uris, quarantined) if t.counts["quarantined"] else None
    _append_aux(p, QUARANTINE, quarantine_rows(quarantined, lines), stage, known=t.counts["quarantined"])
    _append_aux(p, CHANGES, change_rows(classified, target), stage, known=t.changes)
    _append_aux(p, TOMBSTONES, tombstone_rows(classified), stage, known=t.deletes)


def change_rows(classified: DataFrame, target: StructType) -> Build:
    return lambda todo: classified.where(F.col(OBJECT).isin(todo) & (F.col(OUTCOME) != "duplicate")).select(
        *[col(f.name) for f in target.fields],
        F.col(OP).alias(history.OPERATION),
        F.col(OUTCOME).alias(history.OUTCOME),
        F.current_timestamp().alias(history.COMMITTED_AT),
        F.col(OBJECT).alias(HISTORY_OBJECT),
        F.col(IMAGE_BEFORE).alias(history.BEFORE),
        F.col(METADATA).alias(history.METADATA),
        F.col(TRANSACTION).alias(history.TRANSACTION),
    )


def tombstone_rows(classified: DataFrame) -> Build:
    """One row per applied DELETE; classify takes each key's newest. Appended, not MERGEd: a
    MERGE into the (copy-on-write) tombstones rewrote every data file holding a deleted key, a
    cost that grew with the table, and took four Spark jobs where an append takes one.
    An applied TRUNCATE's row has no key: later runs find the newest (:func:`decide.truncation`)."""
    applied_deletes = (F.col(OUTCOME) == "applied") & F.col(OP).isin("DELETE", TRUNCATE)
    key = F.when(F.col(OP) != TRUNCATE, F.col(KEY)).alias(KEY)
    return lambda todo: classified.where(F.col(OBJECT).isin(todo) & applied_deletes).select(
        key, SEQ, SOURCE, ORDER, F.current_timestamp().alias("_cdc_deleted_at")
    )


def commit_table(
    p: Pending,
    applied: DataFrame,
    target: StructType,
    unavailable: Sequence[str],
    t: Tally,
    stage: Stage,
    crash_at: str | None,
) -> None:
    """Step 4: the applied events MERGEd into the table, with the watermark and the accounting; staged."""
    spark, ident = p.run.spark, p.run.ident()
    props = {
        **p.run.watermark_props(p.watermark, p.names),
        "cdclake.objects": str(len(p.names)),
        **count_properties(t.counts),
    }
    columns = [f.name for f in target.fields]
    rows = applied.where(F.col(OP) != TRUNCATE).select(*map(col, columns), OP, KEEP)
    with Commit(spark, props), stage.write(ident):
        if crash_at == "before-commit":
            _write_without_commit(spark, ident, rows, columns)
        merge_rows(spark, ident, rows, columns, unavailable, t.truncated)
        commit_always(spark, stage, ident, target)


@dataclass
class Commit:
    """Snapshot properties set on the session for exactly one commit."""

    spark: SparkSession
    props: dict[str, str]

    def __enter__(self) -> Commit:
        for k, v in self.props.items():
            self.spark.conf.set(PROPERTY_PREFIX + k, v)
        return self

    def __exit__(self, *exc: object) -> None:
        for k in self.props:
            self.spark.conf.unset(PROPERTY_PREFIX + k)


def merge_rows(
    spark: SparkSession,
    ident: str,
    source: DataFrame,
    columns: Sequence[str],
    keepable: Sequence[str] = (),
    truncated: list[int] | None = None,
) -> None:
    """Upsert/delete by key; the ordering guard makes a stale or repeated source row a no-op.
    Columns in ``keepable`` keep the stored value where the source row lists them in KEEP.
    ``truncated``: the ordering value of the run's TRUNCATE; every row ordered before it that no
    source row replaces goes, in the same commit (a source row is newer than it: classify
    superseded the older ones).

    Column names appear in the statement only quoted (spark_jobs.sqltext); whether a row keeps
    a column is a boolean column of the source, computed by the DataFrame API, so no name is
    ever a SQL literal."""
    flags = {c: f"_cdc_w_keep{i}" for i, c in enumerate(c for c in columns if c in keepable)}
    source.select(
        "*", *[F.array_contains(F.col(KEEP), c).alias(flag) for c, flag in flags.items()]
    ).createOrReplaceTempView("cdclake_apply_source")
    q = [quote(c) for c in columns]

    def assign(c: str) -> str:
        t, s = f"t.{quote(c)}", f"s.{quote(c)}"
        return f"{t} = CASE WHEN s.{flags[c]} THEN {t} ELSE {s} END" if c in flags else f"{t} = {s}"

    set_list = ", ".join(assign(c) for c in columns if c != KEY)
    newer = f"{ordering('s.')} > {ordering('t.')}"
    # The ordering value is a parameter, never SQL text.
    gone = (
        f"WHEN NOT MATCHED BY SOURCE AND coalesce(t.{ORDER}, array(t.{SEQ})) < CAST(:cut AS array<bigint>) THEN DELETE"
        if truncated is not None
        else ""
    )
    spark.sql(
        f"""MERGE INTO {ident} t USING cdclake_apply_source s ON t.{KEY} = s.{KEY}
            WHEN MATCHED AND {newer} AND s.{OP} = 'DELETE' THEN DELETE
            WHEN MATCHED AND {newer} THEN UPDATE SET {set_list}
            WHEN NOT MATCHED AND s.{OP} <> 'DELETE' THEN INSERT ({", ".join(q)})
              VALUES ({", ".join("s." + c for c in q)})
            {gone}""",
        args={"cut": truncated} if truncated is not None else None,
    )


def commit_always(spark: SparkSession, stage: Stage, ident: str, schema: StructType) -> None:
    """A MERGE that changes no row stages nothing; the watermark must still advance. Asked of
    the staged snapshots, not of ``main``: under write-audit-publish ``main`` never moves here."""
    if stage.staged(ident.rsplit(".", 1)[1]) is None:
        spark.createDataFrame([], schema).writeTo(ident).append()


def fill_defaults(spark: SparkSession, settings: Settings, table: str, result: dict[str, Any]) -> None:
    """The backfills the table records (:mod:`spark_jobs.backfill`), after this run's MERGE or a
    crashed run's: also when nothing is pending, since a crash after the MERGE leaves none (the
    apply then has not refreshed the table since it got the lock: refreshed here, rarely)."""
    t = load_table(settings, table)  # pyiceberg: the properties in milliseconds, no Spark job
    if t is None or not any(k.startswith(backfill.PREFIX) for k in t.properties):
        return
    refresh_tables(spark, [table_ident(settings, table)])
    filled = backfill.fill(spark, table_ident(settings, table), t.properties, f"coalesce({ORDER}, array({SEQ}))")
    if filled:
        result["defaults_filled"] = filled


def _empty(df: DataFrame, todo: list[str], names: list[str], known: int | None) -> bool:
    """Whether ``df`` (rows of the ``todo`` objects) has no row; ``known`` counts the rows of all
    of ``names``, so it answers without a Spark job when every object is still to do."""
    if known is not None and (known == 0 or todo == names):
        return known == 0
    return df.isEmpty()


ONE_FILE_BELOW = 100_000
"""A run of fewer events (its receipts' count) writes each side table's rows as one file. Else
its write makes a file per task of the classification (up to spark.sql.shuffle.partitions), and
every later apply reads them all until they are compacted (docs/benchmarks.md, "Small files of a
busy table"). A bigger run keeps its tasks' parallel write."""


def _append_aux(p: Pending, suffix: str, build: Build, stage: Stage, known: int | None = None) -> None:
    run = p.run
    ident = run.ident(suffix)
    wm = aux_watermark(run, suffix, p.watermark)
    todo = [n for n in p.names if not wm.consumed(n)]
    if not todo:
        return
    df = build(todo)
    if _empty(df, todo, p.names, known):
        # Nothing to keep; the main table's watermark covers these objects from now on. The side
        # table is created all the same (no snapshot, no watermark), so it can be queried before
        # its first row: with its table's first apply, or an existing table's next one.
        if not run.spark.catalog.tableExists(ident):
            ensure_table(run.spark, ident, df, key=False)
        return
    schema = ensure_table(run.spark, ident, df, key=False)
    rows = align_to(df, schema)
    if p.events_at_most is not None and p.events_at_most < ONE_FILE_BELOW:
        rows = rows.coalesce(1)
    with Commit(run.spark, run.watermark_props(wm, todo)), stage.write(ident):
        rows.writeTo(ident).append()


def _write_without_commit(spark: SparkSession, ident: str, source: DataFrame, columns: Sequence[str]) -> None:
    """Test hook for the crash "after the MERGE's data files are written, before its snapshot is
    recorded": staged under an id of its own, so the run never finds (or publishes) it."""
    spark.conf.set(WAP_ID_CONF, f"crash-{time.time_ns()}")
    merge_rows(spark, ident, source, columns)  # the enclosing Stage.write unsets the id
    raise SimulatedCrash("before-commit")
