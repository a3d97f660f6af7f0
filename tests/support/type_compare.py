"""Read the type matrix from the source through its own driver and from Iceberg through Spark,
and list every difference the reference model (tests/support/type_model.py) finds.

Source: psycopg2 with PostgreSQL's text for the types Python cannot hold (BC and infinite dates,
``24:00``, money, intervals in ``IntervalStyle iso_8601``, JSON as stored); PyMySQL in UTC with
``FLOAT`` read as ``CAST(... AS DOUBLE)`` (the text protocol rounds it to 6 digits).
Lake: dates as ``unix_date``, timestamps as ``unix_micros`` (the session is in UTC), so no
value has to fit Python's ``datetime``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tests.support import type_model as m
from tests.support.type_matrix import Col

# PostgreSQL type OIDs read as their text: date, time, timestamp, timestamptz, interval, timetz,
# money, json, jsonb.
PG_TEXT_OIDS = (1082, 1083, 1114, 1184, 1186, 1266, 790, 114, 3802)


def pg_connect(port: int, db: str, user: str, password: str) -> Any:
    import psycopg2
    import psycopg2.extensions as ext

    conn = psycopg2.connect(host="127.0.0.1", port=port, dbname=db, user=user, password=password)
    as_text = ext.new_type(PG_TEXT_OIDS, "AS_TEXT", lambda v, cur: v)
    ext.register_type(as_text, conn)
    with conn.cursor() as cur:
        cur.execute("SET TimeZone = 'UTC'; SET IntervalStyle = 'iso_8601'; SET DateStyle = 'ISO'")
    conn.commit()
    return conn


def maria_connect(port: int, db: str, user: str, password: str) -> Any:
    import pymysql

    return pymysql.connect(
        host="127.0.0.1",
        port=port,
        user=user,
        password=password,
        database=db,
        charset="utf8mb4",
        init_command="SET time_zone = '+00:00'",
    )


def source_rows(conn: Any, table: str, cols: Sequence[Col], pg: bool) -> dict[Any, dict[str, Any]]:
    """``table``'s rows by id, each column as the driver reads it (bytes for binary)."""
    select = ["id"]
    for c in cols:
        select.append(f"CAST({c.name} AS DOUBLE)" if (not pg and c.kind == "float") else c.name)
    with conn.cursor() as cur:
        cur.execute(f"SELECT {', '.join(select)} FROM {table} ORDER BY id")
        got = cur.fetchall()
    conn.commit()
    out = {}
    for r in got:
        values = [bytes(v) if isinstance(v, memoryview) else v for v in r]
        out[values[0]] = dict(zip(["id", *(c.name for c in cols)], values, strict=True))
    return out


@dataclass
class LakeRead:
    types: dict[str, str]
    rows: dict[Any, dict[str, Any]]


def lake_read(spark: Any, ident: str) -> LakeRead:
    """The Iceberg table: its Spark types, and its rows by id with temporal cells as numbers."""
    spark.catalog.refreshTable(ident)
    df = spark.table(ident)
    types = {f.name: f.dataType.simpleString() for f in df.schema.fields}
    exprs = []
    for name, t in types.items():
        q = f"`{name}`"
        if t == "date":
            exprs.append(f"unix_date({q}) AS {q}")
        elif t == "timestamp":
            exprs.append(f"unix_micros({q}) AS {q}")
        elif t == "timestamp_ntz":
            exprs.append(f"unix_micros(CAST({q} AS TIMESTAMP)) AS {q}")
        else:
            exprs.append(q)
    rows = [r.asDict(recursive=True) for r in df.selectExpr(*exprs).collect()]
    return LakeRead(types, {_key(r["id"]): r for r in rows})


def _key(v: Any) -> Any:
    # A BIGINT UNSIGNED key lands as decimal(20,0): the same key as the source's int.
    return int(v) if v is not None else None


def quarantine_reasons(spark: Any, ident: str, limit: int = 8) -> list[str]:
    """The distinct reasons in ``<ident>__quarantine`` (why rows are missing), if it exists."""
    q = ident + "__quarantine"
    if not spark.catalog.tableExists(q):
        return []
    spark.catalog.refreshTable(q)
    df = spark.table(q)
    reason = next((c for c in df.columns if "reason" in c.lower()), None)
    if reason is None:
        return []
    return [str(r[0])[:300] for r in df.select(reason).distinct().limit(limit).collect()]


@dataclass
class Diff:
    missing: list[Any] = field(default_factory=list)
    extra: list[Any] = field(default_factory=list)
    cells: list[str] = field(default_factory=list)
    types: list[str] = field(default_factory=list)
    quarantined: list[str] = field(default_factory=list)
    """The quarantine's reasons, when rows are missing."""

    def empty(self) -> bool:
        return not (self.missing or self.extra or self.cells or self.types)

    def lines(self, label: str) -> list[str]:
        out = [f"{label}: missing rows {self.missing}"] if self.missing else []
        out += [f"{label}: extra rows {self.extra}"] if self.extra else []
        out += [f"{label}: quarantined: {q}" for q in self.quarantined]
        return out + [f"{label}: {t}" for t in self.types] + [f"{label}: {c}" for c in self.cells]


def compare(source: dict[Any, dict[str, Any]], lake: LakeRead, cols: Sequence[Col]) -> Diff:
    """Source (driver) against lake, cell for cell and by declared type, by the reference model."""
    d = Diff()
    for c in cols:
        have = lake.types.get(c.name)
        if not m.spark_type_ok(c.kind, have):
            d.types.append(f"{c.name} ({c.ddl}): Iceberg type {have}, want {m.SPARK_TYPE.get(c.kind, c.kind)}")
        companion = lake.types.get(c.name + m.COMPANION)
        if companion not in (None, "string"):
            d.types.append(f"{c.name}{m.COMPANION}: Iceberg type {companion}, want string")
    src = {_key(k): v for k, v in source.items()}
    d.missing = sorted(k for k in src if k not in lake.rows)
    d.extra = sorted(k for k in lake.rows if k not in src)
    for key in sorted(k for k in src if k in lake.rows):
        row = _row_cells(key, src[key], lake.rows[key], cols)
        # Most of a row differing is one finding (an update quarantined, a stale row), not many.
        many = len(cols) > 2 and len(row) > len(cols) // 2
        d.cells += [f"id={key}: {len(row)} of {len(cols)} columns differ (stale row?), e.g. {row[0]}"] if many else row
    return d


def _row_cells(key: Any, src: dict[str, Any], got_row: dict[str, Any], cols: Sequence[Col]) -> list[str]:
    out = []
    for c in cols:
        want = m.expected(c.kind, src[c.name])
        try:
            typed = m.canon_typed(c.kind, got_row.get(c.name))
        except (ValueError, TypeError, ArithmeticError, AttributeError) as exc:  # a wrong type: a finding
            typed = f"unreadable {got_row.get(c.name)!r} ({exc})"
        text = m.canon_text(c.kind, got_row.get(c.name + m.COMPANION))
        if not want.holds(typed, text):
            out.append(
                f"id={key} {c.name} ({c.ddl}) source {_show(src[c.name])}: "
                f"want {_show(want.typed)}{' (typed or text)' if want.either else ''}"
                f"{'' if want.text is None else ' text ' + _show(want.text)}, "
                f"got {_show(typed)}{'' if text is None else ' text ' + _show(text)}"
            )
    return out


def _show(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 90 else text[:87] + "..."
