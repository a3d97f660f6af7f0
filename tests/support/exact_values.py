"""Debezium envelopes in the forms a real Debezium Server 3.6.0.Final sent from PostgreSQL 15 and
MariaDB 10.11 under the generated configuration's modes (:data:`cdclake.debezium.source_types.MODES`):
numerics as text with their source type propagated, NaN as ``"NAN"``, a double's NaN and
infinities as strings, BIGINT UNSIGNED as a Connect Decimal of scale 0. Written by hand from
what that server posted (observed for issue 29), not by the code under test."""

from __future__ import annotations

import json
from datetime import date
from typing import Any


def numeric(name: str, length: str, scale: str | None = None, source: str = "NUMERIC") -> dict[str, Any]:
    params = {"__debezium.source.column.type": source, "__debezium.source.column.length": length}
    if scale is not None:
        params["__debezium.source.column.scale"] = scale
    params["__debezium.source.column.name"] = name
    return {"type": "string", "optional": True, "parameters": params, "field": name}


PG_FIELDS: list[dict[str, Any]] = [
    {"type": "int32", "optional": False, "field": "id"},
    {"type": "double", "optional": True, "field": "d"},
    {"type": "float", "optional": True, "field": "r"},
    numeric("n", "0"),  # numeric without a precision: length 0, no scale
    numeric("n2", "20", "6"),
    numeric("n50", "50", "10"),
    {"type": "int32", "optional": True, "name": "io.debezium.time.Date", "version": 1, "field": "dt"},
    {"type": "string", "optional": True, "name": "io.debezium.time.Interval", "version": 1, "field": "iv"},
    {
        "type": "array",
        "items": {"type": "string", "optional": True},
        "optional": True,
        "parameters": {
            "__debezium.source.column.type": "_NUMERIC",
            "__debezium.source.column.length": "131089",
            "__debezium.source.column.scale": "0",
        },
        "field": "na",
    },
]

PI_50 = "3.14159265358979323846264338327950288419716939937510"


def days(d: date) -> int:
    return (d - date(1970, 1, 1)).days


# 15 March 44 BC (astronomical year -43) in the proleptic Gregorian calendar: 400 years later is
# 15 March 357 AD, and 400 Gregorian years are 146097 days.
BC_44_MARCH_15 = days(date(357, 3, 15)) - 146_097


def envelope(
    fields: list[dict[str, Any]], after: dict[str, Any], lsn: int, op: str = "c", table: str = "exact"
) -> dict[str, Any]:
    """A PostgreSQL Debezium change event in the full envelope (schema + payload) at ``lsn``."""
    schema = {
        "type": "struct",
        "fields": [
            {"field": "before", "type": "struct", "optional": True, "fields": fields},
            {"field": "after", "type": "struct", "optional": True, "fields": fields},
        ],
    }
    payload = {
        "before": None,
        "after": after,
        "source": {
            "connector": "postgresql",
            "name": "pg",
            "ts_ms": 1,
            "table": table,
            "lsn": lsn,
            "sequence": json.dumps([str(lsn), str(lsn)]),
        },
        "op": op,
        "ts_ms": 1_767_225_600_000 + lsn,
    }
    return {"schema": schema, "payload": payload}


def pg_envelope(after: dict[str, Any], lsn: int, op: str = "c", table: str = "exact") -> dict[str, Any]:
    return envelope(PG_FIELDS, after, lsn, op, table)


def pg_row(i: int, **values: Any) -> dict[str, Any]:
    row: dict[str, Any] = {"id": i, "d": 1.5, "r": 2.5, "n": "1", "n2": "1.000000", "n50": "1.0000000000"}
    row |= {"dt": days(date(2024, 1, 1)), "iv": "P0Y1M2DT0H0M1.5S", "na": ["1.5", None]}
    return row | values
