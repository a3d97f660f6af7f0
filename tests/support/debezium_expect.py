"""What a source column must become in Iceberg, per issue 14's type mapping, written down
independently of the code under test: the Spark SQL type of the column, and one comparable
Python value from the source's JSON rendering (Postgres ``to_json``, MariaDB ``JSON_OBJECT``)
and from the Spark row.

Kinds: ``int`` (int16/int32), ``long``, ``decimal(p,s)``, ``decimal`` (Postgres' unconstrained
numeric: any decimal type, value exact), ``date``, ``timestamp`` (no zone: Spark
``timestamp_ntz``), ``timestamptz`` (Spark ``timestamp``, compared in UTC), ``json`` (a string
holding the JSON), ``binary``, ``float``, ``double``, ``boolean``, ``string``, ``array<string>``.
"""

from __future__ import annotations

import json
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

PG: dict[str, dict[str, str]] = {
    "customers": {"id": "int", "name": "string", "active": "boolean", "uid": "string", "tags": "array<string>"},
    "accounts": {
        "id": "long",
        "balance": "decimal(38,10)",
        "amount": "decimal",
        "opened": "date",
        "seen": "timestamp",
        "seen_tz": "timestamptz",
        "doc": "json",
        "j": "json",
        "raw": "binary",
        "small": "int",
        "i": "int",
        "r": "float",
        "d": "double",
    },
    "docs": {"id": "int", "body": "string", "score": "int"},
}
MARIADB: dict[str, dict[str, str]] = {
    # MariaDB's BOOLEAN is TINYINT(1), an int16; its JSON is text checked by json_valid().
    "customers": {"id": "int", "name": "string", "active": "int", "uid": "string", "tags": "json"},
    "accounts": PG["accounts"] | {"amount": "decimal(30,5)"},
}


def spark_type_ok(kind: str, spark_type: str) -> bool:
    """Whether Spark's ``simpleString`` of a column is what ``kind`` must become."""
    want = {
        "int": "int",
        "long": "bigint",
        "timestamp": "timestamp_ntz",
        "timestamptz": "timestamp",
        "json": "string",
    }.get(kind, kind)
    if kind == "decimal":
        return spark_type.startswith("decimal(")
    return spark_type == want


def _utc_naive(v: datetime) -> datetime:
    # A naive source value of a zoned column is UTC (MariaDB is read with time_zone +00:00).
    return (v if v.tzinfo else v.replace(tzinfo=UTC)).astimezone(UTC).replace(tzinfo=None)


def from_source(kind: str, v: Any) -> Any:
    """The comparable value of a source cell (JSON-decoded, decimals as Decimal)."""
    if v is None:
        return None
    if kind.startswith("decimal"):
        return Decimal(str(v))
    if kind in ("int", "long"):
        return int(v)
    if kind in ("float", "double"):
        return float(v)
    if kind == "date":
        return date.fromisoformat(v)
    if kind == "timestamp":
        return datetime.fromisoformat(v.replace(" ", "T"))
    if kind == "timestamptz":
        return _utc_naive(datetime.fromisoformat(v.replace(" ", "T")))
    if kind == "binary":
        return bytes.fromhex(v[2:] if v.startswith("\\x") else v)
    return v  # json (already decoded), string, boolean, arrays


def from_lake(kind: str, v: Any) -> Any:
    """The comparable value of a Spark cell of a column that has the expected type."""
    if v is None:
        return None
    if kind == "json":
        return json.loads(v, parse_float=Decimal) if isinstance(v, str) else v
    if kind == "timestamptz" and isinstance(v, datetime):
        # PySpark hands TimestampType back as naive local time; astimezone reads it as such.
        return v.astimezone(UTC).replace(tzinfo=None)
    if kind == "binary" and isinstance(v, bytes | bytearray):
        return bytes(v)
    return v
