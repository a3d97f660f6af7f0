"""Issue 29's type matrix: one column per source type of PostgreSQL 15 and MariaDB, each with its
edge values, the rows that carry them, the phases of writes (inserts, updates, deletes, a
TRUNCATE, a DROP COLUMN) and the source read back through its own driver (psycopg2, PyMySQL).

Row ``i`` (ids 1..N, snapshot; 101..100+N, streamed) holds edge value ``i % len(values)`` of every
column, so every edge value is in some row; one more row is all NULL. Rows 1000.. (snapshot) and
2000.. (streamed) hold one edge value each, every other column NULL. Updates rotate a row to the
next edge value of every column (a value needing the companion replaced by one that fits, and back).
Every statement binds its values as parameters; column names and types are this module's constants.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

DROPPED = "c_drop"
"""The column each matrix table loses in the last phase (ALTER TABLE ... DROP COLUMN)."""


@dataclass(frozen=True)
class Col:
    name: str
    ddl: str
    kind: str
    """The reference model's kind (tests/support/type_model.py)."""
    values: tuple[Any, ...]
    """Edge values, as bound parameters (cast to ``ddl`` in PostgreSQL)."""


NINES_38 = Decimal("9" * 38)
MINUS_NINES_38 = Decimal("-" + "9" * 38)  # not -NINES_38: unary minus rounds to 28 digits
PI_50 = "3.14159265358979323846264338327950288419716939937510"

PG_ENUM = "CREATE TYPE mood AS ENUM ('happy', 'sad 😀')"
PG_COLS: tuple[Col, ...] = (
    Col("c_int2", "smallint", "int", (-32768, 32767, 0)),
    Col("c_int4", "integer", "int", (-2147483648, 2147483647, 0)),
    Col("c_int8", "bigint", "long", (-(2**63), 2**63 - 1, 0)),
    Col("c_real", "real", "float", ("NaN", "Infinity", "-Infinity", "3.4028235e38", "-1.17549435e-38", "1.5")),
    Col(
        "c_float8",
        "double precision",
        "double",
        ("NaN", "Infinity", "-Infinity", "1.7976931348623157e308", "5e-324", "-0", "0.1"),
    ),
    Col("c_num_38_0", "numeric(38,0)", "decimal(38,0)", (NINES_38, MINUS_NINES_38, 0)),
    Col(
        "c_num_38_30",
        "numeric(38,30)",
        "decimal(38,30)",
        (Decimal("99999999." + "9" * 30), Decimal("-0." + "0" * 29 + "1"), 0),
    ),
    Col("c_num_20_6", "numeric(20,6)", "decimal(20,6)", ("NaN", "99999999999999.999999", "-99999999999999.999999")),
    Col(
        "c_num",
        "numeric",
        "numeric",
        (
            PI_50,
            "1e-20",
            "123456789012345678901234.5",
            "NaN",
            "Infinity",
            "-Infinity",
            "99999999999999999999.999999999999999999",  # the widest that fits decimal(38,18)
            "1" * 50,
            "0.1",
        ),
    ),
    Col("c_money", "money", "money", ("-92233720368547758.08", "92233720368547758.07", "0.01")),
    Col("c_bool", "boolean", "boolean", (True, False)),
    Col("c_text", "text", "string", ("😀 emoji", "\x01start", "end\x01", "", "q ' \" \\ b", "line\nbreak\ttab")),
    Col("c_varchar", "varchar(10)", "string", ("😀" * 10, "\x01", "")),
    Col("c_char", "char(5)", "string", ("ab", "😀", "\x01")),
    Col("c_bytea", "bytea", "binary", (b"", b"\x00\xff\x00", bytes(range(256)))),
    Col("c_uuid", "uuid", "string", ("00000000-0000-0000-0000-000000000000", "ffffffff-ffff-ffff-ffff-ffffffffffff")),
    Col("c_json", "json", "json", ('{"a": 1.00000000000000000000001, "b": "😀", "c": [null, true]}', "[]", "null")),
    Col("c_jsonb", "jsonb", "json", ('{"b": 1, "a": [1.5e300, "\\u0001"]}', "{}", "null")),
    Col("c_date", "date", "date", ("0001-01-01", "9999-12-31", "0044-03-15 BC", "1970-01-01", "infinity", "-infinity")),
    Col("c_time", "time", "time", ("00:00:00", "24:00:00", "23:59:59.999999")),
    Col("c_timetz", "timetz", "timetz", ("00:00:00+14", "23:59:59.999999-12", "12:34:56.789012+05:30")),
    Col(
        "c_ts",
        "timestamp",
        "ts",
        ("0001-01-01 00:00:00", "9999-12-31 23:59:59.999999", "0044-03-15 12:00:00 BC", "infinity", "-infinity"),
    ),
    Col(
        "c_tstz",
        "timestamptz",
        "tstz",
        (
            "0001-01-01 00:00:00+00",
            "9999-12-31 23:59:59.999999+00",
            "2024-02-29 12:00:00.000001+05:30",
            "infinity",
            "-infinity",
            "0044-03-15 12:00:00+00 BC",
        ),
    ),
    Col(
        "c_interval",
        "interval",
        "interval",
        ("1 mon", "1000000 years", "-1 days -00:00:00.000001", "1 year 2 mons 3 days 04:05:06.789"),
    ),
    Col("c_int_arr", "integer[]", "array<int>", ([], [1, None, 3], [-2147483648, 2147483647])),
    Col("c_text_arr", "text[]", "array<string>", ([], [None], ["😀", "", "\x01", "NULL"])),
    Col("c_enum", "mood", "string", ("happy", "sad 😀")),
    Col(DROPPED, "integer", "int", (7, -7)),
)

MARIA_COLS: tuple[Col, ...] = (
    Col("c_tinyint", "TINYINT", "int", (-128, 127, 0)),
    Col("c_utinyint", "TINYINT UNSIGNED", "int", (0, 255)),
    Col("c_smallint", "SMALLINT", "int", (-32768, 32767)),
    Col("c_usmallint", "SMALLINT UNSIGNED", "int", (0, 65535)),
    Col("c_mediumint", "MEDIUMINT", "int", (-8388608, 8388607)),
    Col("c_umediumint", "MEDIUMINT UNSIGNED", "int", (0, 16777215)),
    Col("c_int", "INT", "int", (-2147483648, 2147483647)),
    Col("c_uint", "INT UNSIGNED", "long", (0, 4294967295)),
    Col("c_bigint", "BIGINT", "long", (-(2**63), 2**63 - 1)),
    Col("c_ubigint", "BIGINT UNSIGNED", "u64", (0, 2**63, 2**64 - 1)),
    Col("c_float", "FLOAT", "float", (-3.4028234663852886e38, 1.1754943508222875e-38, 1.5)),
    Col("c_double", "DOUBLE", "double", (1.7976931348623157e308, -2.2250738585072014e-308, 0.1)),
    Col(
        "c_dec_65_30",
        "DECIMAL(65,30)",
        "wide_decimal",
        (Decimal("9" * 35 + "." + "9" * 30), Decimal("-0." + "0" * 29 + "1"), 0),
    ),
    Col("c_dec_38_0", "DECIMAL(38,0)", "decimal(38,0)", (NINES_38, MINUS_NINES_38)),
    Col("c_dec_20_6", "DECIMAL(20,6)", "decimal(20,6)", (Decimal("99999999999999.999999"), Decimal("-0.000001"))),
    Col("c_bool", "BOOLEAN", "int", (0, 1)),
    Col("c_bit1", "BIT(1)", "boolean", (0, 1)),
    Col("c_bit64", "BIT(64)", "bits", (0, 1, 2**64 - 1)),
    Col("c_year", "YEAR", "int", (1901, 2155)),
    Col("c_char", "CHAR(5)", "string", ("ab", "😀", "\x01")),
    Col("c_varchar", "VARCHAR(20)", "string", ("😀x", "a\x00b", "")),
    Col("c_text", "TEXT", "string", ("\x01", "😀 emoji", "q ' \" \\ b")),
    Col("c_binary", "BINARY(4)", "binary", (b"\x00\x00\x00\x00", b"\xff\x01\x00\x00")),
    Col("c_varbinary", "VARBINARY(10)", "binary", (b"", b"\x00")),
    Col("c_blob", "BLOB", "binary", (bytes(range(256)), b"")),
    Col("c_uuid", "UUID", "string", ("00000000-0000-0000-0000-000000000000", "ffffffff-ffff-ffff-ffff-ffffffffffff")),
    Col("c_json", "JSON", "json", ('{"a": 1.00000000000000000001, "b": "😀"}', "null", "[]")),
    Col("c_date", "DATE", "date", ("0001-01-01", "9999-12-31", "1000-01-01")),
    Col(
        "c_datetime",
        "DATETIME(6)",
        "ts",
        ("1000-01-01 00:00:00", "9999-12-31 23:59:59.999999", "0001-01-01 00:00:00"),
    ),
    Col(
        "c_timestamp",
        "TIMESTAMP(6) NULL DEFAULT NULL",
        "tstz",
        ("1970-01-01 00:00:01", "2038-01-19 03:14:07.999999"),
    ),
    Col("c_time", "TIME(6)", "time", ("-838:59:59.999999", "838:59:59.999999", "00:00:00")),
    Col("c_enum", "ENUM('a','😀')", "string", ("a", "😀")),
    Col("c_set", "SET('x','y','z')", "string", ("x,z", "")),
    Col(DROPPED, "INT", "int", (7, -7)),
)
# MariaDB's BIGINT UNSIGNED as a primary key: rows keyed past 2^63 must keep their keys.
UBIG_KEYS = (0, 2**63 - 1, 2**63, 2**64 - 1)


def rows(cols: Sequence[Col], first_id: int) -> list[tuple[int, list[Any]]]:
    """Rows ``first_id``.. holding every edge value of every column, then one all-NULL row."""
    n = max(len(c.values) for c in cols)
    out = [(first_id + i, [c.values[i % len(c.values)] for c in cols]) for i in range(n)]
    return [*out, (first_id + n, [None] * len(cols))]


def isolated(cols: Sequence[Col], first_id: int) -> list[tuple[int, list[Any]]]:
    """One row per edge value of each column, every other column NULL: a value that goes wrong
    shows on its own, not hidden by another column's value quarantining the row it shares."""
    out: list[tuple[int, list[Any]]] = []
    for i, c in enumerate(cols):
        for v in c.values:
            row: list[Any] = [None] * len(cols)
            row[i] = v
            out.append((first_id + len(out), row))
    return out


def rotated(cols: Sequence[Col], i: int) -> list[Any]:
    """Edge value ``i`` of every column (wrapping): what an update writes."""
    return [c.values[i % len(c.values)] for c in cols]


def pg_schema() -> str:
    cols = ", ".join(f"{c.name} {c.ddl}" for c in PG_COLS)
    return (
        f"{PG_ENUM}; CREATE TABLE types (id integer PRIMARY KEY, {cols}); "
        "CREATE TABLE scratch (id integer PRIMARY KEY, v text); CREATE TABLE marks (id integer PRIMARY KEY);"
    )


def maria_schema() -> str:
    cols = ", ".join(f"{c.name} {c.ddl}" for c in MARIA_COLS)
    return (
        "SET NAMES utf8mb4; "
        f"CREATE TABLE types (id INT PRIMARY KEY, {cols}) DEFAULT CHARSET utf8mb4; "
        "CREATE TABLE ubig (id BIGINT UNSIGNED PRIMARY KEY, v VARCHAR(20)); "
        "CREATE TABLE scratch (id INT PRIMARY KEY, v TEXT) DEFAULT CHARSET utf8mb4; "
        "CREATE TABLE marks (id INT PRIMARY KEY);"
    )


class Writer:
    """Parameterised writes to one source's matrix tables (PostgreSQL: ``CAST(%s AS type)``)."""

    def __init__(self, conn: Any, cols: Sequence[Col], pg: bool) -> None:
        self.conn, self.pg = conn, pg
        self.cols = list(cols)
        self.dropped = False

    def _ph(self, c: Col) -> str:
        return f"CAST(%s AS {c.ddl})" if self.pg else "%s"

    def _run(self, sql: str, params: Sequence[Any] = ()) -> None:
        with self.conn.cursor() as cur:
            cur.execute(sql, list(params))
        self.conn.commit()

    def live(self) -> list[Col]:
        return [c for c in self.cols if c.name != DROPPED or not self.dropped]

    def insert(self, row_id: int, values: Sequence[Any]) -> None:
        cols = self.live()
        values = [_param(c, v, self.pg) for c, v in zip(cols, values, strict=False)]
        names = ", ".join(["id", *(c.name for c in cols)])
        marks = ", ".join(["%s", *(self._ph(c) for c in cols)])
        self._run(f"INSERT INTO types ({names}) VALUES ({marks})", [row_id, *values])

    def update(self, row_id: int, values: Sequence[Any]) -> None:
        cols = self.live()
        sets = ", ".join(f"{c.name} = {self._ph(c)}" for c in cols)
        params = [_param(c, v, self.pg) for c, v in zip(cols, values, strict=False)]
        self._run(f"UPDATE types SET {sets} WHERE id = %s", [*params, row_id])

    def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        self._run(sql, params)

    def drop_column(self) -> None:
        self._run(f"ALTER TABLE types DROP COLUMN {DROPPED}")
        self.dropped = True


def _param(c: Col, v: Any, pg: bool) -> Any:
    if v is None or pg:
        return v
    if c.kind == "bits":
        return int(v)  # MariaDB takes a BIT value as an integer
    return v
