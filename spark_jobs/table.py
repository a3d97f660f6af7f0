"""The Iceberg table itself: created from the first after-images, columns added and widened as
the door rule and the column budget allow, partitioning and merge mode as configured."""

from __future__ import annotations

import json

from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructField, StructType

from cdclake.config.tables import TableOptions, transform_column
from cdclake.contracts.names import Limits, fold
from cdclake.lake.publish import DELETE_AFTER_COMMIT
from spark_jobs import backfill
from spark_jobs.columns import plan_columns
from spark_jobs.declared import Declared
from spark_jobs.schema import conform, missing_fields, widenings
from spark_jobs.sqltext import col, quote_path, sql_type, string_literal
from spark_jobs.system import KEY, MARK_CRASH, SYSTEM_COLUMNS, WORK_COLUMNS, crash

PARTITION_PROPERTY = "cdclake.partition-by"  # the configured transforms already in the spec
FORMAT_VERSION = "format-version"
# Every table the apply writes stages its writes (spark_jobs.stage): write-audit-publish on.
WAP = {"write.wap.enabled": "true"}
# Each commit writes a metadata file holding every snapshot; Iceberg keeps the files its log names
# (write.metadata.previous-versions-max) and, with this, deletes the older ones at commit (the
# publish too: cdclake.lake.publish.dropped; a table made before this gets it at its next staged
# write, spark_jobs.stage). Without it they stay until the orphan clean-up, 72 h on
# (docs/benchmarks.md, "Snapshots").
CLEANUP = {DELETE_AFTER_COMMIT: "true"}
# Every apply adds a manifest (a MERGE also a delete manifest) to each table it writes, and every
# scan of the table plans over all of them: the classification, the history lookup and the MERGE
# of a table applied pass after pass slowed with each commit until Iceberg merged them, at its
# default of 100 (docs/benchmarks.md, "Manifests of a busy table"). Merged every 10, a pass stays
# about as fast as just after a merge; each merge rewrites the merged manifest with the new ones
# (it lists the table's files, which compaction keeps few).
MIN_COUNT_TO_MERGE = "commit.manifest.min-count-to-merge"
MERGE_MANIFESTS = {MIN_COUNT_TO_MERGE: "10"}
UNLESS_SET = {**CLEANUP, **MERGE_MANIFESTS}
"""Given to every table the apply writes unless it has them: at creation, and to a table an older
cdclake made at its next staged write (:mod:`spark_jobs.stage`); a value set on purpose is kept."""
TABLE_PROPERTIES = {FORMAT_VERSION: "2", **WAP, **UNLESS_SET}  # side tables: append-only, nothing for v3 to improve
# A new CDC table is v3 unless its options say 2: its merge-on-read deletes become deletion
# vectors, faster to apply and to read (tests/bench/deletes.py, docs/benchmarks.md, "Deletion vectors"). An
# existing table keeps its version unless its options ask for a higher one.
CDC_TABLE_PROPERTIES = {FORMAT_VERSION: "3", **WAP, **UNLESS_SET}


def ensure_table(
    spark: SparkSession,
    ident: str,
    rows: DataFrame,
    key: bool = True,
    options: TableOptions | None = None,
    limits: Limits | None = None,
    defaults: Declared | None = None,
    crash_at: str | None = None,
) -> StructType:
    """Create the table from the first after-images, add what it lacks, widen what may widen,
    and bring partitioning and merge mode in line with the table's configured options.

    With ``limits`` (the CDC table, not its side tables) user columns are added only as the door
    rule and ``CDCLAKE_MAX_COLUMNS`` allow (:func:`spark_jobs.columns.plan_columns`); whatever is
    not added makes :func:`fit_to_table` quarantine the events that hold a value there. Tables
    are created from a schema through the catalog API; ALTER statements name columns only
    through spark_jobs.sqltext, which quotes them.

    A top-level column with a declared default (``defaults``) that rows may predate is added
    after its backfill is recorded (:mod:`spark_jobs.backfill`), also in a table created now."""
    wanted = [f for f in rows.schema.fields if f.name not in WORK_COLUMNS]
    src = StructType([f for f in wanted if f.name not in SYSTEM_COLUMNS])
    exists = spark.catalog.tableExists(ident)
    target = spark.table(ident).schema if exists else StructType([])
    users = StructType([f for f in target.fields if f.name not in SYSTEM_COLUMNS])
    adds = plan_columns(missing_fields(src, users), users, limits)
    fills = backfill.planned(defaults, adds, created=not exists) if defaults else {}
    if not exists:
        top = {path[0]: t for path, t in adds if len(path) == 1}
        fields = [
            StructField(f.name, top.get(f.name, f.dataType), not (key and f.name == KEY))
            for f in wanted
            if f.name in SYSTEM_COLUMNS or (f.name in top and f.name not in fills)
        ]
        base = TABLE_PROPERTIES if options is None else CDC_TABLE_PROPERTIES
        props = {**base, **(options or TableOptions()).properties}
        create_table(spark, ident, StructType(fields), props, key)
        target, adds = spark.table(ident).schema, [((c,), top[c]) for c in fills]
    have = {f.name for f in target.fields}
    adds = [((f.name,), f.dataType) for f in wanted if f.name in SYSTEM_COLUMNS and f.name not in have] + adds
    widen = widenings(src, target)
    if fills:
        backfill.mark(spark, ident, fills)
        crash(MARK_CRASH, crash_at)
    for path, t in adds:
        spark.sql(f"ALTER TABLE {ident} ADD COLUMN {quote_path(path)} {sql_type(t)}")
    for path, t in widen:
        spark.sql(f"ALTER TABLE {ident} ALTER COLUMN {quote_path(path)} TYPE {sql_type(t)}")
    schema = spark.table(ident).schema if adds or widen else target
    if options is not None:
        apply_options(spark, ident, schema, options)
    return schema


def create_table(spark: SparkSession, ident: str, schema: StructType, props: dict[str, str], key: bool) -> None:
    """An Iceberg table of ``schema`` at its catalog's default location. Through the catalog
    API, not CREATE TABLE text nor a CTAS: names never become SQL, and a CTAS
    (DataFrameWriterV2.create) makes every column nullable, while identifier fields need the key
    required."""
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {ident.rsplit('.', 1)[0]}")
    try:
        spark.catalog.createTable(ident, source="iceberg", schema=schema)
    except AnalysisException as exc:
        if "TABLE_OR_VIEW_ALREADY_EXISTS" not in str(exc):
            raise  # else another writer created it first: go on with the table as it is
    pairs = ", ".join(f"{string_literal(k)}={string_literal(v)}" for k, v in props.items())
    spark.sql(f"ALTER TABLE {ident} SET TBLPROPERTIES ({pairs})")
    if key:
        spark.sql(f"ALTER TABLE {ident} SET IDENTIFIER FIELDS {KEY}")


def apply_options(spark: SparkSession, ident: str, schema: StructType, options: TableOptions) -> None:
    """Merge mode as configured; the format version raised to a configured higher one (never
    lowered); configured partition fields added once their column exists (partition evolution:
    existing files keep their old spec). Fields are never dropped here."""
    props = {r["key"]: r["value"] for r in spark.sql(f"SHOW TBLPROPERTIES {ident}").collect()}
    changed = {k: v for k, v in options.properties.items() if props.get(k) != v}
    if int(changed.get(FORMAT_VERSION, "0")) <= int(props.get(FORMAT_VERSION, "2")):
        changed.pop(FORMAT_VERSION, None)  # an upgrade only: Iceberg never downgrades a table
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


def align_to(df: DataFrame, schema: StructType) -> DataFrame:
    """``df`` in ``schema``'s column order and types; absent columns NULL."""
    present = {fold(f.name): f for f in df.schema.fields}
    cols = []
    for f in schema.fields:
        src = present.get(fold(f.name))
        value = conform(col(src.name), src.dataType, f.dataType)[0] if src else F.lit(None).cast(f.dataType)
        cols.append(value.alias(f.name))
    return df.select(*cols)
