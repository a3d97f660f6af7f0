"""Apply one table's pending staging objects to its Iceberg table, exactly once.

read staging -> normalise -> drop exact duplicates -> newest event per key -> MERGE INTO, with the
consumed-staging watermark in the snapshot summary of the same commit. Re-running on the same
staging data finds nothing pending and commits nothing.

Run by the ``cdc_apply`` DAG through spark-submit::

    spark-submit --jars ... --conf ... spark_jobs/apply.py --table orders
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import StructField, StructType

from cdclake import staging
from cdclake.settings import Settings, load
from cdclake.spark import table_ident
from cdclake.watermark import SUMMARY_KEY, Watermark

KEY = "_cdc_row_id"  # "_row_id" is reserved by Iceberg (v3 row lineage)
SEQ = "_cdc_seq"
TS = "_cdc_ts"
SOURCE = "_cdc_source"
OP = "_cdc_op"  # only in the MERGE source, not stored: deleted rows are gone from the table
SYSTEM_COLUMNS = (KEY, SEQ, TS, SOURCE)
PROPERTY_PREFIX = "spark.sql.iceberg.snapshot-property."

TABLE_PROPERTIES = {
    "format-version": "2",
    # Copy-on-write keeps reads free of delete files; micro-batches touch few files.
    "write.merge.mode": "copy-on-write",
    "write.update.mode": "copy-on-write",
    "write.delete.mode": "copy-on-write",
}


# ---------------------------------------------------------------- pure transforms


def normalise(raw: DataFrame) -> DataFrame:
    """Staged events (see cdclake.events.StagedEvent) -> one typed row per event."""
    after_type = raw.schema["after"].dataType if "after" in raw.columns else None
    after = F.col("after") if isinstance(after_type, StructType) else F.lit(None).cast("struct<>")
    return raw.select(
        F.col("rowId").cast("string").alias(KEY),
        F.col("sequence").cast("long").alias(SEQ),
        F.timestamp_millis(F.col("timestamp").cast("long")).alias(TS),
        F.col("source").cast("string").alias(SOURCE),
        F.col("operation").cast("string").alias(OP),
        after.alias("after"),
    )


def drop_exact_duplicates(events: DataFrame) -> DataFrame:
    """Same producer + same event sequence = the same event delivered twice."""
    return events.dropDuplicates([SOURCE, SEQ])


def latest_per_key(events: DataFrame) -> DataFrame:
    """The event with the highest ordering value per key; ties broken by source id."""
    w = Window.partitionBy(KEY).orderBy(F.col(SEQ).desc(), F.col(SOURCE).desc())
    return events.withColumn("_rank", F.row_number().over(w)).where("_rank = 1").drop("_rank")


def after_fields(events: DataFrame) -> list[StructField]:
    t = events.schema["after"].dataType
    return list(t.fields) if isinstance(t, StructType) else []


def to_rows(latest: DataFrame) -> DataFrame:
    """Flatten after-images into table columns next to the system columns."""
    fields = [f.name for f in after_fields(latest) if f.name not in (*SYSTEM_COLUMNS, OP)]
    return latest.select(KEY, *[F.col("after").getField(n).alias(n) for n in fields], SEQ, TS, SOURCE, OP)


def align(rows: DataFrame, target: StructType) -> DataFrame:
    """Cast to the table's schema; columns the batch lacks become NULL (after-images are rows)."""
    present = set(rows.columns)
    cols = [(F.col(f.name) if f.name in present else F.lit(None)).cast(f.dataType).alias(f.name) for f in target.fields]
    return rows.select(*cols, OP)


# ---------------------------------------------------------------- table I/O


def _ddl_type(f: StructField) -> str:
    return f.dataType.simpleString()


def ensure_table(spark: SparkSession, ident: str, rows: DataFrame) -> StructType:
    """Create the table from the first after-images, or add the columns it lacks."""
    wanted = [f for f in rows.schema.fields if f.name != OP]
    if not spark.catalog.tableExists(ident):
        ns = ident.rsplit(".", 1)[0]
        spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {ns}")
        cols = ", ".join(f"`{f.name}` {_ddl_type(f)}{' NOT NULL' if f.name == KEY else ''}" for f in wanted)
        props = ", ".join(f"'{k}'='{v}'" for k, v in TABLE_PROPERTIES.items())
        spark.sql(f"CREATE TABLE IF NOT EXISTS {ident} ({cols}) USING iceberg TBLPROPERTIES ({props})")
        spark.sql(f"ALTER TABLE {ident} SET IDENTIFIER FIELDS {KEY}")
    existing = {f.name.lower() for f in spark.table(ident).schema.fields}
    new = [f for f in wanted if f.name.lower() not in existing and f.name not in SYSTEM_COLUMNS]
    if new:
        spark.sql(f"ALTER TABLE {ident} ADD COLUMNS ({', '.join(f'`{f.name}` {_ddl_type(f)}' for f in new)})")
    return spark.table(ident).schema


def read_watermark(spark: SparkSession, ident: str) -> Watermark:
    """Newest watermark in the current snapshot's ancestry (maintenance snapshots carry none)."""
    if not spark.catalog.tableExists(ident):
        return Watermark()
    rows = spark.sql(
        f"""SELECT s.summary['{SUMMARY_KEY}'] AS wm
            FROM {ident}.history h JOIN {ident}.snapshots s ON h.snapshot_id = s.snapshot_id
            WHERE h.is_current_ancestor AND s.summary['{SUMMARY_KEY}'] IS NOT NULL
            ORDER BY h.made_current_at DESC LIMIT 1"""
    ).collect()
    return Watermark.decode(rows[0]["wm"]) if rows else Watermark()


def current_snapshot_id(spark: SparkSession, ident: str) -> int | None:
    rows = spark.sql(
        f"SELECT snapshot_id FROM {ident}.history WHERE is_current_ancestor ORDER BY made_current_at DESC LIMIT 1"
    ).collect()
    return rows[0][0] if rows else None


def merge(spark: SparkSession, ident: str, source: DataFrame, columns: Sequence[str]) -> None:
    source.createOrReplaceTempView("cdclake_apply_source")
    q = [f"`{c}`" for c in columns]
    set_list = ", ".join(f"t.{c} = s.{c}" for c in q if c != f"`{KEY}`")
    spark.sql(
        f"""MERGE INTO {ident} t USING cdclake_apply_source s ON t.{KEY} = s.{KEY}
            WHEN MATCHED AND s.{SEQ} > t.{SEQ} AND s.{OP} = 'DELETE' THEN DELETE
            WHEN MATCHED AND s.{SEQ} > t.{SEQ} THEN UPDATE SET {set_list}
            WHEN NOT MATCHED AND s.{OP} <> 'DELETE' THEN INSERT ({", ".join(q)})
              VALUES ({", ".join("s." + c for c in q)})"""
    )


def _with_snapshot_properties(spark: SparkSession, props: dict[str, str]) -> None:
    for k, v in props.items():
        spark.conf.set(PROPERTY_PREFIX + k, v)


def _clear_snapshot_properties(spark: SparkSession, props: dict[str, str]) -> None:
    for k in props:
        spark.conf.unset(PROPERTY_PREFIX + k)


# ---------------------------------------------------------------- the job


def apply_table(spark: SparkSession, settings: Settings, table: str, max_objects: int) -> dict[str, Any]:
    t0 = time.monotonic()
    ident = table_ident(settings, table)
    store = staging.LocalStaging(settings.staging_dir)
    wm = read_watermark(spark, ident)
    listed_at_ms = int(time.time() * 1000)
    listed = [k for k in store.list(table, after=wm.low)]
    pending = [k for k in listed if not wm.consumed(k.name)][:max_objects]
    result: dict[str, Any] = {
        "table": table,
        "objects": len(pending),
        "pending_total": sum(1 for k in listed if not wm.consumed(k.name)),
    }
    if not pending:
        result["committed"] = False
        return result

    raw = spark.read.option("mode", "FAILFAST").json([store.uri(k) for k in pending])
    events = normalise(raw).cache()
    deduped = drop_exact_duplicates(events)
    latest = latest_per_key(deduped)
    rows = to_rows(latest)
    target = ensure_table(spark, ident, rows)
    source = align(rows, target)

    received, unique, keys = events.count(), deduped.count(), latest.count()
    horizon = staging.horizon(listed_at_ms - settings.landing_grace_s * 1000)
    new_wm = wm.advance((k.name for k in pending), (k.name for k in listed), horizon)
    props = {
        SUMMARY_KEY: new_wm.encode(),
        "cdclake.objects": str(len(pending)),
        "cdclake.events-received": str(received),
        "cdclake.events-duplicate": str(received - unique),
        "cdclake.events-superseded": str(unique - keys),
    }
    before = current_snapshot_id(spark, ident)
    _with_snapshot_properties(spark, props)
    try:
        merge(spark, ident, source, [f.name for f in target.fields])
        if current_snapshot_id(spark, ident) == before:
            # A MERGE that changes no row commits nothing; the watermark must still advance,
            # so commit it with an empty append.
            spark.createDataFrame([], target).writeTo(ident).append()
    finally:
        _clear_snapshot_properties(spark, props)
    events.unpersist()
    result.update(
        committed=True,
        received=received,
        duplicate=received - unique,
        superseded=unique - keys,
        keys=keys,
        seconds=round(time.monotonic() - t0, 2),
    )
    return result


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="spark_jobs.apply", description=__doc__.splitlines()[0])
    p.add_argument("--table", required=True, help="staging table name (lower case)")
    p.add_argument("--max-objects", type=int, default=None, help="cap on staging objects this run")
    return p.parse_args(argv)


def main(spark: SparkSession, argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    settings = load()
    result = apply_table(spark, settings, args.table, args.max_objects or settings.max_objects_per_run)
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
