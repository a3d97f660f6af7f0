"""Read the captured tables' primary keys and column types from the source database itself.

Debezium's HTTP sink posts the record value only, never the record key, so the receiver cannot
learn a table's primary key from what it is sent; and without the Connect schema
(``schemas.enable=false``) it cannot learn the column types either. ``cdclake debezium
--discover`` asks the database, as the same user Debezium connects as, and writes both into the
``[tables.<name>]`` lines of CDCLAKE_TABLE_CONFIG (``key`` and ``types``).

The types are the ones Debezium's schema would declare (:mod:`cdclake.debezium.connect_types`), so a
table lands the same with or without schemas:

==========================================  ==========================================
PostgreSQL                                  MariaDB / MySQL                             type
==========================================  ==========================================
smallint, integer                           tinyint, smallint, mediumint, int, year     int
bigint                                      bigint, int unsigned                        bigint
--                                          bigint unsigned                             decimal(20,0)
real / double precision                     float / double                              float / double
numeric(p,s), p <= 38                       decimal(p,s), p <= 38                       decimal(p,s)
numeric (no precision)                      --                                          decimal(38,18)
money                                       --                                          decimal(38,2)
date                                        date                                        date
timestamp                                   datetime                                    timestamp_ntz
timestamptz                                 timestamp                                   timestamp
time                                        time                                        bigint (µs)
bytea                                       binary, varbinary, blob                     binary
boolean                                     --                                          boolean
text, varchar, char, uuid, json(b), xml,    char, varchar, text, enum, set, json, uuid  string
enum, interval, numeric(p>38,s)
arrays of the above                         --                                          array<T>
==========================================  ==========================================

Any other type (``bit``, geometry, Postgres ranges...) is left out: its type is inferred from the
values. The whole table, with the representation of values a type cannot hold, is
:mod:`cdclake.debezium.source_types`. Queries bind every name as a parameter.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cdclake.contracts.coltypes import MAX_PRECISION
from cdclake.debezium.config import Database
from cdclake.debezium.connect_types import VARIABLE_SCALE

__all__ = ["Discovered", "DiscoveryError", "discover", "mysql_type", "postgres_type"]


class DiscoveryError(RuntimeError):
    """The database could not be asked, or a table is missing; the message says which."""


@dataclass(frozen=True)
class Discovered:
    keys: dict[str, tuple[str, ...]]
    """Primary-key columns in key order, by captured table; tables without one are left out."""
    types: dict[str, dict[str, str]]
    """Column types (canonical :mod:`cdclake.contracts.coltypes`) by captured table."""


_PG_SIMPLE = {
    "int2": "int",
    "int4": "int",
    "int8": "bigint",
    "float4": "float",
    "float8": "double",
    "bool": "boolean",
    "date": "date",
    "timestamp": "timestamp_ntz",
    "timestamptz": "timestamp",
    "time": "bigint",
    "bytea": "binary",
    "interval": "string",  # interval.handling.mode=string: ISO-8601 text
    "money": "decimal(38,2)",  # decimal.handling.mode=string: exact text, 2 digits by default
    **{t: "string" for t in ("text", "varchar", "bpchar", "uuid", "json", "jsonb", "xml", "name", "timetz")},
}


def _decimal(precision: int | None, scale: int | None) -> str:
    if precision is None:
        return "decimal({},{})".format(*VARIABLE_SCALE)
    return f"decimal({precision},{scale or 0})" if precision <= MAX_PRECISION else "string"


def postgres_type(typname: str, typmod: int, is_enum: bool = False, element: str | None = None) -> str | None:
    """The column type of a Postgres column (``pg_type.typname``, ``pg_attribute.atttypmod``)."""
    if element is not None:
        inner = postgres_type(element, typmod)
        return None if inner is None else f"array<{inner}>"
    if is_enum:
        return "string"
    if typname == "numeric":
        # atttypmod: ((precision << 16) | scale) + 4, or -1 without a precision
        return _decimal(None, None) if typmod < 4 else _decimal((typmod - 4) >> 16, (typmod - 4) & 0xFFFF)
    return _PG_SIMPLE.get(typname)


def mysql_type(data_type: str, column_type: str, precision: int | None, scale: int | None) -> str | None:
    """The column type of a MariaDB/MySQL column (``information_schema.COLUMNS``)."""
    t, unsigned = data_type.lower(), "unsigned" in column_type.lower()
    if t in ("tinyint", "smallint", "mediumint", "year") or (t == "int" and not unsigned):
        return "int"
    if t == "int" or (t == "bigint" and not unsigned):
        return "bigint"
    if t == "bigint":  # unsigned: bigint.unsigned.handling.mode=precise
        return "decimal(20,0)"
    if t in ("decimal", "numeric"):
        return _decimal(precision, scale)
    simple = {
        "float": "float",
        "double": "double",
        "date": "date",
        "datetime": "timestamp_ntz",
        "timestamp": "timestamp",
        "time": "bigint",
        **{b: "binary" for b in ("binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob")},
    }
    if t in simple:
        return simple[t]
    texts = ("char", "varchar", "tinytext", "text", "mediumtext", "longtext", "enum", "set", "json", "uuid")
    return "string" if t in texts else None


_PG_COLUMNS = """
SELECT a.attname, t.typname, a.atttypmod, t.typtype = 'e', e.typname,
       coalesce((SELECT k.n FROM unnest(i.indkey::int2[]) WITH ORDINALITY k(att, n) WHERE k.att = a.attnum), 0)
FROM pg_attribute a
JOIN pg_class c ON c.oid = a.attrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
JOIN pg_type t ON t.oid = a.atttypid
LEFT JOIN pg_type e ON e.oid = t.typelem AND t.typcategory = 'A'
LEFT JOIN pg_index i ON i.indrelid = c.oid AND i.indisprimary
WHERE n.nspname = %s AND c.relname = %s AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum
"""
_MY_COLUMNS = """
SELECT c.COLUMN_NAME, c.DATA_TYPE, c.COLUMN_TYPE, c.NUMERIC_PRECISION, c.NUMERIC_SCALE,
       coalesce(k.ORDINAL_POSITION, 0)
FROM information_schema.COLUMNS c
LEFT JOIN information_schema.KEY_COLUMN_USAGE k
  ON k.TABLE_SCHEMA = c.TABLE_SCHEMA AND k.TABLE_NAME = c.TABLE_NAME AND k.COLUMN_NAME = c.COLUMN_NAME
  AND k.CONSTRAINT_NAME = 'PRIMARY'
WHERE c.TABLE_SCHEMA = %s AND c.TABLE_NAME = %s
ORDER BY c.ORDINAL_POSITION
"""


def _split(table: str, default_schema: str) -> tuple[str, str]:
    schema, dot, name = table.rpartition(".")
    return (schema, name) if dot else (default_schema, table)


def _collect(table: str, rows: list[tuple[Any, ...]], out: Discovered) -> None:
    """``rows``: (column, its type or None, its position in the primary key or 0)."""
    if not rows:
        raise DiscoveryError(f"table {table!r}: not found, or no columns the user can see")
    key = sorted((pos, col) for col, _, pos in rows if pos)
    if key:
        out.keys[table] = tuple(col for _, col in key)
    out.types[table] = {col: kind for col, kind, _ in rows if kind is not None}


def _postgres(db: Database, timeout: int) -> Discovered:
    import psycopg2

    out = Discovered({}, {})
    try:
        conn = psycopg2.connect(
            host=db.host, port=db.port, user=db.user, password=db.password, dbname=db.name, connect_timeout=timeout
        )
    except psycopg2.Error as exc:
        raise DiscoveryError(f"cannot connect to postgres {db.host}:{db.port}/{db.name}: {exc}".strip()) from None
    try:
        with conn.cursor() as cur:
            for table in db.tables:
                cur.execute(_PG_COLUMNS, _split(table, "public"))
                rows = [(n, postgres_type(t, m, bool(en), el), pos) for n, t, m, en, el, pos in cur.fetchall()]
                _collect(table, rows, out)
    except psycopg2.Error as exc:
        raise DiscoveryError(f"postgres: {exc}".strip()) from None
    finally:
        conn.close()
    return out


def _mysql(db: Database, timeout: int) -> Discovered:
    import pymysql

    out = Discovered({}, {})
    try:
        # UTF-8 bytes, as Debezium's JDBC driver sends it: PyMySQL would encode a str as Latin-1.
        conn = pymysql.connect(
            host=db.host, port=db.port, user=db.user, password=db.password.encode(), connect_timeout=timeout
        )
    except pymysql.Error as exc:
        raise DiscoveryError(f"cannot connect to {db.kind} {db.host}:{db.port}: {exc}") from None
    try:
        with conn.cursor() as cur:
            for table in db.tables:
                cur.execute(_MY_COLUMNS, _split(table, db.name))
                rows = [(n, mysql_type(dt, ct, p, s), pos) for n, dt, ct, p, s, pos in cur.fetchall()]
                _collect(table, rows, out)
    except pymysql.Error as exc:
        raise DiscoveryError(f"{db.kind}: {exc}") from None
    finally:
        conn.close()
    return out


def discover(db: Database, timeout: int = 10) -> Discovered:
    """Each captured table's primary key and column types, asked of the database ``db``."""
    return _postgres(db, timeout) if db.kind == "postgres" else _mysql(db, timeout)
