"""Declared column types: the vocabulary an event may declare for its top-level columns.

An event's optional ``columnTypes`` maps a top-level column of its row images to one of::

    boolean  int  bigint  float  double  string  binary  date  timestamp  timestamp_ntz
    decimal(P,S)   (1 <= P <= 38, 0 <= S <= P)
    array<T>       (T any of these)

spelled as Spark SQL spells them (``timestamp`` has a time zone: Iceberg ``timestamptz``;
``timestamp_ntz`` has none). The receiver fills it from Debezium's schema
(:mod:`cdclake.debezium.connect_types`); a producer of our own batches may send it too. The apply job
gives a *new* column its declared type instead of inferring one from JSON; a column the table
already has keeps its type. The value must then be in the form Spark's JSON reader parses into
that type (decimals as JSON strings or numbers, dates ``YYYY-MM-DD``, timestamps ISO-8601,
binary as base64); a value that does not parse is quarantined with its reason, like any value
that does not fit its column.

This module is pure Python (the receiver imports it); :func:`spark_type` imports pyspark lazily.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql.types import DataType

PRIMITIVES = frozenset(
    ("boolean", "int", "bigint", "float", "double", "string", "binary", "date", "timestamp", "timestamp_ntz")
)
MAX_PRECISION = 38
MAX_NESTING = 4
_DECIMAL = re.compile(r"decimal\(\s*(\d{1,2})\s*,\s*(\d{1,2})\s*\)")


def canonical(text: str, _depth: int = 0) -> str:
    """``text`` in its one spelling (``decimal(38,10)``, ``array<int>``); ValueError naming the
    vocabulary otherwise."""
    t = text.strip().lower()
    if t in PRIMITIVES:
        return t
    m = _DECIMAL.fullmatch(t)
    if m:
        p, s = int(m[1]), int(m[2])
        if not (1 <= p <= MAX_PRECISION and 0 <= s <= p):
            raise ValueError(f"{text!r}: decimal precision must be 1..{MAX_PRECISION} and scale 0..precision")
        return f"decimal({p},{s})"
    if t.startswith("array<") and t.endswith(">") and _depth < MAX_NESTING:
        return f"array<{canonical(t[6:-1], _depth + 1)}>"
    raise ValueError(
        f"{text[:60]!r} is not a column type (boolean, int, bigint, float, double, string, binary, "
        f"date, timestamp, timestamp_ntz, decimal(P,S) with P <= {MAX_PRECISION}, array<T>)"
    )


def spark_type(text: str) -> DataType:
    """The Spark type of a canonical type string."""
    from pyspark.sql import types as T

    if text.startswith("array<"):
        return T.ArrayType(spark_type(text[6:-1]))
    m = _DECIMAL.fullmatch(text)
    if m:
        return T.DecimalType(int(m[1]), int(m[2]))
    simple: dict[str, DataType] = {
        "boolean": T.BooleanType(),
        "int": T.IntegerType(),
        "bigint": T.LongType(),
        "float": T.FloatType(),
        "double": T.DoubleType(),
        "string": T.StringType(),
        "binary": T.BinaryType(),
        "date": T.DateType(),
        "timestamp": T.TimestampType(),
        "timestamp_ntz": T.TimestampNTZType(),
    }
    return simple[text]


COMPANION_SUFFIX = "__text"
"""The suffix of a column's exact-text companion (``amount`` -> ``amount__text``)."""


def companion(column: str) -> str:
    """The companion column holding ``column``'s exact source text where its type cannot."""
    return column + COMPANION_SUFFIX


@dataclass(frozen=True)
class Companion:
    """A converter's answer for a valid value its column's type cannot hold exactly: the typed
    cell is NULL and ``text`` (the exact source text) goes to :func:`companion` of the column."""

    text: str
