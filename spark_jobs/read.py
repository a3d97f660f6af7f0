"""Reading a run's staged objects: infer the run's JSON types, settle each after-image column's
read type (the table's, else the declared one, else the inferred one), parse every line straight
into those types, then one typed row per event, one per distinct event, one column per name."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, DataType, LongType, StringType, StructField, StructType, VariantType

from cdclake.contracts import jsontypes
from cdclake.contracts.names import fold, is_reserved, problem
from spark_jobs.columns import dedupe_case, has_case_variants, unify_case
from spark_jobs.declared import Declared, declared, read_schema
from spark_jobs.retyped import scalar_typed
from spark_jobs.schema import (
    conform,
    hides_fields,
    read_type,
    safe_widening,
    slots,
    spellings,
    variant_json_type,
)
from spark_jobs.system import (
    CARRIED,
    CORRUPT,
    IMAGE_BEFORE,
    KEY,
    METADATA,
    OBJECT,
    OP,
    ORDER,
    SEQ,
    SOURCE,
    TRANSACTION,
    TS,
    UNFIT,
)

# A staged line's fields besides the after-image (cdclake.contracts.events.StagedEvent), as the job reads them.
STAGED = StructType(
    [
        StructField("source", StringType()),
        StructField("batchSequence", LongType()),
        StructField("sequence", LongType()),
        StructField("timestamp", LongType()),
        StructField("operation", StringType()),
        StructField("rowId", StringType()),
        StructField("order", ArrayType(LongType())),
        # Objects read into a string column come as their JSON text (Spark's JSON reader).
        StructField("before", StringType()),
        StructField("metadata", StringType()),
        # Its id goes to the change history (_cdc_transaction); the apply decides each event as
        # before, whatever transaction it is in.
        StructField(
            "transaction",
            StructType(
                [
                    StructField("id", StringType()),
                    StructField("totalOrder", LongType()),
                    StructField("tableOrder", LongType()),
                ]
            ),
        ),
    ]
)
# The same parser options for every parse of a staged line (the file read and the re-parses of a
# corrupt one). A double's NaN and infinities have no JSON number: Debezium sends them as the
# strings "NaN", "Infinity", "-Infinity", which this reads into a float or double column (Spark's
# default; it also takes "+Infinity", "+INF" and "-INF"). Any other string there is refused.
JSON_OPTIONS = {"allowNonNumericNumbers": "true"}
CASE_SENSITIVE = "spark.sql.caseSensitive"


def read_events(
    spark: SparkSession, uris: list[str], table: StructType | None, recorded: list[Any] | None = None
) -> tuple[DataFrame, StructType | None, Declared]:
    """The run's events (:func:`normalise`d), the after-image's read type and the declared types
    and defaults: the passes over the objects the job makes before it touches the table.
    ``recorded``: each object's JSON types as its receipt recorded them, which spare the
    inference pass (:func:`recorded_schema`)."""
    inferred = infer_staging(spark, uris) if recorded is None else recorded_schema(recorded)
    found = run_declared_types(spark, uris, inferred)
    after = after_read_type(spark, uris, inferred, table, retyped_declarations(table, found))
    return normalise(read_staging(spark, uris, after)), after, found


def normalise(raw: DataFrame) -> DataFrame:
    """Staged events (see cdclake.contracts.events.StagedEvent) -> one typed row per event."""
    after_type = raw.schema["after"].dataType if "after" in raw.columns else None
    after = F.col("after") if isinstance(after_type, StructType) else F.lit(None).cast("struct<>")
    seq = F.col("sequence").cast("long")
    given = F.col("order").cast("array<bigint>") if "order" in raw.columns else F.lit(None).cast("array<bigint>")

    def text(name: str) -> Column:
        return F.col(name).cast("string") if name in raw.columns else F.lit(None).cast("string")

    return raw.select(
        F.col("rowId").cast("string").alias(KEY),
        seq.alias(SEQ),
        F.timestamp_millis(F.col("timestamp").cast("long")).alias(TS),
        F.col("source").cast("string").alias(SOURCE),
        F.coalesce(given, F.array(seq)).alias(ORDER),
        F.col("operation").cast("string").alias(OP),
        (F.col(OBJECT) if OBJECT in raw.columns else F.lit(None).cast("string")).alias(OBJECT),
        after.alias("after"),
        text("before").alias(IMAGE_BEFORE),
        text("metadata").alias(METADATA),
        (F.col("transaction.id") if "transaction" in raw.columns else F.lit(None)).cast("string").alias(TRANSACTION),
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


def recorded_schema(recorded: list[Any]) -> StructType:
    """What :func:`infer_staging` would find in the objects, from the types recorded at landing
    (:mod:`cdclake.contracts.jsontypes`), for the fields the job types by inference."""
    merged = functools.reduce(jsontypes.merge, (jsontypes.from_record(r) for r in recorded), ("st", ()))
    final = jsontypes.canonical(merged)
    return StructType() if final is None else StructType.fromJson(jsontypes.spark_json(final))


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
    """The after-image's read type: per column of the run, the declared one where the run's
    events declare it (``declared``, by :func:`cdclake.contracts.names.fold`;
    :func:`declared_read_type`), else the table's where the table has the column
    (:func:`spark_jobs.schema.read_type`), else the inferred one. None: no after-images.

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
        elif declared and fold(f.name) in declared:
            read = declared_read_type(have.get(fold(f.name)), declared[fold(f.name)])
        else:
            read = read_type(have.get(fold(f.name)), shapes.get(i, [f.dataType]))
        if read is not None:
            fields.append(StructField(f.name, read))
    unified = unify_case(StructType(fields))
    assert isinstance(unified, StructType)
    return unified


def declared_read_type(table: DataType | None, declared: DataType) -> DataType:
    """The read type of a column the run's events declare: the declared type for a new column;
    for one the table has, the declared type where it is the table's or an Iceberg widening of
    it (the source widened). Never the inferred type: JSON inference types every integer
    ``bigint`` and every fraction ``double``, which would widen a declared ``int`` (``float``)
    column at the next run whose values are read by inference (issue 29, item 4).

    Any other declared type (the source retyped the column: ``int`` -> ``text``): text, where
    the table's type is a scalar other than string (:mod:`spark_jobs.retyped`: each value lands
    typed where it is exactly one of the table's type, else in the column's companion); else
    the table's."""
    if table is None or declared == table or safe_widening(declared, table):
        return declared
    return StringType() if scalar_typed(table) else table


def retyped_declarations(table: StructType | None, found: Declared) -> dict[str, DataType]:
    """The run's declared types (:attr:`Declared.types`), plus ``string`` for a column the table
    has that the run declares two ways, one of them neither the table's type nor a widening of
    it (the source retyped the column within the run: its values are read as text)."""
    have = {fold(f.name): f.dataType for f in (table.fields if table is not None else [])}
    out = dict(found.types)
    for name, types in found.mixed.items():
        t = have.get(name)
        if t is not None and any(d != t and not safe_widening(d, t) for d in types):
            out[name] = StringType()
    return out


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
    # <day>/<hour>/<file>; substring_index, not a regex: a regex per row was a visible share of a bulk read.
    name = F.substring_index(F.col("_metadata.file_path"), "/", -3)
    staged = "_cdc_w_staged"
    raw = raw.select("*", F.when(line.isNotNull(), F.from_json(line, STAGED, JSON_OPTIONS)).alias(staged))
    fixed = [F.coalesce(F.col(staged).getField(f.name), F.col(f.name)).alias(f.name) for f in STAGED]
    return raw.select(*fixed, *(["after"] if after is not None else []), CORRUPT, name.alias(OBJECT))


def drop_exact_duplicates(events: DataFrame, copies: str | None = None) -> DataFrame:
    """Same producer + same event sequence = the same event delivered twice: the delivery in the
    first staging object (by name: the order they landed in) is kept. With ``copies``, that
    column counts the deliveries of each kept event (their sum is the events received)."""
    # A window, not groupBy(...).agg(first(...)): first() of a string keeps Spark on a sort-based
    # aggregate, sorting every row once before the shuffle and again after; a window sorts once.
    w = Window.partitionBy(SOURCE, SEQ).orderBy(F.col(OBJECT).asc_nulls_last())
    n = "_cdc_w_delivery"
    every = w.rowsBetween(Window.unboundedPreceding, Window.unboundedFollowing)
    counted = [F.count(F.lit(1)).over(every).alias(copies)] if copies else []
    first = events.select("*", F.row_number().over(w).alias(n), *counted)
    return first.where(F.col(n) == 1).drop(n)


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
    extra = [c for c in CARRIED if c in events.columns]
    why = F.concat_ws("; ", *unfit) if unfit else F.lit("")
    return events.select(KEY, *user, SEQ, TS, SOURCE, ORDER, OP, OBJECT, *extra, F.when(why != "", why).alias(UNFIT))
