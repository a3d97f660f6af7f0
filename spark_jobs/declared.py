"""Declared column types of a run (the staged events' ``columnTypes``, :mod:`cdclake.coltypes`):
what a new column is created as, instead of the type Spark's JSON inference gives its values."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import DataType, StructType

from cdclake import coltypes
from cdclake.names import fold
from spark_jobs.schema import slots

FIELD = "columnTypes"


def declared_types(staged: DataFrame, declared: StructType) -> dict[str, DataType]:
    """Column (by :func:`cdclake.names.fold`) -> the type every event of the run that declares
    one agrees on. ``staged`` has the column ``columnTypes`` of struct type ``declared`` (its
    fields are the declared names, their values strings). A column declared two ways in one
    run (its source type changed) declares nothing: inference decides, as without a schema."""
    if not declared.fields:
        return {}
    col, keys = slots(F.col(FIELD), declared)
    row = staged.select(*[F.collect_set(col.getField(k)).alias(f"_{i}") for i, k in enumerate(keys)]).first()
    assert row is not None
    seen: dict[str, set[str]] = {}
    for i, f in enumerate(declared.fields):
        seen.setdefault(fold(f.name), set()).update(row[f"_{i}"] or [])
    out: dict[str, DataType] = {}
    for name, texts in seen.items():
        if len(texts) == 1:
            try:  # the door canonicalised them; staging written another way is checked again
                out[name] = coltypes.spark_type(coltypes.canonical(next(iter(texts))))
            except (ValueError, KeyError):
                continue
    return out
