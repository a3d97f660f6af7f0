"""Column types from Debezium's Connect schema (issue 14, F4): through the receiver and the
apply job into Iceberg with the source's types. The envelopes are written here from Debezium's
documented encodings (a unit test of the mapping; tests/e2e/test_debezium_server.py runs the real
server); expected values are computed here from the source values, not by the code under test."""

from __future__ import annotations

import base64
import json
from datetime import UTC, date, datetime
from decimal import Decimal, localcontext
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from starlette.testclient import TestClient

from cdclake.config.settings import Settings
from cdclake.contracts.coltypes import Companion
from cdclake.debezium import connect_types as debezium_types
from cdclake.debezium import envelope as debezium
from cdclake.debezium import text as debezium_text
from receiver.app import create_app
from tests.support import apply_all

DECIMAL = "org.apache.kafka.connect.data.Decimal"


def unscaled(value: Decimal, scale: int) -> str:
    with localcontext() as ctx:
        ctx.prec = 100  # the default 28 digits would round a 30-digit value
        n = int(value.scaleb(scale))
    return base64.b64encode(n.to_bytes(max(1, (n.bit_length() + 8) // 8), "big", signed=True)).decode()


FIELDS: list[dict[str, Any]] = [
    {"field": "id", "type": "int64"},
    {
        "field": "balance",
        "type": "bytes",
        "name": DECIMAL,
        "parameters": {"scale": "10", "connect.decimal.precision": "38"},
    },
    {"field": "amount", "type": "struct", "name": "io.debezium.data.VariableScaleDecimal"},
    {"field": "opened", "type": "int32", "name": "io.debezium.time.Date"},
    {"field": "seen", "type": "int64", "name": "io.debezium.time.MicroTimestamp"},
    {"field": "seen_tz", "type": "string", "name": "io.debezium.time.ZonedTimestamp"},
    {"field": "doc", "type": "string", "name": "io.debezium.data.Json"},
    {"field": "raw", "type": "bytes"},
    {"field": "small", "type": "int16"},
    {"field": "r", "type": "float"},  # what Connect's JSON schema calls float32
    {"field": "tags", "type": "array", "items": {"type": "string"}},
    {"field": "at", "type": "int64", "name": "io.debezium.time.MicroTime"},
]
WANT_TYPES = {
    "id": "bigint",
    "balance": "decimal(38,10)",
    "amount": "decimal(38,18)",
    "opened": "date",
    "seen": "timestamp_ntz",
    "seen_tz": "timestamp",
    "doc": "string",
    "raw": "binary",
    "small": "int",
    "r": "float",
    "tags": "array<string>",
    "at": "bigint",
}


def source_row(i: int, amount: Decimal) -> dict[str, Any]:
    """Row ``i`` as the source database holds it (the independent expectation)."""
    return {
        "id": i,
        "balance": Decimal(f"{12345678901234567890 * i}.0123456789"),
        "amount": amount,
        "opened": date(2026, 1, i),
        "seen": datetime(2026, 1, 2, 3, 4, 5, 123456),
        "seen_tz": datetime(2026, 1, 2, 10, 4, 5, 500000, tzinfo=UTC),
        "doc": '{"a": [1, 2]}',
        "raw": bytes([0, 255, i]),
        "small": -3,
        "r": 1.5,
        "tags": ["x", None, "y's"],
        "at": 3_600_000_000 + i,
    }


def as_debezium(row: dict[str, Any]) -> dict[str, Any]:
    """The row as Debezium's JSON converter writes it."""
    amount = row["amount"]
    exponent = -amount.as_tuple().exponent
    return {
        **row,
        "balance": unscaled(row["balance"], 10),
        "amount": {"scale": exponent, "value": unscaled(amount, exponent)},
        "opened": (row["opened"] - date(1970, 1, 1)).days,
        "seen": int((row["seen"] - datetime(1970, 1, 1)).total_seconds()) * 1_000_000 + row["seen"].microsecond,
        "seen_tz": row["seen_tz"].astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        "raw": base64.b64encode(row["raw"]).decode(),
    }


def envelope(row: dict[str, Any], lsn: int) -> dict[str, Any]:
    schema = {
        "type": "struct",
        "fields": [
            {"field": "before", "type": "struct", "fields": FIELDS},
            {"field": "after", "type": "struct", "fields": FIELDS},
        ],
    }
    payload = {
        "before": None,
        "after": as_debezium(row),
        "source": {
            "connector": "postgresql",
            "name": "pg",
            "ts_ms": 1,
            "table": "accounts",
            "lsn": lsn,
            "sequence": json.dumps([str(lsn), str(lsn)]),
        },
        "op": "c",
        "ts_ms": 1_767_225_600_000,
    }
    return {"schema": schema, "payload": payload}


def test_the_mapping_declares_each_columns_type_and_rewrites_its_value() -> None:
    batch = debezium.to_batch([envelope(source_row(1, Decimal("2.50")), 100)])
    (ev,) = batch.events
    assert ev.columnTypes == WANT_TYPES
    assert ev.after is not None
    assert ev.after["balance"] == "12345678901234567890.0123456789"
    assert (ev.after["opened"], ev.after["seen"]) == ("2026-01-01", "2026-01-02T03:04:05.123456")
    assert ev.rowId == "1"


def test_a_value_too_precise_for_its_type_goes_to_the_companion_never_rounded() -> None:
    convert = debezium_types.field_type({"type": "struct", "name": "io.debezium.data.VariableScaleDecimal"})
    assert convert is not None
    value = Decimal("1.1234567890123456789012")
    assert convert[1]({"scale": 22, "value": unscaled(value, 22)}) == Companion("1.1234567890123456789012")


@given(st.integers(min_value=-(10**40), max_value=10**40), st.integers(min_value=-3, max_value=45))
def test_a_decimal_reads_as_the_exact_plain_text_of_its_value(n: int, scale: int) -> None:
    """Debezium's base64 unscaled integer and the schema's scale -> the value's plain text, as
    Python's Decimal writes it (the reference), fast path or not."""
    with localcontext() as ctx:
        ctx.prec = 200
        want = format(Decimal(n).scaleb(-scale), "f")
    raw = base64.b64encode(n.to_bytes(max(1, (n.bit_length() + 8) // 8), "big", signed=True)).decode()
    _, convert = debezium_types._decimal(38, scale)
    assert convert(raw) == want


def test_each_event_of_a_post_is_typed_by_its_own_schema() -> None:
    """A post can hold events from before and after an ALTER TABLE: the schema is worked out once
    and reused only while the events repeat it."""
    row = source_row(1, Decimal("2.50"))
    first, second, third = envelope(row, 100), envelope(row, 200), envelope(row, 300)
    scale2 = {"field": "balance", "type": "bytes", "name": DECIMAL, "parameters": {"scale": "2"}}
    fields = [scale2 if f["field"] == "balance" else f for f in FIELDS]
    second["schema"] = {"type": "struct", "fields": [{"field": "after", "type": "struct", "fields": fields}]}
    second["payload"]["after"]["balance"] = unscaled(Decimal("7.25"), 2)
    batch = debezium.to_batch([first, second, third])
    balances = [ev.after["balance"] for ev in batch.events if ev.after is not None]
    assert balances == ["12345678901234567890.0123456789", "7.25", "12345678901234567890.0123456789"]
    assert [ev.columnTypes["balance"] for ev in batch.events if ev.columnTypes] == [
        "decimal(38,10)",
        "decimal(38,2)",
        "decimal(38,10)",
    ]


def assert_applied_as_the_source(
    spark: Any, settings: Settings, rows: list[dict[str, Any]], counts: tuple[int, int] = (2, 1), **more: str
) -> None:
    """One apply: ``counts`` applied and quarantined, the table has WANT_TYPES (and ``more``)
    and the source's values in ``rows``."""
    (result,) = apply_all(spark, settings)
    assert (result["applied"], result["quarantined"]) == counts, result
    df = spark.table(f"{settings.catalog_name}.{settings.namespace}.accounts")
    types = {f.name: f.dataType.simpleString() for f in df.schema.fields if not f.name.startswith("_cdc_")}
    assert types == WANT_TYPES | more
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    got = {r["id"]: r.asDict() for r in df.collect()}
    for want in rows:
        row = {k: v for k, v in got[want["id"]].items() if not k.startswith("_cdc_")}
        seen_utc = want["seen_tz"].astimezone(UTC).replace(tzinfo=None)  # PySpark hands back naive UTC here
        assert row == {**want, "seen_tz": seen_utc, "raw": bytearray(want["raw"])}


@pytest.mark.spark
def test_iceberg_columns_have_the_source_types_and_values(spark: Any, settings: Settings) -> None:
    rows = [source_row(1, Decimal("2.50")), source_row(2, Decimal("-0.000000000000000001"))]
    too_precise = source_row(3, Decimal("1.1234567890123456789012"))
    with TestClient(create_app(settings)) as c:
        r = c.post("/v1/debezium", json=[envelope(row, 100 + i) for i, row in enumerate([*rows, too_precise])])
    assert r.status_code == 200, r.text
    # The value decimal(38,18) cannot hold lands whole: amount NULL, its text in amount__text.
    landed = [{**row, "amount__text": None} for row in rows]
    landed.append({**too_precise, "amount": None, "amount__text": "1.1234567890123456789012"})
    assert_applied_as_the_source(spark, settings, landed, (3, 0), amount__text="string")
    total = spark.sql(f"SELECT sum(balance) AS s FROM {settings.catalog_name}.{settings.namespace}.accounts").first()
    with localcontext() as ctx:
        ctx.prec = 100
        assert total is not None and total["s"] == sum(row["balance"] for row in landed)


@pytest.mark.parametrize(
    ("schema", "value", "kind", "want"),
    [
        (
            {"type": "int64", "name": "io.debezium.time.NanoTimestamp"},
            1_767_225_600_123_456_000,
            "timestamp_ntz",
            "2026-01-01T00:00:00.123456",
        ),
        (
            {"type": "int64", "name": "io.debezium.time.Timestamp"},
            1_767_225_600_123,
            "timestamp_ntz",
            "2026-01-01T00:00:00.123000",
        ),
        ({"type": "int32", "name": "org.apache.kafka.connect.data.Date"}, -1, "date", "1969-12-31"),
        ({"type": "int32", "name": "io.debezium.time.Time"}, 3_600_001, "bigint", 3_600_001_000),
        ({"type": "int64", "name": "io.debezium.time.NanoTime"}, 5_000, "bigint", 5),
        (
            {"type": "string", "name": "io.debezium.time.ZonedTimestamp"},
            "2026-01-01T02:00:00+02:00",
            "timestamp",
            "2026-01-01T00:00:00.000000+00:00",
        ),
        (
            {"type": "bytes", "name": DECIMAL, "parameters": {"scale": "2", "connect.decimal.precision": "40"}},
            unscaled(Decimal("-12.34"), 2),
            "string",
            "-12.34",
        ),
    ],
)
def test_each_logical_type_has_its_column_type_and_value(
    schema: dict[str, Any], value: Any, kind: str, want: Any
) -> None:
    found = debezium_types.field_type(schema)
    assert found is not None
    assert (found[0], found[1](value)) == (kind, want)


@pytest.mark.parametrize(
    ("schema", "value", "text"),
    [
        (
            {"type": "int64", "name": "io.debezium.time.NanoTimestamp"},
            1_767_225_600_123_456_789,
            "2026-01-01 00:00:00.123456789",
        ),
        # 10**9 days = 6844 Gregorian 400-year cycles of 146097 days, then 112132 days (2277-01-03)
        ({"type": "int32", "name": "io.debezium.time.Date"}, 10**9, "2739877-01-03"),
        ({"type": "int64", "name": "io.debezium.time.NanoTime"}, 5_001, "00:00:00.000005001"),
    ],
)
def test_what_a_column_type_cannot_hold_goes_whole_to_the_companion(
    schema: dict[str, Any], value: int, text: str
) -> None:
    found = debezium_types.field_type(schema)
    assert found is not None
    assert found[1](value) == Companion(text)


# ----------------------------------------------------------------------------- without a schema
# value.converter.schemas.enable=false with the recommended modes (decimal.handling.mode=string,
# time.precision.mode=isostring): the forms below are what a real Debezium Server 3.6 sent from
# PostgreSQL 15 and MariaDB (tests/e2e/test_debezium_server.py runs it); the table config's ``types``
# declare the columns.


def as_isostring(row: dict[str, Any]) -> dict[str, Any]:
    """The row as Debezium's JSON converter writes it without a schema, in the recommended modes."""
    at = row["at"]
    seconds, micros = divmod(at, 1_000_000)
    return {
        **row,
        "balance": format(row["balance"], "f"),
        "amount": format(row["amount"], "f"),
        "opened": f"{row['opened'].isoformat()}Z",
        "seen": row["seen"].strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        "seen_tz": row["seen_tz"].astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        "raw": base64.b64encode(row["raw"]).decode(),
        "at": f"{seconds // 3600:02}:{seconds // 60 % 60:02}:{seconds % 60:02}.{micros:06}Z",
    }


def flat(row: dict[str, Any], lsn: int) -> dict[str, Any]:
    return {
        "before": None,
        "after": as_isostring(row),
        "source": {
            "connector": "postgresql",
            "name": "pg",
            "ts_ms": 1,
            "table": "accounts",
            "lsn": lsn,
            "sequence": json.dumps([str(lsn), str(lsn)]),
        },
        "op": "c",
        "ts_ms": 1_767_225_600_000,
    }


def configured_settings(settings: Settings, tmp_path: Any, types: dict[str, str]) -> Settings:
    import dataclasses

    path = tmp_path / "tables.toml"
    path.write_text("[tables.accounts]\ntypes = { " + ", ".join(f'{c} = "{t}"' for c, t in types.items()) + " }\n")
    return dataclasses.replace(settings, table_config=path)


def test_without_a_schema_the_configured_types_declare_the_columns_and_convert_the_values() -> None:
    rules = {"accounts": WANT_TYPES}
    (ev,) = debezium.to_batch([flat(source_row(1, Decimal("2.50")), 100)], column_types=rules).events
    assert ev.columnTypes == WANT_TYPES
    assert ev.after is not None
    assert ev.after["opened"] == "2026-01-01"
    assert ev.after["seen"] == "2026-01-02T03:04:05.123456"
    assert ev.after["seen_tz"] == "2026-01-02T10:04:05.500000+00:00"
    assert ev.after["at"] == 3_600_000_001
    assert ev.after["balance"] == "12345678901234567890.0123456789"
    # The same row with its schema gives the same event: one table, whichever way Debezium sends.
    (with_schema,) = debezium.to_batch([envelope(source_row(1, Decimal("2.50")), 100)]).events
    assert {**with_schema.after, "amount": None} == {**ev.after, "amount": None}  # type: ignore[dict-item]
    # Without configured types nothing is declared; with a schema the configuration is not used.
    assert debezium.to_batch([flat(source_row(1, Decimal("2.50")), 100)]).events[0].columnTypes is None
    (typed_by_schema,) = debezium.to_batch(
        [envelope(source_row(1, Decimal("2.50")), 100)], column_types={"accounts": {"id": "string"}}
    ).events
    assert typed_by_schema.columnTypes == WANT_TYPES


@pytest.mark.parametrize(
    ("kind", "value", "says"),
    [
        ("decimal(38,10)", "/0GC", "decimal.handling.mode=string"),  # base64: precise mode, scale unknown
        ("timestamp_ntz", 1_767_225_600_123_456, "time.precision.mode=isostring"),  # ms? µs? unknown
        ("timestamp", "2026-01-01T00:00:00.123456789Z", "does not fit timestamp (microseconds)"),
        ("date", "yesterday", "time.precision.mode=isostring"),
    ],
)
def test_without_a_schema_an_ambiguous_value_is_text_saying_why(kind: str, value: Any, says: str) -> None:
    got = debezium_text.declared_converter(kind)(value)
    assert isinstance(got, str) and got.startswith(f"{value} (does not fit ") and says in got


@pytest.mark.parametrize(
    ("kind", "value", "text"),
    [
        ("decimal(5,2)", "1234.5", "1234.5"),
        ("decimal(5,2)", "1.234", "1.234"),
        ("decimal(5,2)", "NaN", "NaN"),
        ("decimal(38,18)", "-Infinity", "-Infinity"),
        ("date", "-0043-03-15Z", "-0043-03-15"),
    ],
)
def test_without_a_schema_a_valid_value_the_type_cannot_hold_goes_to_the_companion(
    kind: str, value: Any, text: str
) -> None:
    assert debezium_text.declared_converter(kind)(value) == Companion(text)


@pytest.mark.parametrize(
    ("kind", "value", "want"),
    [
        ("decimal(5,2)", "1.20000", "1.20000"),  # trailing zeros fit: Spark's cast keeps the value
        ("decimal(5,2)", 1.5, 1.5),  # decimal.handling.mode=double: a number the column casts
        ("date", 20_000, "2024-10-04"),  # days since 1970: the one integer form of a date
        ("timestamp", "2026-01-01T02:00:00+02:00", "2026-01-01T00:00:00.000000+00:00"),
        ("timestamp_ntz", "2026-01-01T00:00:00.100000000Z", "2026-01-01T00:00:00.100000"),
        ("bigint", "00:00:01.5Z", 1_500_000),
        ("bigint", 7, 7),
        ("array<date>", ["2024-02-29Z", None], ["2024-02-29", None]),
        ("string", {"a": 1}, {"a": 1}),
    ],
)
def test_without_a_schema_values_in_the_recommended_modes_convert(kind: str, value: Any, want: Any) -> None:
    assert debezium_text.declared_converter(kind)(value) == want


@pytest.mark.spark
def test_without_a_schema_iceberg_columns_have_the_configured_types_and_source_values(
    spark: Any, settings: Settings, tmp_path: Any
) -> None:
    """The twin of test_iceberg_columns_have_the_source_types_and_values, schema-less."""
    settings = configured_settings(settings, tmp_path, WANT_TYPES)
    rows = [source_row(1, Decimal("2.50")), source_row(2, Decimal("-0.000000000000000001"))]
    ambiguous = {**flat(source_row(3, Decimal("1")), 102)}
    ambiguous["after"] = {**ambiguous["after"], "seen": 1_767_225_600_123_456}  # adaptive mode's micros
    with TestClient(create_app(settings)) as c:
        r = c.post("/v1/debezium", json=[*(flat(row, 100 + i) for i, row in enumerate(rows)), ambiguous])
    assert r.status_code == 200, r.text
    assert_applied_as_the_source(spark, settings, rows)
    (q,) = spark.table(f"{settings.catalog_name}.{settings.namespace}.accounts__quarantine").collect()
    assert q["_cdc_row_id"] == "3" and "time.precision.mode=isostring" in q["_cdc_reason"]
