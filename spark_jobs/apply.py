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

Run by the ``cdc_apply`` DAG through spark-submit::

    spark-submit --jars ... --conf ... spark_jobs/apply.py --table orders
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import reduce
from typing import Any

from pyspark.errors import AnalysisException
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    DataType,
    LongType,
    NullType,
    StringType,
    StructField,
    StructType,
    VariantType,
)

from cdclake import names, staging, stores
from cdclake.catalog import load_table, table_watermark
from cdclake.events import CHANGES_SUFFIX, QUARANTINE_SUFFIX, TOMBSTONES_SUFFIX, UNAVAILABLE
from cdclake.locks import table_lock
from cdclake.names import Limits, fold, is_reserved, problem
from cdclake.settings import Settings, load
from cdclake.spark import table_ident
from cdclake.storeclock import StoreClock
from cdclake.tables import TableOptions, load_table_config, transform_column
from cdclake.watermark import SUMMARY_KEY, Watermark
from spark_jobs import backfill
from spark_jobs.columns import dedupe_case, extra_values, has_case_variants, not_added, plan_columns, unify_case
from spark_jobs.declared import Declared, declared, read_schema
from spark_jobs.maintain import refresh_tables
from spark_jobs.schema import (
    conform,
    hides_fields,
    missing_fields,
    read_type,
    slots,
    spellings,
    variant_json_type,
    widenings,
)
from spark_jobs.sqltext import col, quote, quote_path, sql_type, string_literal

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
PAIR = "_cdc_w_pair"  # a key change's INSERT: (key, sequence) of the old key's DELETE
PRESENT = "_cdc_w_present"  # whether the event's key had a row just before it
COPIES = "_cdc_w_copies"  # deliveries of one distinct event
CORRUPT = "_cdc_w_line"  # the staged line of an event with a value the read types do not take
SEEN = "_cdc_w_seen"  # an earlier run already logged this event (accepted or quarantined)
UNFIT = "_cdc_w_unfit"  # why an event's reserved top-level names cannot be columns
WORK_COLUMNS = (OP, OBJECT, RANK, REASON, OUTCOME, KEEP, COPIES, CORRUPT, SEEN, UNFIT, PAIR, PRESENT)

# A staged line's fields besides the after-image (cdclake.events.StagedEvent), as the job reads them.
STAGED = StructType(
    [
        StructField("source", StringType()),
        StructField("batchSequence", LongType()),
        StructField("sequence", LongType()),
        StructField("timestamp", LongType()),
        StructField("operation", StringType()),
        StructField("rowId", StringType()),
        StructField("order", ArrayType(LongType())),
    ]
)
# The same parser options for every parse of a staged line (the file read and the re-parses of a
# corrupt one). Spark's default would read the strings "NaN" and "Infinity" into a double column.
JSON_OPTIONS = {"allowNonNumericNumbers": "false"}
HISTORY_OBJECT = "_cdc_object"  # the staging object an event of __changes/__quarantine came in

CHANGES, QUARANTINE, TOMBSTONES = CHANGES_SUFFIX, QUARANTINE_SUFFIX, TOMBSTONES_SUFFIX
PROPERTY_PREFIX = "spark.sql.iceberg.snapshot-property."
CRASH_POINTS = ("before-write", "after-aux", "before-commit", "after-commit")
# Between a default backfill's table property and its column (spark_jobs.backfill): only a run
# that adds such a column passes it, so it is not among the points every run passes.
MARK_CRASH = "after-default-mark"
PARTITION_PROPERTY = "cdclake.partition-by"  # the configured transforms already in the spec

TABLE_PROPERTIES = {"format-version": "2"}
CASE_SENSITIVE = "spark.sql.caseSensitive"


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
        *([CORRUPT] if CORRUPT in raw.columns else []),
    )


@contextlib.contextmanager
def case_sensitive(spark: SparkSession) -> Iterator[None]:
    """Spark's file sources refuse a schema with two spellings of one name (``Name`` and
    ``name``, legal in different events) unless analysis is case-sensitive. Only for questions
    answered on the spot (a schema): a DataFrame is analysed again when it runs."""
    before = spark.conf.get(CASE_SENSITIVE) or "false"
    spark.conf.set(CASE_SENSITIVE, "true")
    try:
        yield
    finally:
        spark.conf.set(CASE_SENSITIVE, before)


def infer_staging(spark: SparkSession, uris: list[str]) -> StructType:
    """Pass 1 over the run's objects: Spark's JSON inference (FAILFAST: a malformed line is not
    data, it stops the job). It names the run's columns and types the ones that are new."""
    with case_sensitive(spark):
        return spark.read.option("mode", "FAILFAST").json(uris).schema


def read_json(spark: SparkSession, uris: list[str], schema: StructType, options: dict[str, str]) -> DataFrame:
    """``spark.read.schema(schema).options(options).json(uris)``, plus ``_metadata``. A schema
    spelling one name two ways is read as text through ``from_json`` (the same parser and
    options), which takes it: the file source would not."""
    if not has_case_variants(schema):
        return spark.read.schema(schema).options(**options).json(uris)
    parsed = F.from_json(F.col("value"), schema, options)
    return (
        spark.read.text(uris)
        .where(F.col("value") != "")
        .select(*[parsed.getField(f.name).alias(f.name) for f in schema.fields], F.col("_metadata"))
    )


def run_declared_types(spark: SparkSession, uris: list[str], inferred: StructType) -> Declared:
    """The run's declared column types and defaults (:mod:`spark_jobs.declared`): one more pass
    over the objects, reading only ``columnTypes`` (and ``columnDefaults`` with the ordering
    fields), when some event declares any."""
    schema = read_schema(inferred)
    return Declared() if schema is None else declared(read_json(spark, uris, schema, {}))


def after_read_type(
    spark: SparkSession,
    uris: list[str],
    inferred: StructType,
    table: StructType | None,
    declared: dict[str, DataType] | None = None,
) -> StructType | None:
    """The after-image's read type: per column of the run, the table's type where the table has
    the column (:func:`spark_jobs.schema.read_type`), else the declared one (``declared``, by
    :func:`cdclake.names.fold`), else the inferred one. None: no after-images.

    Where inference merged a struct column's objects with values of another kind into a string,
    the run's new struct fields are found from each value's own shape (one more pass, over that
    column only). Spellings of one name share a type (:func:`spark_jobs.columns.unify_case`);
    reserved top-level names (``_cdc_*``, only past the door) are read as text, to be refused."""
    if "after" not in inferred.fieldNames():
        return None
    t = inferred["after"].dataType
    columns = t.fields if isinstance(t, StructType) else []
    have = {fold(f.name): f.dataType for f in (table.fields if table is not None else [])}
    hidden = [
        i
        for i, f in enumerate(columns)
        if not is_reserved(f.name) and fold(f.name) in have and hides_fields(have[fold(f.name)], f.dataType)
    ]
    shapes: dict[int, list[DataType]] = {}
    if hidden:
        image = StructType([StructField(columns[i].name, VariantType()) for i in hidden])
        after, keys = slots(F.col("after"), image)
        got = (
            read_json(spark, uris, StructType([StructField("after", image)]), {})
            .select(*[F.collect_set(F.schema_of_variant(after.getField(k))).alias(f"c{j}") for j, k in enumerate(keys)])
            .first()
        )
        assert got is not None
        for j, i in enumerate(hidden):
            shapes[i] = [t for t in (variant_json_type(x) for x in got[f"c{j}"]) if t is not None]
    fields = []
    for i, f in enumerate(columns):
        if is_reserved(f.name):
            read: DataType | None = StringType()
        elif fold(f.name) not in have and declared and fold(f.name) in declared:
            read = declared[fold(f.name)]
        else:
            read = read_type(have.get(fold(f.name)), shapes.get(i, [f.dataType]))
        if read is not None:
            fields.append(StructField(f.name, read))
    unified = unify_case(StructType(fields))
    assert isinstance(unified, StructType)
    return unified


def read_staging(spark: SparkSession, uris: list[str], after: StructType | None = None) -> DataFrame:
    """Pass 2: staged events as rows, values parsed straight into ``after``'s types, each row
    tagged with its object name for the per-table watermarks.

    An event with a value the parser cannot convert (``"x"`` or ``2.5`` into a bigint) is a
    corrupt record: CORRUPT holds its line and its system fields come from re-parsing that line.
    Which events are corrupt depends on the columns a query reads: read the result once, with
    every column (the job caches it)."""
    fields = [*STAGED.fields, *([StructField("after", after)] if after is not None else [])]
    raw = read_json(
        spark,
        uris,
        StructType([*fields, StructField(CORRUPT, StringType())]),
        {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT, **JSON_OPTIONS},
    )
    line = F.col(CORRUPT)
    # <day>/<hour>/<file>; substring_index, not a regex: a regex per row cost ~2.5 s per 1M events.
    name = F.substring_index(F.col("_metadata.file_path"), "/", -3)
    staged = "_cdc_w_staged"
    raw = raw.select("*", F.when(line.isNotNull(), F.from_json(line, STAGED, JSON_OPTIONS)).alias(staged))
    fixed = [F.coalesce(F.col(staged).getField(f.name), F.col(f.name)).alias(f.name) for f in STAGED]
    return raw.select(*fixed, *(["after"] if after is not None else []), CORRUPT, name.alias(OBJECT))


def explain_corrupt(fitted: DataFrame, after: StructType, target: StructType) -> DataFrame:
    """``fitted`` (:func:`fit_to_table`'s rows) with its corrupt events (CORRUPT set) explained:
    REASON names each column whose value does not fit, with the value; the other columns keep
    their values. An unavailable placeholder fits any column: its value becomes NULL and its
    column goes to KEEP. A corrupt event with no such column found still gets a reason: nothing
    the parser refused is accepted. Meant for the few corrupt events on top of the cached rows.

    Every spelling of a column in ``after`` (the read type) is parsed on its own; fields are
    taken by position (:func:`spark_jobs.schema.slots`), spellings merge per table column."""
    line = F.col(CORRUPT)
    broken = line.isNotNull()
    table = {fold(f.name): f for f in target.fields}
    pairs = [(f, table[fold(f.name)]) for f in after.fields if fold(f.name) in table and not is_reserved(f.name)]
    typed = [j for j, (f, _) in enumerate(pairs) if not isinstance(f.dataType, StringType)]
    refused = "_cdc_refused"
    strict = {**JSON_OPTIONS, "mode": "PERMISSIVE", "columnNameOfCorruptRecord": refused}

    def image(fields: list[StructField], *extra: StructField) -> StructType:
        return StructType([StructField("after", StructType(fields)), *extra])

    def by_position(parsed: Column, fields: list[StructField]) -> Column:
        return parsed.cast(StructType([StructField(f"_{k}", f.dataType) for k, f in enumerate(fields)]))

    # Each parse once, of a corrupt line only: one projection per step keeps every later
    # reference a column (Spark does not inline an expensive expression used more than once).
    text, kinds = "_cdc_w_texts", "_cdc_w_kinds"
    checks = [f"_cdc_w_check{j}" for j in typed]
    as_text = [StructField(f.name, StringType()) for f, _ in pairs]
    as_variant = [StructField(pairs[j][0].name, VariantType()) for j in typed]
    parsed = fitted.select(
        "*",
        F.when(broken, by_position(F.from_json(line, image(as_text), JSON_OPTIONS).getField("after"), as_text)).alias(
            text
        ),
        F.when(
            broken, by_position(F.from_json(line, image(as_variant), JSON_OPTIONS).getField("after"), as_variant)
        ).alias(kinds),
        *[
            F.when(broken, F.from_json(line, image([pairs[j][0]], StructField(refused, StringType())), strict)).alias(c)
            for j, c in zip(typed, checks, strict=True)
        ],
    )
    failed = {j: F.col(c).getField(refused).isNotNull() for j, c in zip(typed, checks, strict=True)}
    texts = {j: F.col(text).getField(f"_{j}") for j in range(len(pairs))}
    held = {j: texts[j] == UNAVAILABLE for j in range(len(pairs))}
    shape = {j: F.schema_of_variant(F.col(kinds).getField(f"_{k}")) for k, j in enumerate(typed)}
    flags = parsed.select(
        "*",
        *[(failed[j] & ~held[j]).alias(f"_cdc_w_bad{j}") for j in typed],
        *[
            F.when(s.startswith("OBJECT"), "object")
            .when(s.startswith("ARRAY"), "array")
            .when(s == "STRING", "string")
            .when(s == "BOOLEAN", "boolean")
            .otherwise("number")
            .alias(f"_cdc_w_kind{j}")
            for j, s in shape.items()
        ],
    )
    reasons: list[Column] = []
    # Per table column: is any spelling refused or unavailable, and the values its spellings give.
    dropped: dict[str, list[Column]] = {}
    given: dict[str, list[Column]] = {}
    for j, (f, t) in enumerate(pairs):
        if j in failed:
            c = checks[typed.index(j)]
            bad, kind, shown = F.col(f"_cdc_w_bad{j}"), F.col(f"_cdc_w_kind{j}"), texts[j]
            shown = F.when(kind == "string", F.regexp_extract(F.to_json(F.array(shown)), r"^\[(.*)\]$", 1)).otherwise(
                shown
            )
            prefix, suffix = f"column {t.name}: ", f" does not fit {t.dataType.simpleString()}"
            why = F.concat(F.lit(prefix), kind, F.lit(" "), F.substring(shown, 1, 200), F.lit(suffix))
            reasons.append(F.when(bad, why))
            # Partial results kept the values of the columns that did parse; else the re-parse.
            value = conform(F.col(c).getField("after").getField(f.name), f.dataType, t.dataType)[0]
            dropped.setdefault(t.name, []).append(failed[j] | held[j])
        else:  # a string column takes any value (a non-string as its JSON text)
            value = texts[j]
            dropped.setdefault(t.name, []).append(held[j])
        given.setdefault(t.name, []).append(value)
    values = {
        name: F.when(reduce(lambda a, b: a | b, dropped[name]), F.lit(None).cast(target[name].dataType)).otherwise(
            F.coalesce(col(name), *given[name])
        )
        for name in given
    }
    kept = [F.when(held[j], F.lit(t.name)) for j, (_, t) in enumerate(pairs)]
    explained = flags.select(
        "*",
        (F.concat_ws("; ", *reasons) if reasons else F.lit("")).alias("_cdc_w_named"),
        (F.filter(F.array(*kept), lambda x: x.isNotNull()) if kept else F.array()).alias("_cdc_w_held"),
    )
    named, found = F.col("_cdc_w_named"), F.col("_cdc_w_held")
    unknown = F.concat(F.lit("event does not fit the table: "), F.substring(line, 1, 200))
    reason = F.when(named != "", named).when(F.size(found) == 0, unknown)
    out = []
    for c in fitted.columns:
        if c in values:
            out.append(F.when(broken, values[c]).otherwise(col(c)).alias(c))
        elif c == REASON:
            out.append(F.when(broken, F.coalesce(F.col(REASON), reason)).otherwise(F.col(REASON)).alias(c))
        elif c == KEEP:
            keep = F.array_distinct(F.concat(F.col(KEEP), found.cast("array<string>")))
            out.append(F.when(broken, keep).otherwise(F.col(KEEP)).alias(c))
        else:
            out.append(col(c))
    return explained.select(*out)


def drop_exact_duplicates(events: DataFrame, copies: str | None = None) -> DataFrame:
    """Same producer + same event sequence = the same event delivered twice. With ``copies``,
    that column counts the deliveries of each kept event (their sum is the events received)."""
    if copies is None:
        return events.dropDuplicates([SOURCE, SEQ])
    others = [c for c in events.columns if c not in (SOURCE, SEQ)]
    return events.groupBy(SOURCE, SEQ).agg(*[F.first(col(c)).alias(c) for c in others], F.count(F.lit(1)).alias(copies))


def flatten(events: DataFrame) -> DataFrame:
    """After-image fields become columns next to the system and working columns: one column
    per name ignoring case (the first spelling in sort order, every spelling's values). A
    reserved top-level name (``_cdc_*``, only past the door) becomes no column: UNFIT says why,
    for the events that hold a value there."""
    t = events.schema["after"].dataType
    fields = t.fields if isinstance(t, StructType) else []
    after, keys = slots(F.col("after"), t) if isinstance(t, StructType) else (F.col("after"), [])
    user, unfit = [], []
    for idx in spellings(fields).values():
        name = min(fields[i].name for i in idx)
        parts = [after.getField(keys[i]) for i in idx]
        value = parts[0] if len(parts) == 1 else F.coalesce(*parts)
        if len(idx) > 1 or has_case_variants(fields[idx[0]].dataType):
            value = conform(value, fields[idx[0]].dataType, dedupe_case(fields[idx[0]].dataType))[0]
        if is_reserved(name):
            unfit.append(F.when(value.isNotNull(), F.lit(f"column {name}: {problem(name, top=True)}")))
        else:
            user.append(value.alias(name))
    extra = [c for c in (COPIES, CORRUPT) if c in events.columns]
    why = F.concat_ws("; ", *unfit) if unfit else F.lit("")
    return events.select(KEY, *user, SEQ, TS, SOURCE, ORDER, OP, OBJECT, *extra, F.when(why != "", why).alias(UNFIT))


def mark_unavailable(rows: DataFrame) -> DataFrame:
    """Placeholder values become NULL, their column names listed in KEEP."""
    strings = [
        f.name
        for f in rows.schema.fields
        if f.name not in SYSTEM_COLUMNS + WORK_COLUMNS and f.dataType.simpleString() == "string"
    ]
    keep = F.filter(
        F.array(*[F.when(col(c) == UNAVAILABLE, F.lit(c)) for c in strings]) if strings else F.array(),
        lambda x: x.isNotNull(),
    ).cast("array<string>")
    cols = [
        F.when(col(c) == UNAVAILABLE, F.lit(None)).otherwise(col(c)).alias(c) if c in strings else col(c)
        for c in rows.columns
    ]
    return rows.select(*cols, keep.alias(KEEP))  # column order kept: it becomes the table's


HELD = f"unavailable value ({UNAVAILABLE}: the source did not capture it) with no earlier value to keep"
MAX_KEY_CHANGE_HOPS = 32
"""Key changes chained in one run (a->b->c: each hop one more pass) whose placeholders are carried;
an event further down such a chain is quarantined."""


def pair_key_changes(valid: DataFrame) -> DataFrame:
    """PAIR = (old key, sequence) of the DELETE at the same source position (producer and ordering
    value) as an INSERT with unavailable values: Debezium sends a primary-key change as a delete of
    the old key and a create of the new one at one log position, and the create's placeholders
    stand for the old key's values. REASON for an INSERT whose position holds several deletes:
    which old key it was is unknowable, and guessing would invent a value."""
    n, old, old_seq = "_cdc_w_n", "_cdc_w_old", "_cdc_w_old_seq"
    wants = (F.col(OP) == "INSERT") & (F.size(F.col(KEEP)) > 0)
    positions = valid.where(wants).select(SOURCE, ORDER).distinct()
    deletes = (
        valid.where(F.col(OP) == "DELETE")
        .join(positions, [SOURCE, ORDER], "left_semi")
        .groupBy(SOURCE, ORDER)
        .agg(F.count(F.lit(1)).alias(n), F.min(KEY).alias(old), F.min(SEQ).alias(old_seq))
    )
    found = F.coalesce(F.col(n), F.lit(0))
    pair = F.when(
        wants & (found == 1) & (F.col(old) != F.col(KEY)),
        F.struct(F.col(old).alias("key"), F.col(old_seq).alias("seq")),
    )
    why = F.when(
        wants & (found > 1),
        F.concat(
            F.lit("column "),
            F.array_join(F.col(KEEP), ", "),
            F.lit(f": {HELD}: "),
            found.cast("string"),
            F.lit(" deletes at this event's source position, so the key change's old key is ambiguous"),
        ),
    )
    return valid.join(deletes, [SOURCE, ORDER], "left").select(*valid.columns, pair.alias(PAIR), why.alias(REASON))


def state_before(rows: DataFrame, columns: Sequence[str], stored: DataFrame, values: bool) -> DataFrame:
    """The not yet quarantined ``rows``, each with the row its key had just before it: the newest
    of the key's earlier events in this run and its stored row, if older than the event (a newer
    stored row is no state this event saw). PRESENT: whether that row exists; NULL while it hangs
    on a key change's INSERT not resolved yet. Per column ``i``: ``_cdc_w_ran{i}`` (its value
    comes from an event of this run) and ``_cdc_w_was{i}`` (struct of the value: from the run, or
    with ``values`` from the stored row; else NULL, the MERGE keeping the stored value).

    Only deletes, events without unavailable values and key changes' INSERTs set a key's
    existence: an unavailable value on a missing row quarantines its event (which then changes
    nothing), on an existing row it keeps the row existing."""
    live = rows.where(F.col(REASON).isNull())
    rk = F.expr(ordering())
    w = Window.partitionBy(KEY).orderBy(ORDER, SOURCE, SEQ).rowsBetween(Window.unboundedPreceding, -1)
    held = F.size(F.col(KEEP)) > 0
    gone, waits = F.col(OP) == "DELETE", F.col(PAIR).isNotNull() & held
    sets = gone | ~held | F.col(PAIR).isNotNull()
    mark = F.struct(rk.alias("rk"), gone.alias("gone"), waits.alias("open"))
    runs = [
        F.last(F.when(~F.array_contains(F.col(KEEP), c), F.struct(rk.alias("rk"), col(c).alias("v"))), True).over(w)
        for c in columns
    ]
    keys = F.broadcast(live.select(KEY).distinct())
    kept = [F.struct(col(c).alias("v")).alias(f"_cdc_w_sv{i}") for i, c in enumerate(columns)] if values else []
    store = with_order(stored).join(keys, KEY, "left_semi").select(KEY, F.expr(ordering()).alias("_cdc_w_srk"), *kept)
    out = live.select(
        "*",
        rk.alias("_cdc_w_rk"),
        F.last(F.when(sets, mark), True).over(w).alias("_cdc_w_last"),
        *[r.alias(f"_cdc_w_run{i}") for i, r in enumerate(runs)],
    ).join(store, KEY, "left")
    srk, last = F.col("_cdc_w_srk"), F.col("_cdc_w_last")
    stored_ok = srk.isNotNull() & (srk < F.col("_cdc_w_rk"))
    from_store = stored_ok & (last.isNull() | (last.getField("rk") < srk))
    present = (
        F.when(from_store, F.lit(True))
        .when(last.isNull(), F.lit(False))
        .when(last.getField("open"), F.lit(None).cast("boolean"))
        .otherwise(~last.getField("gone"))
    )
    state = [present.alias(PRESENT)]
    for i in range(len(columns)):
        run = F.col(f"_cdc_w_run{i}")
        ran = run.isNotNull() & (~stored_ok | (run.getField("rk") > srk))
        was = F.when(ran, F.struct(run.getField("v").alias("v")))
        if values:
            was = was.when(stored_ok, F.col(f"_cdc_w_sv{i}"))
        state += [ran.alias(f"_cdc_w_ran{i}"), was.alias(f"_cdc_w_was{i}")]
    return out.select(*live.columns, *state)


def carry_key_changes(rows: DataFrame, columns: Sequence[str], stored: DataFrame) -> DataFrame:
    """A key change's INSERT takes, for each unavailable value, the old key's value just before
    its DELETE (from this run or the stored row); REASON when the old key had no row then (say
    its delete applied in an earlier run: the row is gone, and nothing is invented). A chain of
    key changes resolves one hop per pass: an INSERT waits while the old key's state hangs on one."""
    d_key, d_seq, d_present = "_cdc_w_dkey", "_cdc_w_dseq", "_cdc_w_dpresent"
    d_was = [f"_cdc_w_dwas{i}" for i in range(len(columns))]
    open_ = F.col(PAIR).isNotNull() & (F.size(F.col(KEEP)) > 0) & F.col(REASON).isNull()
    why = F.concat(
        F.lit("column "),
        F.array_join(F.col(KEEP), ", "),
        F.lit(f": {HELD}: the key change's old key "),
        F.col(PAIR).getField("key"),
        F.lit(" has no row before its delete at this event's source position (deleted earlier, or never seen)"),
    )
    for _ in range(MAX_KEY_CHANGE_HOPS):
        if rows.where(open_).isEmpty():
            break
        old = rows.where(open_).select(F.col(PAIR).getField("key").alias(KEY)).distinct()
        before = state_before(rows.join(old, KEY, "left_semi"), columns, stored, values=True)
        deletes = before.where(F.col(OP) == "DELETE").select(
            F.col(SOURCE).alias("_cdc_w_dsource"),
            F.col(KEY).alias(d_key),
            F.col(SEQ).alias(d_seq),
            F.col(PRESENT).alias(d_present),
            *[F.col(f"_cdc_w_was{i}").alias(d_was[i]) for i in range(len(columns))],
        )
        hit = rows.join(
            deletes,
            (F.col(SOURCE) == F.col("_cdc_w_dsource"))
            & (F.col(PAIR).getField("key") == F.col(d_key))
            & (F.col(PAIR).getField("seq") == F.col(d_seq)),
            "left",
        )
        there = open_ & F.col(d_present)
        carried = {
            c: F.when(there & F.array_contains(F.col(KEEP), c), F.col(d_was[i]).getField("v")).otherwise(col(c))
            for i, c in enumerate(columns)
        }
        out = [carried[c].alias(c) if c in carried else col(c) for c in rows.columns if c not in (KEEP, REASON)]
        rows = hit.select(
            *out,
            F.when(there, F.array().cast("array<string>")).otherwise(F.col(KEEP)).alias(KEEP),
            F.when(open_ & ~F.col(d_present), why).otherwise(F.col(REASON)).alias(REASON),
        ).localCheckpoint(eager=True)
    return rows


def keep_or_quarantine(rows: DataFrame, columns: Sequence[str], stored: DataFrame) -> DataFrame:
    """Every other unavailable value takes its key's value just before the event: from this run
    (filled in here), or from the stored row (left in KEEP: the MERGE keeps what is stored).
    REASON when the key had no row just before: an unavailable value never becomes a NULL."""
    state = state_before(rows, columns, stored, values=False)
    held = (F.size(F.col(KEEP)) > 0) & (F.col(OP) != "DELETE")
    present = F.col(PRESENT)
    stuck = held & (present.isNull() | F.col(PAIR).isNotNull())
    ok = held & ~stuck & present
    ran = [F.col(f"_cdc_w_ran{i}") for i in range(len(columns))]
    filled = {
        c: F.when(ok & F.array_contains(F.col(KEEP), c) & ran[i], F.col(f"_cdc_w_was{i}").getField("v")).otherwise(
            col(c)
        )
        for i, c in enumerate(columns)
    }
    from_run = F.filter(F.array(*[F.when(r, F.lit(c)) for c, r in zip(columns, ran, strict=True)]), F.isnotnull)
    names_ = F.array_join(F.col(KEEP), ", ")
    absent = F.concat(
        F.lit("column "),
        names_,
        F.lit(f": {HELD}: the key has no row before this event"),
        F.when(
            F.col(OP) == "INSERT", F.lit(" and no other key is deleted at this event's source position in this run")
        ).otherwise(F.lit("")),
    )
    too_long = F.concat(
        F.lit("column "), names_, F.lit(f": {HELD}: more than {MAX_KEY_CHANGE_HOPS} key changes chained in one run")
    )
    reason = F.when(stuck, too_long).when(held & ~present, absent)
    resolved = state.select(
        *[filled[c].alias(c) if c in filled else col(c) for c in rows.columns if c not in (KEEP, REASON)],
        F.when(ok, F.array_except(F.col(KEEP), from_run.cast("array<string>"))).otherwise(F.col(KEEP)).alias(KEEP),
        reason.alias(REASON),
    )
    return resolved.unionByName(rows.where(F.col(REASON).isNotNull()))


def resolve_unavailable(valid: DataFrame, unavailable: Sequence[str], stored: DataFrame) -> DataFrame:
    """``valid`` with REASON: placeholders (top-level columns; a nested one stays the literal
    string) resolved to the value the row had just before the event, or the event quarantined
    with the column and why. Deterministic over the same input and table, so the re-run of a
    crashed run decides the same."""
    columns = [c for c in unavailable if c in valid.columns]
    if not unavailable:
        return valid.withColumn(REASON, F.lit(None).cast("string"))
    rows = carry_key_changes(pair_key_changes(valid), columns, stored)
    return keep_or_quarantine(rows, columns, stored).drop(PAIR)


def fit_to_table(rows: DataFrame, target: StructType, limits: Limits = names.DEFAULT) -> DataFrame:
    """Rows in the table's column order and types, plus REASON (null when every value fits).

    Columns the event lacks become NULL: an after-image is the whole row. Values read as the
    table's types (see :func:`read_staging`) fit as they are; the parser's refusals are
    :func:`explain_corrupt`'s. A value in a column or field the table did not take (the rule, the
    column budget: :func:`spark_jobs.columns.plan_columns`) quarantines its event.
    """
    present = {fold(f.name): f for f in rows.schema.fields if f.name not in WORK_COLUMNS}
    cols: list[Column] = []
    reasons: list[Column] = []
    extras: list[Column] = []
    renamed: dict[str, str] = {}
    for f in target.fields:
        src = present.pop(fold(f.name), None)
        if src is None:
            cols.append(F.lit(None).cast(f.dataType).alias(f.name))
            continue
        if src.name != f.name:
            renamed[src.name] = f.name
        value, bad = conform(col(src.name), src.dataType, f.dataType)
        cols.append(value.alias(f.name))
        shown = F.substring(F.to_json(F.struct(col(src.name).alias(f.name))), 1, 200)
        why = f"column {f.name}: {src.dataType.simpleString()} value does not fit {f.dataType.simpleString()} "
        reasons.append(F.when(bad, F.concat(F.lit(why), shown)))
        for where, name, holds in extra_values(col(src.name), src.dataType, f.dataType, f.name):
            extras.append(F.when(holds, F.lit(f"column {where}: {not_added(name, False, limits)}")))
    for src in present.values():  # the table has no such column
        if not isinstance(src.dataType, NullType):
            extras.append(
                F.when(col(src.name).isNotNull(), F.lit(f"column {src.name}: {not_added(src.name, True, limits)}"))
            )
    if UNFIT in rows.columns:
        extras.append(F.col(UNFIT))
    reasons += extras
    reason = F.concat_ws("; ", *reasons) if reasons else F.lit("")
    keep = F.col(KEEP) if KEEP in rows.columns else F.array().cast("array<string>")
    if renamed:  # KEEP names columns as the table spells them, which the MERGE and the fill look up

        def spelled(x: Column) -> Column:
            (first, name), *rest = renamed.items()
            out = F.when(x == first, F.lit(name))
            for sent, spelt in rest:
                out = out.when(x == sent, F.lit(spelt))
            return out.otherwise(x)

        keep = F.transform(keep, spelled)
    extra = [c for c in (COPIES, CORRUPT) if c in rows.columns]
    return rows.select(*cols, OP, OBJECT, keep.alias(KEEP), F.when(reason != "", reason).alias(REASON), *extra)


def align_to(df: DataFrame, schema: StructType) -> DataFrame:
    """``df`` in ``schema``'s column order and types; absent columns NULL."""
    present = {fold(f.name): f for f in df.schema.fields}
    cols = []
    for f in schema.fields:
        src = present.get(fold(f.name))
        value = conform(col(src.name), src.dataType, f.dataType)[0] if src else F.lit(None).cast(f.dataType)
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
        props = {**TABLE_PROPERTIES, **(options or TableOptions()).properties}
        create_table(spark, ident, StructType(fields), props, key)
        target, adds = spark.table(ident).schema, [((c,), top[c]) for c in fills]
    have = {f.name for f in target.fields}
    adds = [((f.name,), f.dataType) for f in wanted if f.name in SYSTEM_COLUMNS and f.name not in have] + adds
    widen = widenings(src, target)
    if fills:
        backfill.mark(spark, ident, fills)
        _crash(MARK_CRASH, crash_at)
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
    Columns in ``keepable`` keep the stored value where the source row lists them in KEEP.

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

    store = stores.open_store(settings)
    ident = table_ident(settings, table)
    # pyiceberg reads the snapshot ancestry in milliseconds; the same query through Spark SQL
    # costs ~3 s of planning on a fresh JVM.
    wm_main = table_watermark(settings, table) or Watermark()
    # The store's clock, which named the objects, not this host's (see cdclake.storeclock).
    listed_at_ms = StoreClock(store).lower_ms()
    listed_keys = list(store.list(table, after=wm_main.low))
    unconsumed = [k for k in listed_keys if not wm_main.consumed(k.name)]
    # A crashed run logged its decisions in side tables the main table never caught up with: the
    # re-run first finishes exactly those objects (their events keep those decisions); objects
    # that landed since wait for the next run.
    logged = _aux_watermarks(settings, table)
    resumed = [k for k in unconsumed if any(wm.consumed(k.name) for wm in logged)]
    pending = resumed or unconsumed[:max_objects]
    result: dict[str, Any] = {"table": table, "objects": len(pending), "pending_total": len(unconsumed)}
    if not pending:
        result["committed"] = False
        _fill_defaults(spark, settings, table, result)
        return result
    if resumed:
        result["resumed"] = True
    run = Run(
        spark,
        settings,
        table,
        [k.name for k in listed_keys],
        staging.horizon(listed_at_ms - settings.landing_grace_s * 1000),
    )
    names = [k.name for k in pending]

    phase("list")
    uris = [store.uri(k) for k in pending]
    inferred = infer_staging(spark, uris)
    existing = spark.table(ident).schema if spark.catalog.tableExists(ident) else None
    declared = run_declared_types(spark, uris, inferred)
    after = after_read_type(spark, uris, inferred, existing, declared.types)
    events = normalise(read_staging(spark, uris, after))
    phase("read")  # JSON schema inference (a pass over the files)
    deduped = drop_exact_duplicates(events, copies=COPIES)
    rows = mark_unavailable(flatten(deduped))
    limits = Limits.of(settings)
    options = load_table_config(settings).for_table(table)
    target = ensure_table(spark, ident, rows, options=options, limits=limits, defaults=declared, crash_at=crash_at)
    # Cached with every column: which events the parser calls corrupt depends on the columns a
    # scan reads, so every later use must see this one parse.
    fitted = fit_to_table(rows, target, limits).cache()
    # One pass (parse, dedup, fit, cache) gives every count, per producer, and the unavailable columns.
    per_source = (
        fitted.groupBy(SOURCE)
        .agg(
            F.sum(COPIES).alias("received"),
            F.count(F.lit(1)).alias("distinct"),
            F.count(REASON).alias("quarantined"),
            F.count(CORRUPT).alias("corrupt"),
            F.min(SEQ).alias("low"),
            F.max(SEQ).alias("high"),
            F.array_distinct(F.flatten(F.collect_set(KEEP))).alias("unavailable"),
        )
        .collect()
    )
    received = sum(r["received"] or 0 for r in per_source)
    distinct = sum(r["distinct"] for r in per_source)
    n_quarantined = sum(r["quarantined"] for r in per_source)
    unavailable = sorted({c for r in per_source for c in r["unavailable"] or []})
    if any(r["corrupt"] for r in per_source):
        fitted = explain_corrupt(fitted, after or StructType([]), target)
        again = fitted.agg(
            F.count(REASON).alias("quarantined"), F.array_distinct(F.flatten(F.collect_set(KEEP))).alias("unavailable")
        ).first()
        assert again is not None
        n_quarantined, unavailable = again["quarantined"], sorted(again["unavailable"] or [])
    phase("fit")
    ranges = [(r[SOURCE], r["low"], r["high"]) for r in per_source]
    seen = logged_before(run, fitted, ranges, names if resumed else ())
    n_seen = 0
    if seen is not None:
        seen = seen.localCheckpoint(eager=True)
        n_seen = seen.count()
    if seen is not None and n_seen:
        marked = fitted.join(F.broadcast(seen), [SOURCE, SEQ], "left").select(
            *fitted.columns, F.coalesce(F.col(SEEN), F.lit(False)).alias(SEEN)
        )
        again = marked.where(F.col(SEEN)).agg(F.count(REASON).alias("quarantined")).first()
        assert again is not None
        n_quarantined -= again["quarantined"]
    else:
        marked = fitted.withColumn(SEEN, F.lit(False))
    phase("history")
    valid = marked.where(F.col(REASON).isNull() & ~F.col(SEEN)).drop(REASON, SEEN, CORRUPT)
    resolved = resolve_unavailable(valid, unavailable, spark.table(ident))
    n_unresolved = 0
    if unavailable:
        # Checkpointed: its decisions read the table, which the MERGE below changes.
        resolved = resolved.localCheckpoint(eager=True)
        n_unresolved = resolved.where(F.col(REASON).isNotNull()).count()
    n_quarantined += n_unresolved
    history = [KEY, SEQ, TS, SOURCE, OP, OBJECT, REASON]
    quarantined = (
        marked.where(F.col(REASON).isNotNull() & ~F.col(SEEN))
        .select(*history)
        .unionByName(resolved.where(F.col(REASON).isNotNull()).select(*history))
    )
    valid = resolved.where(F.col(REASON).isNull()).drop(REASON)
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
        "duplicate": received - distinct + n_seen + outcomes.get("duplicate", 0),
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
            F.col(OBJECT).alias(HISTORY_OBJECT),
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
            *[col(f.name) for f in target.fields],
            F.col(OP).alias("_cdc_operation"),
            F.col(OUTCOME).alias("_cdc_outcome"),
            committed_at.alias("_cdc_committed_at"),
            F.col(OBJECT).alias(HISTORY_OBJECT),
        ),
        wm_main,
        known=distinct - n_seen - n_quarantined - outcomes.get("duplicate", 0),
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
            _write_without_commit(spark, ident, applied.select(*map(col, columns), OP, KEEP), columns)
        merge_rows(spark, ident, applied.select(*map(col, columns), OP, KEEP), columns, unavailable)
        commit_always(spark, settings, ident, target, before)
    _crash("after-commit", crash_at)
    phase("merge")
    _fill_defaults(spark, settings, table, result)

    fitted.unpersist()
    result.update(committed=True, **counts, seconds=round(time.monotonic() - t0, 2), phases=phases)
    return result


def _fill_defaults(spark: SparkSession, settings: Settings, table: str, result: dict[str, Any]) -> None:
    """The backfills the table records (:mod:`spark_jobs.backfill`), after this run's MERGE or a
    crashed run's: also when nothing is pending, since a crash after the MERGE leaves none."""
    t = load_table(settings, table)  # pyiceberg: the properties in milliseconds, no Spark job
    if t is None or not any(k.startswith(backfill.PREFIX) for k in t.properties):
        return
    filled = backfill.fill(spark, table_ident(settings, table), t.properties, f"coalesce({ORDER}, array({SEQ}))")
    if filled:
        result["defaults_filled"] = filled


def _aux_watermarks(settings: Settings, table: str) -> list[Watermark]:
    """The watermarks the side tables' own commits carry (none for a side table never written)."""
    found = (table_watermark(settings, table + suffix) for suffix in (QUARANTINE, CHANGES, TOMBSTONES))
    return [wm for wm in found if wm is not None]


def logged_before(
    run: Run, events: DataFrame, ranges: Sequence[tuple[str, int, int]], resumed: Sequence[str]
) -> DataFrame | None:
    """(SOURCE, SEQ, SEEN) of the ``events`` that ``__changes`` or ``__quarantine`` already hold:
    an earlier run decided them (an event delivered again, e.g. re-sent under a new batch number),
    so now they count as duplicates and are neither logged nor applied again. None: no history.

    ``ranges`` (producer, lowest and highest sequence in this run) prune the history scan to the
    data files whose column metrics can hold such events; this run's events are the broadcast
    side (the history is the side that grows).
    In the re-run of a crashed run (``resumed``: its objects), what the crashed attempt logged
    from those objects is this run's own decision, not an earlier one."""
    if len(ranges) <= 32:
        window = reduce(
            lambda a, b: a | b,
            [(F.col(SOURCE) == s) & F.col(SEQ).between(lo, hi) for s, lo, hi in ranges],
            F.lit(False),
        )
    else:
        window = F.col(SEQ).between(min(r[1] for r in ranges), max(r[2] for r in ranges))
    logged = []
    for suffix in (CHANGES, QUARANTINE):
        ident = run.ident(suffix)
        if not run.spark.catalog.tableExists(ident):
            continue
        history = run.spark.table(ident)
        where = window
        if resumed:
            obj = F.col(HISTORY_OBJECT) if HISTORY_OBJECT in history.columns else F.lit(None).cast("string")
            where = where & obj.isNotNull() & ~obj.isin(list(resumed))
        logged.append(history.where(where).select(SOURCE, SEQ))
    if not logged:
        return None
    ids = F.broadcast(events.select(SOURCE, SEQ))
    return (
        reduce(lambda a, b: a.unionByName(b), logged)
        .join(ids, [SOURCE, SEQ], "left_semi")
        .distinct()
        .withColumn(SEEN, F.lit(True))
    )


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


SIDE_TABLES = (QUARANTINE, CHANGES, TOMBSTONES)
APPLY_LOCK_TTL_S = 120.0
"""A killed apply blocks its table for at most this long; a live one renews every third of it."""


def _is_commit_conflict(exc: BaseException) -> bool:
    text = str(exc)
    return "CommitFailedException" in text or ("ValidationException" in text and "onflict" in text)


def apply_with_retries(
    spark: SparkSession, settings: Settings, table: str, max_objects: int, attempts: int = 3
) -> dict[str, Any]:
    """Each attempt holds the table's lock (cdclake.locks, shared with compaction and expiry)
    from listing to the last commit, so maintenance never commits between its read and its
    commits (apache/iceberg #4996); a failure or crash releases it (at once, or after the TTL).
    The lock is first come first served and released between attempts, so a stream of applies
    does not starve maintenance. Holding it, the job first refreshes the tables it reads and
    writes (another session's compaction may have committed while it waited). Optimistic-commit
    conflicts (another writer, e.g. through the REST catalog) re-run the whole apply, which
    re-reads the watermarks and so never applies anything twice."""
    for attempt in range(1, attempts + 1):
        try:
            with table_lock(settings, table, "apply", ttl_s=APPLY_LOCK_TTL_S, say=_say):
                refresh_tables(spark, [table_ident(settings, table + s) for s in ("", *SIDE_TABLES)])
                result = apply_table(spark, settings, table, max_objects)
            result["attempts"] = attempt
            return result
        except Exception as exc:
            if attempt == attempts or not _is_commit_conflict(exc):
                raise
            print(f"cdclake: commit conflict on {table} (attempt {attempt}), retrying", file=sys.stderr)
            time.sleep(attempt)
    raise AssertionError("unreachable")


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
