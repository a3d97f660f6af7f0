"""The only way spark_jobs puts a name or a type into SQL text or a column reference.

Column and field names are producer data (cdclake.contracts.names lets spaces, quotes, ``:``, ``<>`` and
SQL fragments through, as JSON does): in SQL each is one backtick-quoted identifier with its
backticks doubled, which Spark's parser reads back as exactly that name whatever it holds.
Types are rendered with every struct field name quoted so (``DataType.simpleString`` leaves
them bare: a field named ``x:string>) ... --`` would end the type and start a clause).
Values never go into SQL text: they are DataFrame columns or :func:`F.lit`.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, DataType, MapType, StructType

from cdclake.contracts.names import quote

__all__ = ["col", "quote", "quote_path", "sql_type", "string_literal"]


def quote_path(parts: Sequence[str]) -> str:
    """A nested column path (``ALTER TABLE ... ADD COLUMN``): each part quoted, dot-joined."""
    return ".".join(quote(p) for p in parts)


def sql_type(t: DataType) -> str:
    """``t`` as SQL type text, every struct field name quoted."""
    if isinstance(t, StructType):
        return "struct<" + ", ".join(f"{quote(f.name)}: {sql_type(f.dataType)}" for f in t.fields) + ">"
    if isinstance(t, ArrayType):
        return f"array<{sql_type(t.elementType)}>"
    if isinstance(t, MapType):
        return f"map<{sql_type(t.keyType)}, {sql_type(t.valueType)}>"
    return t.simpleString()


def string_literal(text: str) -> str:
    """A SQL string literal (table properties: a default backfill's holds producer data).
    ``${`` is written ``$\\{``: Spark substitutes ``${var}``, ``${env:NAME}``... in SQL text
    before parsing (``spark.sql.variable.substitute``), and reads ``\\{`` back as ``{``."""
    escaped = text.replace("\\", "\\\\").replace("'", "\\'").replace("${", "$\\{")
    return "'" + escaped + "'"


def col(name: str) -> Column:
    """The top-level column ``name`` (``F.col`` would read dots and backticks in it as syntax)."""
    return F.col(quote(name))
