"""Fitting inferred after-image types to a table's schema.

JSON inference gives each micro-batch its own types. Against the table we:
* add columns (top level, inside structs, inside arrays of structs) the table lacks;
* widen a column when Iceberg allows it (int->long, float->double, decimal precision up);
* otherwise cast value by value, and call a value *bad* when it does not survive the round trip
  (``"abc"`` into a long, ``12.5`` into a long): its event is quarantined with the reason.

Structs are rebuilt field by field BY NAME: Spark's struct-to-struct cast is positional, and
inference orders fields alphabetically while the table keeps them in the order they were added.
"""

from __future__ import annotations

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    DataType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    NullType,
    StructType,
)


def safe_widening(src: DataType, dst: DataType) -> bool:
    """Iceberg's allowed promotions of a ``dst`` column to hold ``src`` values."""
    if isinstance(dst, IntegerType) and isinstance(src, LongType):
        return True
    if isinstance(dst, FloatType) and isinstance(src, DoubleType):
        return True
    return (
        isinstance(dst, DecimalType)
        and isinstance(src, DecimalType)
        and src.scale == dst.scale
        and src.precision > dst.precision
    )


def missing_fields(src: DataType, dst: DataType, path: str) -> list[tuple[str, DataType]]:
    """(dotted path, type) of every nested field in ``src`` that ``dst`` lacks."""
    out: list[tuple[str, DataType]] = []
    if isinstance(src, StructType) and isinstance(dst, StructType):
        have = {f.name.lower(): f for f in dst.fields}
        for f in src.fields:
            sub = f"{path}.`{f.name}`" if path else f"`{f.name}`"
            if f.name.lower() not in have:
                if not isinstance(f.dataType, NullType):
                    out.append((sub, f.dataType))
            else:
                out += missing_fields(f.dataType, have[f.name.lower()].dataType, sub)
    elif isinstance(src, ArrayType) and isinstance(dst, ArrayType):
        out += missing_fields(src.elementType, dst.elementType, f"{path}.element")
    return out


def widenings(src: DataType, dst: DataType, path: str) -> list[tuple[str, DataType]]:
    """(dotted path, new type) of every column to promote so ``dst`` holds ``src``."""
    if safe_widening(src, dst):
        return [(path, src)]
    out: list[tuple[str, DataType]] = []
    if isinstance(src, StructType) and isinstance(dst, StructType):
        have = {f.name.lower(): f for f in dst.fields}
        for f in src.fields:
            if f.name.lower() in have:
                sub = f"{path}.`{f.name}`" if path else f"`{f.name}`"
                out += widenings(f.dataType, have[f.name.lower()].dataType, sub)
    return out


def conform(col: Column, src: DataType, dst: DataType) -> tuple[Column, Column]:
    """``(value as dst, bad)``: bad is true where a non-null value does not fit ``dst``."""
    if src == dst:
        return col, F.lit(False)
    if isinstance(src, NullType):
        return F.lit(None).cast(dst), F.lit(False)
    if isinstance(src, StructType) and isinstance(dst, StructType):
        have = {f.name.lower(): f for f in src.fields}
        values, bads = [], []
        for f in dst.fields:
            if f.name.lower() in have:
                v, b = conform(col.getField(have[f.name.lower()].name), have[f.name.lower()].dataType, f.dataType)
            else:
                v, b = F.lit(None).cast(f.dataType), F.lit(False)
            values.append(v.alias(f.name))
            bads.append(b)
        rebuilt = F.when(col.isNull(), F.lit(None).cast(dst)).otherwise(F.struct(*values))
        return rebuilt, F.coalesce(_any(bads), F.lit(False))
    if isinstance(src, ArrayType) and isinstance(dst, ArrayType):
        es, ed = src.elementType, dst.elementType
        value = F.transform(col, lambda x: conform(x, es, ed)[0])
        bad = F.coalesce(F.exists(col, lambda x: conform(x, es, ed)[1]), F.lit(False))
        return value, bad
    if isinstance(src, (StructType, ArrayType)) or isinstance(dst, (StructType, ArrayType)):
        return F.lit(None).cast(dst), col.isNotNull()
    cast = col.try_cast(dst)
    bad = col.isNotNull() & (cast.isNull() | (cast.cast(src) != col))
    return cast, F.coalesce(bad, F.lit(True))


def _any(bads: list[Column]) -> Column:
    out = F.lit(False)
    for b in bads:
        out = out | b
    return out
