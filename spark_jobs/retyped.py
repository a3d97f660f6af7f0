"""Columns whose source type changed to one the table's type is no widening of (``ALTER COLUMN a
TYPE text`` on an ``int`` column; docs/debezium.md, "Source DDL"). The column keeps its type; the run reads
its values as text (:func:`spark_jobs.read.declared_read_type`) and each lands exactly:

* a text that is exactly a value of the column's type lands typed, its companion NULL. Exactly:
  the text converts (``try_cast``; base64 for ``binary``, as Spark's JSON reader takes binary)
  and the converted value, cast back to text (``base64`` again), is the same text, character for
  character. So ``7`` is an int; ``007``, ``+7``, `` 7``, ``7.0`` and ``abc`` are not (the typed
  cell could not give their text back);
* any other text lands as NULL in the typed column, the text itself in the column's
  :func:`~cdclake.contracts.coltypes.companion` (``<column>__text``), added to the table by
  the first run with a value for it (:func:`needed`), as for a Debezium value the column's type
  cannot hold (:mod:`cdclake.debezium.source_types`). Never quarantined: the value is valid in
  the source. Where the table cannot take the companion (``CDCLAKE_MAX_COLUMNS``, the name
  rule), the event is quarantined with the reason, as for any column the table did not take.

A column is read as text only when its table type is a scalar one other than ``string``: a
string column takes any value as it is, and a struct, array or map column keeps its type.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, BinaryType, DataType, MapType, NullType, StringType, StructType

from cdclake.contracts.coltypes import companion
from cdclake.contracts.names import fold
from spark_jobs.sqltext import col
from spark_jobs.system import SYSTEM_COLUMNS, WORK_COLUMNS


def scalar_typed(table: DataType) -> bool:
    """Whether a table column of this type is read as text when the source retypes it."""
    return not isinstance(table, (StringType, StructType, ArrayType, MapType, NullType))


def read_as_text(src: DataType, table: DataType) -> bool:
    """Whether a run's column of read type ``src`` into a table column of type ``table`` is a
    retyped column read as text (no other read gives a string for a scalar-typed column)."""
    return isinstance(src, StringType) and scalar_typed(table)


def exact(text: Column, table: DataType) -> tuple[Column, Column]:
    """``(typed, rest)`` of a column read as text: the value of type ``table`` the text is
    exactly (else NULL), and the text where it is no such value (else NULL)."""
    if isinstance(table, BinaryType):
        typed = F.try_to_binary(text, F.lit("base64"))
        back = F.base64(typed)
    else:
        typed = text.try_cast(table)
        back = typed.cast(StringType())
    fits = F.coalesce(back == text, F.lit(False))
    return F.when(fits, typed).otherwise(F.lit(None).cast(table)), F.when(~fits, text)


def retyped(rows: DataFrame, table: StructType | None) -> dict[str, tuple[str, DataType]]:
    """The run's columns read as text: rows' column name -> (the table's spelling, its type)."""
    have = {fold(f.name): f for f in (table.fields if table is not None else [])}
    out = {}
    for f in rows.schema.fields:
        t = have.get(fold(f.name))
        if f.name not in SYSTEM_COLUMNS + WORK_COLUMNS and t is not None and read_as_text(f.dataType, t.dataType):
            out[f.name] = (t.name, t.dataType)
    return out


def needed(rows: DataFrame, table: StructType | None) -> DataFrame:
    """``rows`` with a NULL string column for each companion a retyped column needs and neither
    the table nor the rows have yet, so the table gets it (:func:`spark_jobs.table.ensure_table`).
    Needed: some value of the run is not exactly one of the column's type (one aggregate over
    the run, only in a run with such columns)."""
    present = {fold(f.name) for f in [*(table.fields if table is not None else []), *rows.schema.fields]}
    todo = {c: (name, t) for c, (name, t) in retyped(rows, table).items() if fold(companion(name)) not in present}
    if not todo:
        return rows
    flags = [F.max(exact(col(c), t)[1].isNotNull()).alias(f"_{i}") for i, (c, (_, t)) in enumerate(todo.items())]
    got = rows.select(*flags).first()
    assert got is not None
    new = [companion(name) for i, (name, _) in enumerate(todo.values()) if got[f"_{i}"]]
    return rows.select("*", *[F.lit(None).cast(StringType()).alias(c) for c in new]) if new else rows
