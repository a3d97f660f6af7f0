"""What a run's events declare about their top-level columns (the staged events' ``columnTypes``
and ``columnDefaults``, :mod:`cdclake.contracts.coltypes`): the type a new column is created as, instead of
the type Spark's JSON inference gives its values, and the source default that rows written
before the column existed get (:mod:`spark_jobs.backfill`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, DataType, LongType, StringType, StructField, StructType

from cdclake.contracts import coltypes
from cdclake.contracts.names import fold
from spark_jobs.schema import any_of, slots

FIELD = "columnTypes"
DEFAULTS = "columnDefaults"


@dataclass(frozen=True)
class Declared:
    """A run's declarations, by :func:`cdclake.contracts.names.fold` of the column name."""

    types: dict[str, DataType] = field(default_factory=dict)
    """The type every event of the run that declares one agrees on."""
    mixed: dict[str, list[DataType]] = field(default_factory=dict)
    """The types of a column the run's events declare two or more ways (no entry in ``types``)."""
    defaults: dict[str, str] = field(default_factory=dict)
    """The default (as text) every event of the run that declares the column's type gives; a
    column declared without a default by some event, or with two, has none."""
    thresholds: dict[str, list[int]] = field(default_factory=dict)
    """Per column with a default: the lowest ordering value (``order``, else ``[sequence]``:
    what the apply stores as ``_cdc_order``) among the run's events declaring its type. Rows
    ordered below it were written without the column: they are the ones to backfill."""
    first: list[int] | None = None
    """The run's lowest ordering value (read only when some event declares a default)."""


def read_schema(inferred: StructType) -> StructType | None:
    """What the declarations pass reads of a staged line: ``columnTypes`` and, when some event
    has any, ``columnDefaults`` (every value as its JSON text: ``0``, ``true``, ``12.50``) with
    the ordering fields. None: nothing is declared."""
    names = inferred.fieldNames()
    t = inferred[FIELD].dataType if FIELD in names else None
    if not isinstance(t, StructType):
        return None
    fields = [StructField(FIELD, t)]
    d = inferred[DEFAULTS].dataType if DEFAULTS in names else None
    if isinstance(d, StructType) and d.fields:
        as_text = StructType([StructField(f.name, StringType()) for f in d.fields])
        fields += [
            StructField(DEFAULTS, as_text),
            StructField("order", ArrayType(LongType())),
            StructField("sequence", LongType()),
        ]
    return StructType(fields)


def declared(staged: DataFrame) -> Declared:
    """The run's :class:`Declared`, in one aggregation over ``staged`` (read with
    :func:`read_schema`). A column declared two ways in one run (its source type changed)
    declares no type: inference decides, as without a schema."""
    types_t = staged.schema[FIELD].dataType
    assert isinstance(types_t, StructType)
    if not types_t.fields:
        return Declared()
    col, keys = slots(F.col(FIELD), types_t)
    by_name: dict[str, list[int]] = {}
    for i, f in enumerate(types_t.fields):
        by_name.setdefault(fold(f.name), []).append(i)
    aggs = [F.collect_set(col.getField(k)).alias(f"_{i}") for i, k in enumerate(keys)]
    with_defaults = DEFAULTS in staged.columns
    if with_defaults:
        aggs += _default_aggregates(staged, col, keys, by_name)
    row = staged.select(*aggs).first()
    assert row is not None
    types: dict[str, DataType] = {}
    mixed: dict[str, list[DataType]] = {}
    for name, idx in by_name.items():
        texts = {t for i in idx for t in row[f"_{i}"] or []}
        try:  # the door canonicalised them; staging written another way is checked again
            found = [coltypes.spark_type(coltypes.canonical(t)) for t in sorted(texts)]
        except (ValueError, KeyError):
            continue
        if len(found) == 1:
            types[name] = found[0]
        elif found:
            mixed[name] = found
    if not with_defaults:
        return Declared(types, mixed=mixed)
    defaults, thresholds = {}, {}
    for j, name in enumerate(by_name):
        given = row[f"_d{j}"] or []
        if len(given) == 1 and row[f"_n{j}"] == row[f"_c{j}"]:
            defaults[name], thresholds[name] = given[0], list(row[f"_t{j}"])
    first = list(row["_first"]) if row["_first"] is not None else None
    return Declared(types, mixed, defaults, thresholds, first)


def _default_aggregates(staged: DataFrame, col: Column, keys: list[str], by_name: dict[str, list[int]]) -> list[Column]:
    """Per folded column ``j``: its distinct defaults among events declaring its type (``_d``),
    how many such events there are (``_n``) and how many give a default (``_c``), their lowest
    ordering value (``_t``); and the run's lowest (``_first``)."""
    d_t = staged.schema[DEFAULTS].dataType
    assert isinstance(d_t, StructType)
    dcol, dkeys = slots(F.col(DEFAULTS), d_t)
    spelled: dict[str, list[str]] = {}
    for f, k in zip(d_t.fields, dkeys, strict=True):
        spelled.setdefault(fold(f.name), []).append(k)
    order = F.coalesce(F.col("order"), F.array(F.col("sequence")))
    out = []
    for j, (name, idx) in enumerate(by_name.items()):
        declares = any_of([col.getField(keys[i]).isNotNull() for i in idx])
        given = spelled.get(name)
        default = F.coalesce(*[dcol.getField(k) for k in given]) if given else F.lit(None).cast("string")
        out += [
            F.collect_set(F.when(declares, default)).alias(f"_d{j}"),
            F.count(F.when(declares, F.lit(1))).alias(f"_n{j}"),
            F.count(F.when(declares, default)).alias(f"_c{j}"),
            F.min(F.when(declares, order)).alias(f"_t{j}"),
        ]
    return [*out, F.min(order).alias("_first")]
