"""Apply one table's pending staging objects to its Iceberg table, exactly once.

read staging -> normalise -> drop exact duplicates -> quarantine values that do not fit the table
-> newest event per key -> classify against the table and its tombstones (applied / late /
duplicate) -> commit, each commit carrying its own consumed-staging watermark:

1. ``<table>__quarantine``  events whose values do not fit the table, with the reason (append)
2. ``<table>__changes``     every distinct, non-quarantined event with its outcome (append)
3. ``<table>__tombstones``  ordering value of deleted keys, so late events cannot resurrect them
4. ``<table>``              MERGE of the applied events + watermark + accounting, one commit

Steps 1-3 run before 4 and each skips objects its own watermark already holds, so a crash at any
point followed by a re-run gives the same tables. Re-running on the same staging data finds
nothing pending and commits nothing.

Run by the ``cdc_apply`` DAG through spark-submit::

    spark-submit --jars ... --conf ... spark_jobs/apply.py --table orders
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import DataType, StructType

from cdclake import staging
from cdclake.catalog import load_table, table_watermark
from cdclake.events import CHANGES_SUFFIX, QUARANTINE_SUFFIX, TOMBSTONES_SUFFIX, UNAVAILABLE
from cdclake.settings import Settings, load
from cdclake.spark import table_ident
from cdclake.tables import TableOptions, load_table_config, transform_column
from cdclake.watermark import SUMMARY_KEY, Watermark
from spark_jobs.schema import conform, missing_fields, widenings

KEY = "_cdc_row_id"  # "_row_id" is reserved by Iceberg (v3 row lineage)
SEQ = "_cdc_seq"
TS = "_cdc_ts"
SOURCE = "_cdc_source"
ORDER = "_cdc_order"  # the ordering value: the event's `order`, else [sequence]
SYSTEM_COLUMNS = (KEY, SEQ, TS, SOURCE, ORDER)
# Working columns, never stored in the main table:
OP = "_cdc_w_op"
OBJECT = "_cdc_w_object"
RANK = "_cdc_w_rank"
REASON = "_cdc_w_reason"
OUTCOME = "_cdc_w_outcome"
KEEP = "_cdc_w_keep"  # names of columns whose value was unavailable: keep what is stored
COPIES = "_cdc_w_copies"  # deliveries of one distinct event
WORK_COLUMNS = (OP, OBJECT, RANK, REASON, OUTCOME, KEEP, COPIES)

CHANGES, QUARANTINE, TOMBSTONES = CHANGES_SUFFIX, QUARANTINE_SUFFIX, TOMBSTONES_SUFFIX
PROPERTY_PREFIX = "spark.sql.iceberg.snapshot-property."
CRASH_POINTS = ("before-write", "after-aux", "before-commit", "after-commit")
PARTITION_PROPERTY = "cdclake.partition-by"  # the configured transforms already in the spec

TABLE_PROPERTIES = {"format-version": "2"}


class AccountingError(RuntimeError):
    """received != applied + duplicate + superseded + late + quarantined: a bug, never data."""


class SimulatedCrash(RuntimeError):
    """Raised at a CRASH_POINT by tests that prove re-runs converge."""


# ---------------------------------------------------------------- pure transforms


def normalise(raw: DataFrame) -> DataFrame:
    """Staged events (see cdclake.events.StagedEvent) -> one typed row per event."""
    after_type = raw.schema["after"].dataType if "after" in raw.columns else None
    after = F.col("after") if isinstance(after_type, StructType) else F.lit(None).cast("struct<>")
    seq = F.col("sequence").cast("long")
    given = F.col("order").cast("array<bigint>") if "order" in raw.columns else F.lit(None).cast("array<bigint>")
    return raw.select(
        F.col("rowId").cast("string").alias(KEY),
        seq.alias(SEQ),
        F.timestamp_millis(F.col("timestamp").cast("long")).alias(TS),
        F.col("source").cast("string").alias(SOURCE),
        F.coalesce(given, F.array(seq)).alias(ORDER),
        F.col("operation").cast("string").alias(OP),
        (F.col(OBJECT) if OBJECT in raw.columns else F.lit(None).cast("string")).alias(OBJECT),
        after.alias("after"),
    )


def read_staging(spark: SparkSession, uris: list[str]) -> DataFrame:
    """Staging objects as rows, each tagged with its object name for the per-table watermarks."""
    raw = spark.read.option("mode", "FAILFAST").json(uris)
    # <day>/<hour>/<file>; substring_index, not a regex: a regex per row cost ~2.5 s per 1M events.
    name = F.substring_index(F.col("_metadata.file_path"), "/", -3)
    return raw.withColumn(OBJECT, name)


def drop_exact_duplicates(events: DataFrame, copies: str | None = None) -> DataFrame:
    """Same producer + same event sequence = the same event delivered twice. With ``copies``,
    that column counts the deliveries of each kept event (their sum is the events received)."""
    if copies is None:
        return events.dropDuplicates([SOURCE, SEQ])
    others = [c for c in events.columns if c not in (SOURCE, SEQ)]
    return events.groupBy(SOURCE, SEQ).agg(*[F.first(c).alias(c) for c in others], F.count(F.lit(1)).alias(copies))


def flatten(events: DataFrame) -> DataFrame:
    """After-image fields become columns next to the system and working columns."""
    t = events.schema["after"].dataType
    fields = [f.name for f in t.fields] if isinstance(t, StructType) else []
    user = [n for n in fields if n not in SYSTEM_COLUMNS and n not in WORK_COLUMNS]
    extra = [COPIES] if COPIES in events.columns else []
    return events.select(
        KEY, *[F.col("after").getField(n).alias(n) for n in user], SEQ, TS, SOURCE, ORDER, OP, OBJECT, *extra
    )


def mark_unavailable(rows: DataFrame) -> DataFrame:
    """Placeholder values become NULL, their column names listed in KEEP."""
    strings = [
        f.name
        for f in rows.schema.fields
        if f.name not in SYSTEM_COLUMNS + WORK_COLUMNS and f.dataType.simpleString() == "string"
    ]
    keep = F.filter(
        F.array(*[F.when(F.col(c) == UNAVAILABLE, F.lit(c)) for c in strings]) if strings else F.array(),
        lambda x: x.isNotNull(),
    ).cast("array<string>")
    cols = [
        F.when(F.col(c) == UNAVAILABLE, F.lit(None)).otherwise(F.col(c)).alias(c) if c in strings else F.col(c)
        for c in rows.columns
    ]
    return rows.select(*cols, keep.alias(KEEP))  # column order kept: it becomes the table's


def fill_unavailable(valid: DataFrame, columns: Sequence[str]) -> DataFrame:
    """An unavailable value takes the key's newest earlier value in this run, if any; only what
    is still unknown stays in KEEP (and is then kept from the stored row by the MERGE)."""
    if not columns:
        return valid
    w = Window.partitionBy(KEY).orderBy(ORDER, SOURCE, SEQ).rowsBetween(Window.unboundedPreceding, Window.currentRow)
    out = valid
    still = []
    for c in columns:
        missing = F.array_contains(F.col(KEEP), c)
        known = F.last(F.when(~missing, F.struct(F.col(c).alias("v"))), ignorenulls=True).over(w)
        out = out.withColumn(f"_cdc_w_known_{c}", known)
        out = out.withColumn(
            c,
            F.when(
                missing & F.col(f"_cdc_w_known_{c}").isNotNull(), F.col(f"_cdc_w_known_{c}").getField("v")
            ).otherwise(F.col(c)),
        )
        still.append(F.when(missing & F.col(f"_cdc_w_known_{c}").isNull(), F.lit(c)))
    out = out.withColumn(KEEP, F.filter(F.array(*still), lambda x: x.isNotNull()).cast("array<string>"))
    return out.drop(*[f"_cdc_w_known_{c}" for c in columns])


def fit_to_table(rows: DataFrame, target: StructType) -> DataFrame:
    """Rows in the table's column order and types, plus REASON (null when every value fits).

    Columns the event lacks become NULL: an after-image is the whole row.
    """
    present = {f.name.lower(): f for f in rows.schema.fields}
    cols, reasons = [], []
    for f in target.fields:
        src = present.get(f.name.lower())
        if src is None:
            cols.append(F.lit(None).cast(f.dataType).alias(f.name))
            continue
        value, bad = conform(F.col(src.name), src.dataType, f.dataType)
        cols.append(value.alias(f.name))
        shown = F.substring(F.to_json(F.struct(F.col(src.name).alias(f.name))), 1, 200)
        why = f"column {f.name}: {src.dataType.simpleString()} value does not fit {f.dataType.simpleString()} "
        reasons.append(F.when(bad, F.concat(F.lit(why), shown)))
    reason = F.concat_ws("; ", *reasons) if reasons else F.lit("")
    keep = F.col(KEEP) if KEEP in rows.columns else F.array().cast("array<string>")
    extra = [COPIES] if COPIES in rows.columns else []
    return rows.select(*cols, OP, OBJECT, keep.alias(KEEP), F.when(reason != "", reason).alias(REASON), *extra)


def align_to(df: DataFrame, schema: StructType) -> DataFrame:
    """``df`` in ``schema``'s column order and types; absent columns NULL."""
    present = {f.name.lower(): f for f in df.schema.fields}
    cols = []
    for f in schema.fields:
        src = present.get(f.name.lower())
        value = conform(F.col(src.name), src.dataType, f.dataType)[0] if src else F.lit(None).cast(f.dataType)
        cols.append(value.alias(f.name))
    return df.select(*cols)


def ordering(prefix: str = "") -> str:
    """SQL of a row's full ordering key: ordering value, then source, then sequence (a total,
    deterministic order). Rows stored before ORDER existed compare by ``[sequence]``."""
    p = prefix
    return f"named_struct('o', coalesce({p}{ORDER}, array({p}{SEQ})), 's', {p}{SOURCE}, 'q', {p}{SEQ})"


def rank_per_key(valid: DataFrame) -> DataFrame:
    """RANK 1 = the event with the highest ordering value per key; ties broken by source id."""
    w = Window.partitionBy(KEY).orderBy(F.col(ORDER).desc(), F.col(SOURCE).desc(), F.col(SEQ).desc())
    return valid.withColumn(RANK, F.row_number().over(w))


def classify(ranked: DataFrame, current: DataFrame, tombstones: DataFrame) -> DataFrame:
    """OUTCOME per event: superseded (not the newest of its key in this run), late (older than
    the stored row or the key's tombstone), duplicate (the stored row or tombstone IS this event),
    else applied.

    A DELETE equal to its tombstone while the row is still there is applied again: that is a
    re-run after a crash between the tombstone commit and the table commit.
    """
    # Only the stored rows of this batch's keys: a broadcast semi-join scans the table without
    # shuffling it, so the cost grows with the table's scan, not its shuffle.
    keys = F.broadcast(ranked.select(KEY).distinct())
    cur = with_order(current).join(keys, KEY, "left_semi").select(F.col(KEY), F.expr(ordering()).alias("_row"))
    tomb = with_order(tombstones).select(F.col(KEY), F.expr(ordering()).alias("_tomb"))
    ev = F.expr(ordering())
    row, tb = F.col("_row"), F.col("_tomb")
    outcome = (
        F.when(F.col(RANK) > 1, "superseded")
        .when(row.isNotNull() & (ev < row), "late")
        .when(row.isNotNull() & (ev == row), "duplicate")
        .when(tb.isNotNull() & (ev < tb), "late")
        .when(tb.isNotNull() & (ev == tb) & row.isNull(), "duplicate")
        .otherwise("applied")
    )
    return ranked.join(cur, KEY, "left").join(tomb, KEY, "left").withColumn(OUTCOME, outcome).drop("_row", "_tomb")


def with_order(df: DataFrame) -> DataFrame:
    """Tables written before ORDER existed lack it: they compare by ``[sequence]``."""
    return df if ORDER in df.columns else df.withColumn(ORDER, F.lit(None).cast("array<bigint>"))


# ---------------------------------------------------------------- table I/O


def _ddl(t: DataType) -> str:
    return t.simpleString()


def ensure_table(
    spark: SparkSession, ident: str, rows: DataFrame, key: bool = True, options: TableOptions | None = None
) -> StructType:
    """Create the table from the first after-images, add what it lacks, widen what may widen,
    and bring partitioning and merge mode in line with the table's configured options."""
    wanted = [f for f in rows.schema.fields if f.name not in WORK_COLUMNS]
    opts = options or TableOptions()
    if not spark.catalog.tableExists(ident):
        spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {ident.rsplit('.', 1)[0]}")
        cols = ", ".join(f"`{f.name}` {_ddl(f.dataType)}{' NOT NULL' if key and f.name == KEY else ''}" for f in wanted)
        props = ", ".join(f"'{k}'='{v}'" for k, v in {**TABLE_PROPERTIES, **opts.properties}.items())
        spark.sql(f"CREATE TABLE IF NOT EXISTS {ident} ({cols}) USING iceberg TBLPROPERTIES ({props})")
        if key:
            spark.sql(f"ALTER TABLE {ident} SET IDENTIFIER FIELDS {KEY}")
    target = spark.table(ident).schema
    src = StructType([f for f in wanted if f.name not in SYSTEM_COLUMNS])
    have = {f.name for f in target.fields}
    adds = [(f.name, f.dataType) for f in wanted if f.name in SYSTEM_COLUMNS and f.name not in have]
    adds += missing_fields(src, target, "")
    widen = widenings(src, target, "")
    for path, t in adds:
        spark.sql(f"ALTER TABLE {ident} ADD COLUMN {path} {_ddl(t)}")
    for path, t in widen:
        spark.sql(f"ALTER TABLE {ident} ALTER COLUMN {path} TYPE {_ddl(t)}")
    schema = spark.table(ident).schema if adds or widen else target
    if options is not None:
        apply_options(spark, ident, schema, options)
    return schema


def apply_options(spark: SparkSession, ident: str, schema: StructType, options: TableOptions) -> None:
    """Merge mode as configured; configured partition fields added once their column exists
    (partition evolution: existing files keep their old spec). Fields are never dropped here."""
    props = {r["key"]: r["value"] for r in spark.sql(f"SHOW TBLPROPERTIES {ident}").collect()}
    changed = {k: v for k, v in options.properties.items() if props.get(k) != v}
    applied = json.loads(props.get(PARTITION_PROPERTY, "[]"))
    columns = {f.name.lower() for f in schema.fields}
    new = [t for t in options.partition_by if t not in applied and transform_column(t).lower() in columns]
    for transform in new:
        spark.sql(f"ALTER TABLE {ident} ADD PARTITION FIELD {transform}")
    if new:
        changed[PARTITION_PROPERTY] = json.dumps([*applied, *new])
    if changed:
        pairs = ", ".join(f"'{k}'='{v}'" for k, v in changed.items())
        spark.sql(f"ALTER TABLE {ident} SET TBLPROPERTIES ({pairs})")


def current_snapshot_id(settings: Settings, ident: str) -> int | None:
    # pyiceberg reads the catalog row and metadata file in milliseconds; the same question through
    # Spark SQL (``<table>.history``) is a planned query, ~0.3 s, asked twice per commit.
    t = load_table(settings, ident.rsplit(".", 1)[1])
    snap = t.current_snapshot() if t is not None else None
    return snap.snapshot_id if snap is not None else None


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
    spark: SparkSession, ident: str, source: DataFrame, columns: Sequence[str], keepable: Sequence[str] = ()
) -> None:
    """Upsert/delete by key; the ordering guard makes a stale or repeated source row a no-op.
    Columns in ``keepable`` keep the stored value where the source row lists them in KEEP."""
    source.createOrReplaceTempView("cdclake_apply_source")
    q = [f"`{c}`" for c in columns]

    def assign(c: str) -> str:
        if c in keepable:
            return f"t.`{c}` = CASE WHEN array_contains(s.{KEEP}, '{c}') THEN t.`{c}` ELSE s.`{c}` END"
        return f"t.`{c}` = s.`{c}`"

    set_list = ", ".join(assign(c) for c in columns if c != KEY)
    newer = f"{ordering('s.')} > {ordering('t.')}"
    spark.sql(
        f"""MERGE INTO {ident} t USING cdclake_apply_source s ON t.{KEY} = s.{KEY}
            WHEN MATCHED AND {newer} AND s.{OP} = 'DELETE' THEN DELETE
            WHEN MATCHED AND {newer} THEN UPDATE SET {set_list}
            WHEN NOT MATCHED AND s.{OP} <> 'DELETE' THEN INSERT ({", ".join(q)})
              VALUES ({", ".join("s." + c for c in q)})"""
    )


def commit_always(spark: SparkSession, settings: Settings, ident: str, schema: StructType, before: int | None) -> None:
    """A MERGE that changes no row commits nothing; the watermark must still advance."""
    if current_snapshot_id(settings, ident) == before:
        spark.createDataFrame([], schema).writeTo(ident).append()


# ---------------------------------------------------------------- the job


@dataclass
class Run:
    spark: SparkSession
    settings: Settings
    table: str
    listed: list[str]
    horizon: str

    def ident(self, suffix: str = "") -> str:
        return table_ident(self.settings, self.table + suffix)

    def watermark_props(self, wm: Watermark, consumed: Sequence[str]) -> dict[str, str]:
        return {SUMMARY_KEY: wm.advance(consumed, self.listed, self.horizon).encode()}


def _crash(point: str, crash_at: str | None) -> None:
    if crash_at == point:
        raise SimulatedCrash(point)


def apply_table(
    spark: SparkSession,
    settings: Settings,
    table: str,
    max_objects: int,
    crash_at: str | None = None,
) -> dict[str, Any]:
    t0 = time.monotonic()
    phases: dict[str, float] = {}  # wall seconds per step, for the log line and benchmarks
    mark = t0

    def phase(name: str) -> None:
        nonlocal mark
        now = time.monotonic()
        phases[name] = round(now - mark, 2)
        mark = now

    store = staging.LocalStaging(settings.staging_dir)
    ident = table_ident(settings, table)
    # pyiceberg reads the snapshot ancestry in milliseconds; the same query through Spark SQL
    # costs ~3 s of planning on a fresh JVM.
    wm_main = table_watermark(settings, table) or Watermark()
    listed_at_ms = int(time.time() * 1000)
    listed_keys = list(store.list(table, after=wm_main.low))
    unconsumed = [k for k in listed_keys if not wm_main.consumed(k.name)]
    pending = unconsumed[:max_objects]
    result: dict[str, Any] = {"table": table, "objects": len(pending), "pending_total": len(unconsumed)}
    if not pending:
        result["committed"] = False
        return result
    run = Run(
        spark,
        settings,
        table,
        [k.name for k in listed_keys],
        staging.horizon(listed_at_ms - settings.landing_grace_s * 1000),
    )
    names = [k.name for k in pending]

    phase("list")
    events = normalise(read_staging(spark, [store.uri(k) for k in pending]))
    phase("read")  # JSON schema inference (a pass over the files)
    deduped = drop_exact_duplicates(events, copies=COPIES)
    rows = mark_unavailable(flatten(deduped))
    target = ensure_table(spark, ident, rows, options=load_table_config(settings).for_table(table))
    fitted = fit_to_table(rows, target).cache()
    # One pass (parse, dedup, fit, cache) gives every count and the unavailable columns.
    stats = fitted.agg(
        F.sum(COPIES).alias("received"),
        F.count(F.lit(1)).alias("distinct"),
        F.count(REASON).alias("quarantined"),
        F.array_distinct(F.flatten(F.collect_set(KEEP))).alias("unavailable"),
    ).first()
    assert stats is not None
    received, distinct, n_quarantined = stats["received"] or 0, stats["distinct"], stats["quarantined"]
    unavailable = sorted(stats["unavailable"] or [])
    quarantined = fitted.where(F.col(REASON).isNotNull())
    phase("fit")
    valid = fill_unavailable(fitted.where(F.col(REASON).isNull()).drop(REASON), unavailable)
    tomb_ident = run.ident(TOMBSTONES)
    tombstones = (
        spark.table(tomb_ident)
        if spark.catalog.tableExists(tomb_ident)
        else spark.createDataFrame([], f"{KEY} string, {SEQ} long, {SOURCE} string, {ORDER} array<bigint>")
    )
    current = with_order(spark.table(ident)).select(KEY, SEQ, SOURCE, ORDER)
    # Checkpointed, not just cached: the MERGE below must not plan a source that reads its own
    # target (Spark 4.1 fails with "No plan for TableReference"), and the tombstone table changes
    # before the MERGE runs.
    classified = classify(rank_per_key(valid), current, tombstones).localCheckpoint(eager=True)
    phase("classify")

    tally = classified.groupBy(OUTCOME, (F.col(OP) == "DELETE").alias("del")).count().collect()
    outcomes: dict[str, int] = {}
    for r in tally:
        outcomes[r[OUTCOME]] = outcomes.get(r[OUTCOME], 0) + r["count"]
    applied_deletes = sum(r["count"] for r in tally if r[OUTCOME] == "applied" and r["del"])
    counts = {
        "received": received,
        "applied": outcomes.get("applied", 0),
        "duplicate": received - distinct + outcomes.get("duplicate", 0),
        "superseded": outcomes.get("superseded", 0),
        "late": outcomes.get("late", 0),
        "quarantined": n_quarantined,
    }
    accounted = sum(v for k, v in counts.items() if k != "received")
    if accounted != received:
        raise AccountingError(f"{table}: received {received} != accounted {accounted} {counts}")
    phase("count")
    _crash("before-write", crash_at)

    committed_at = F.current_timestamp()

    # 1. quarantine
    _append_aux(
        run,
        QUARANTINE,
        names,
        lambda todo: quarantined.where(F.col(OBJECT).isin(todo)).select(
            KEY,
            SEQ,
            TS,
            SOURCE,
            F.col(OP).alias("_cdc_operation"),
            F.col(OBJECT).alias("_cdc_object"),
            F.col(REASON).alias("_cdc_reason"),
            committed_at.alias("_cdc_quarantined_at"),
        ),
        wm_main,
        known=n_quarantined,
    )
    # 2. change history
    _append_aux(
        run,
        CHANGES,
        names,
        lambda todo: classified.where(F.col(OBJECT).isin(todo) & (F.col(OUTCOME) != "duplicate")).select(
            *[F.col(f.name) for f in target.fields],
            F.col(OP).alias("_cdc_operation"),
            F.col(OUTCOME).alias("_cdc_outcome"),
            committed_at.alias("_cdc_committed_at"),
        ),
        wm_main,
        known=distinct - n_quarantined - outcomes.get("duplicate", 0),
    )
    # 3. tombstones
    applied = classified.where(F.col(OUTCOME) == "applied")
    _merge_tombstones(run, names, applied, wm_main, known=applied_deletes)
    _crash("after-aux", crash_at)

    phase("side_tables")
    # 4. the table itself
    before = current_snapshot_id(settings, ident)
    props = {
        **run.watermark_props(wm_main, names),
        "cdclake.objects": str(len(pending)),
        **{f"cdclake.events-{k}": str(v) for k, v in counts.items()},
    }
    columns = [f.name for f in target.fields]
    with Commit(spark, props):
        if crash_at == "before-commit":
            _write_without_commit(spark, ident, applied.select(*columns, OP, KEEP), columns)
        merge_rows(spark, ident, applied.select(*columns, OP, KEEP), columns, unavailable)
        commit_always(spark, settings, ident, target, before)
    _crash("after-commit", crash_at)
    phase("merge")
    _expire_tombstones(run)

    fitted.unpersist()
    result.update(committed=True, **counts, seconds=round(time.monotonic() - t0, 2), phases=phases)
    return result


def _aux_watermark(run: Run, suffix: str, wm_main: Watermark) -> Watermark:
    # An aux table holds everything the main table consumed (it commits first in every run),
    # plus, after a crash, the objects of the run that did not reach the main commit.
    wm = table_watermark(run.settings, run.table + suffix)
    return wm_main if wm is None else wm.union(wm_main)


def _empty(df: DataFrame, todo: list[str], names: list[str], known: int | None) -> bool:
    """Whether ``df`` (rows of the ``todo`` objects) has no row; ``known`` counts the rows of all
    of ``names``, so it answers without a Spark job when every object is still to do."""
    if known is not None and (known == 0 or todo == names):
        return known == 0
    return df.isEmpty()


def _append_aux(
    run: Run, suffix: str, names: list[str], build: Any, wm_main: Watermark, known: int | None = None
) -> None:
    ident = run.ident(suffix)
    wm = _aux_watermark(run, suffix, wm_main)
    todo = [n for n in names if not wm.consumed(n)]
    if not todo:
        return
    df: DataFrame = build(todo)
    if _empty(df, todo, names, known):
        return  # nothing to keep; the main table's watermark covers these objects from now on
    schema = ensure_table(run.spark, ident, df, key=False)
    with Commit(run.spark, run.watermark_props(wm, todo)):
        align_to(df, schema).writeTo(ident).append()


def _merge_tombstones(
    run: Run, names: list[str], applied: DataFrame, wm_main: Watermark, known: int | None = None
) -> None:
    ident = run.ident(TOMBSTONES)
    wm = _aux_watermark(run, TOMBSTONES, wm_main)
    todo = [n for n in names if not wm.consumed(n)]
    deletes = applied.where(F.col(OBJECT).isin(todo) & (F.col(OP) == "DELETE")).select(
        KEY, SEQ, SOURCE, ORDER, F.current_timestamp().alias("_cdc_deleted_at")
    )
    if not todo or _empty(deletes, todo, names, known):
        return
    ensure_table(run.spark, ident, deletes)
    before = current_snapshot_id(run.settings, ident)
    deletes.createOrReplaceTempView("cdclake_tombstones_source")
    with Commit(run.spark, run.watermark_props(wm, todo)):
        run.spark.sql(
            f"""MERGE INTO {ident} t USING cdclake_tombstones_source s ON t.{KEY} = s.{KEY}
                WHEN MATCHED AND {ordering("s.")} > {ordering("t.")} THEN UPDATE SET *
                WHEN NOT MATCHED THEN INSERT *"""
        )
        commit_always(run.spark, run.settings, ident, run.spark.table(ident).schema, before)


def _expire_tombstones(run: Run) -> None:
    ident = run.ident(TOMBSTONES)
    if not run.spark.catalog.tableExists(ident):
        return
    cutoff = f"current_timestamp() - INTERVAL {run.settings.tombstone_retention_s} SECONDS"
    if run.spark.table(ident).where(f"_cdc_deleted_at < {cutoff}").isEmpty():
        return
    run.spark.sql(f"DELETE FROM {ident} WHERE _cdc_deleted_at < {cutoff}")


def _write_without_commit(spark: SparkSession, ident: str, source: DataFrame, columns: Sequence[str]) -> None:
    """Test hook for the crash "after data files are written, before the commit": Iceberg's
    write-audit-publish stages the MERGE's snapshot (files written, table not changed)."""
    spark.sql(f"ALTER TABLE {ident} SET TBLPROPERTIES ('write.wap.enabled'='true')")
    spark.conf.set("spark.wap.id", f"crash-{time.time_ns()}")
    try:
        merge_rows(spark, ident, source, columns)
    finally:
        spark.conf.unset("spark.wap.id")
        spark.sql(f"ALTER TABLE {ident} UNSET TBLPROPERTIES ('write.wap.enabled')")
    raise SimulatedCrash("before-commit")


def _is_commit_conflict(exc: BaseException) -> bool:
    text = str(exc)
    return "CommitFailedException" in text or ("ValidationException" in text and "onflict" in text)


def apply_with_retries(
    spark: SparkSession, settings: Settings, table: str, max_objects: int, attempts: int = 3
) -> dict[str, Any]:
    """Optimistic-commit conflicts (a concurrent writer won) re-run the whole apply, which
    re-reads the watermarks and so never applies anything twice."""
    for attempt in range(1, attempts + 1):
        try:
            result = apply_table(spark, settings, table, max_objects)
            result["attempts"] = attempt
            return result
        except Exception as exc:
            if attempt == attempts or not _is_commit_conflict(exc):
                raise
            print(f"cdclake: commit conflict on {table} (attempt {attempt}), retrying", file=sys.stderr)
            time.sleep(attempt)
    raise AssertionError("unreachable")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="spark_jobs.apply", description=(__doc__ or "").splitlines()[0])
    p.add_argument("--table", required=True, help="staging table name (lower case)")
    p.add_argument("--max-objects", type=int, default=None, help="cap on staging objects this run")
    return p.parse_args(argv)


def main(spark: SparkSession, argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    settings = load()
    result = apply_with_retries(spark, settings, args.table, args.max_objects or settings.max_objects_per_run)
    # One greppable line: Airflow's task log shows it.
    print("CDCLAKE_RESULT " + json.dumps(result, sort_keys=True), flush=True)
    return result


if __name__ == "__main__":
    # Under spark-submit the catalog conf and jars come from the command line.
    _spark = SparkSession.builder.appName("cdclake-apply").getOrCreate()
    try:
        main(_spark, sys.argv[1:])
    finally:
        _spark.stop()
