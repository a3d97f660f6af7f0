"""Issue 29 (part A): every source value lands exactly. Hand-written envelopes in the forms a real
Debezium Server 3.6 sent (tests/support/exact_values.py) through the receiver's conversion; the
generated configuration's modes; docs/debezium.md's type table against the code's."""

from __future__ import annotations

import base64
import math
from pathlib import Path
from typing import Any

import pytest

from cdclake.contracts.coltypes import Companion
from cdclake.debezium import config as debezium_config
from cdclake.debezium import connect_types as debezium_types
from cdclake.debezium import envelope as debezium
from cdclake.debezium import source_types
from cdclake.debezium.discover import mysql_type, postgres_type
from cdclake.dev.reference_types import fit
from tests.support.exact_values import BC_44_MARCH_15, PI_50, pg_envelope, pg_row


def one(after: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    (ev,) = debezium.to_batch([pg_envelope(after, 100)]).events
    assert ev.after is not None and ev.columnTypes is not None
    return ev.after, ev.columnTypes


def test_numerics_sent_as_text_keep_their_declared_decimal_types() -> None:
    after, types = one(pg_row(1))
    assert (types["n"], types["n2"], types["n50"]) == ("decimal(38,18)", "decimal(20,6)", "string")
    assert types["na"] == "array<decimal(38,18)>"
    assert (after["n"], after["n2"], after["n50"], after["na"]) == ("1", "1.000000", "1.0000000000", ["1.5", None])
    assert not any(k.endswith("__text") for k in after)  # nothing to add where every value fits


@pytest.mark.parametrize(
    ("column", "sent", "text"),
    [
        ("n", "NAN", "NaN"),  # Debezium's spelling of a numeric NaN; PostgreSQL's in the lake
        ("n2", "NAN", "NaN"),
        ("n", "Infinity", "Infinity"),
        ("n2", "-Infinity", "-Infinity"),
        ("n", "POSITIVE_INFINITY", "Infinity"),  # what Debezium 3.6's string mode sends (type matrix)
        ("n2", "NEGATIVE_INFINITY", "-Infinity"),
        ("n", PI_50, PI_50),  # 50 fractional digits: more than decimal(38,18)'s 18
        ("n", "0.00000000000000000001", "0.00000000000000000001"),  # 1e-20
        ("n", "123456789012345678901234.5", "123456789012345678901234.5"),  # 24 integer digits
    ],
)
def test_a_numeric_its_decimal_cannot_hold_is_null_with_its_text_beside(column: str, sent: str, text: str) -> None:
    after, types = one(pg_row(1, **{column: sent}))
    assert (after[column], after[f"{column}__text"]) == (None, text)
    assert types[f"{column}__text"] == "string"


def test_a_numeric_array_with_an_element_its_type_cannot_hold_lands_whole_as_text() -> None:
    after, _ = one(pg_row(1, na=["1.5", None, PI_50]))
    assert (after["na"], after["na__text"]) == (None, f'["1.5",null,"{PI_50}"]')


def test_a_double_nan_and_infinities_pass_as_the_strings_spark_reads_into_a_double() -> None:
    after, types = one(pg_row(1, d="NaN", r="-Infinity"))
    assert (after["d"], after["r"], types["d"], types["r"]) == ("NaN", "-Infinity", "double", "float")
    # What the apply promises (the reference model): those strings fit a double column.
    assert math.isnan(fit("NaN", "double")[0]) and fit("-Infinity", "double") == (float("-inf"), True)
    assert fit("nan", "double") == (None, False)  # any other string is still refused


@pytest.mark.parametrize(
    ("days", "text"),
    [
        (BC_44_MARCH_15, "0044-03-15 BC"),
        (BC_44_MARCH_15 - 1, "0044-03-14 BC"),
        # 5874897-12-31, PostgreSQL's last date: Debezium sent 2145042905
        (2145042905, "5874897-12-31"),
    ],
)
def test_a_date_outside_years_1_to_9999_is_null_with_its_postgres_text_beside(days: int, text: str) -> None:
    after, _ = one(pg_row(1, dt=days))
    assert (after["dt"], after["dt__text"]) == (None, text)


@pytest.mark.parametrize(
    ("sent", "text"),
    [
        ("0000-01-01T00:00:00.000000Z", "0000-01-01T00:00:00.000000Z"),  # 1 BC, as Debezium sent it
        ("infinity", "infinity"),
        ("-infinity", "-infinity"),
    ],
)
def test_a_zoned_timestamp_outside_years_1_to_9999_goes_to_the_companion(sent: str, text: str) -> None:
    convert = debezium_types.field_type({"type": "string", "name": "io.debezium.time.ZonedTimestamp"})
    assert convert is not None and convert[1](sent) == Companion(text)


def test_an_interval_is_its_iso_text() -> None:
    after, types = one(pg_row(1, iv="P1000000Y0M0DT0H0M0S"))
    assert (types["iv"], after["iv"]) == ("string", "P1000000Y0M0DT0H0M0S")


def unsigned_envelope(value: int) -> dict[str, Any]:
    """MariaDB's BIGINT UNSIGNED key under bigint.unsigned.handling.mode=precise, as sent."""
    field = {
        "type": "bytes",
        "optional": False,
        "name": "org.apache.kafka.connect.data.Decimal",
        "version": 1,
        "parameters": {"scale": "0", "connect.decimal.precision": "20"},
        "field": "id",
    }
    raw = base64.b64encode(value.to_bytes((value.bit_length() + 8) // 8, "big", signed=True)).decode()
    schema = {"type": "struct", "fields": [{"field": "after", "type": "struct", "fields": [field]}]}
    source = {"connector": "mariadb", "name": "my", "table": "u", "file": "binlog.000002", "pos": 4, "row": 0}
    payload = {"before": None, "after": {"id": raw}, "source": source, "op": "c", "ts_ms": 1}
    return {"schema": schema, "payload": payload}


@pytest.mark.parametrize("value", [0, 2**63 - 1, 2**63, 2**64 - 1])
def test_a_bigint_unsigned_key_is_its_integer_never_wrapped(value: int) -> None:
    (ev,) = debezium.to_batch([unsigned_envelope(value)]).events
    assert ev.rowId == str(value)  # the key as under long mode (below 2**63) and without a schema
    assert ev.after == {"id": str(value)} and ev.columnTypes == {"id": "decimal(20,0)"}


@pytest.mark.parametrize("schemas", [True, False])
def test_the_generated_configuration_chooses_the_exact_modes(schemas: bool) -> None:
    db = debezium_config.Database("mariadb", "127.0.0.1", 3306, "dbz", "pw", "shop", ("shop.t",))
    props = debezium_config.properties(
        db, debezium_config.Sink("http://127.0.0.1:8090", schemas=schemas), name="shop", state_dir=Path("/s")
    )
    assert props["debezium.source.decimal.handling.mode"] == "string"
    assert props["debezium.source.column.propagate.source.type"] == ".*"
    assert props["debezium.source.bigint.unsigned.handling.mode"] == "precise"
    assert props["debezium.source.interval.handling.mode"] == "string"
    assert props["debezium.source.skipped.operations"] == "none"  # TRUNCATE sent (docs/debezium.md, "TRUNCATE")
    if not schemas:  # BIGINT UNSIGNED as a JSON number: base64 has no meaning without the schema
        assert props["debezium.format.value.decimal.format"] == "NUMERIC"


def test_discovery_types_what_the_modes_send() -> None:
    assert mysql_type("bigint", "bigint(20) unsigned", 20, 0) == "decimal(20,0)"
    assert mysql_type("bigint", "bigint(20)", 19, 0) == "bigint"
    assert postgres_type("interval", -1) == "string"
    assert postgres_type("money", -1) == "decimal(38,2)"


def test_the_readme_carries_the_type_table_of_the_code() -> None:
    readme = (Path(__file__).parents[2] / "docs" / "debezium.md").read_text(encoding="utf-8")
    assert source_types.markdown() in readme, "docs/debezium.md's type table differs: paste source_types.markdown()"


@pytest.mark.parametrize(
    ("sent", "text"),
    [(-2147472692, "infinity"), (-2147472691, "-infinity"), (-622191234, "infinity"), (-625821272, "-infinity")],
)
def test_postgres_date_infinities_land_as_their_names_not_as_dates(sent: int, text: str) -> None:
    """Debezium's sentinel day counts (streamed, and from the snapshot) for 'infinity' and
    '-infinity': no date has them (PostgreSQL's start in 4714 BC)."""
    after, _ = one(pg_row(1, dt=sent))
    assert (after["dt"], after["dt__text"]) == (None, text)


@pytest.mark.parametrize(("sent", "text"), [(9223372036825200000, "infinity"), (-9223372036832400000, "-infinity")])
def test_postgres_timestamp_infinities_land_as_their_names(sent: int, text: str) -> None:
    convert = debezium_types.field_type({"type": "int64", "name": "io.debezium.time.MicroTimestamp"})
    assert convert is not None
    assert convert[1](sent) == Companion(text)


def test_bits_land_most_significant_byte_first() -> None:
    """Debezium sends a BIT(64)'s bytes least significant first; the source (and PyMySQL) holds
    b'\\x00...\\x01' for 1."""
    kind, convert = debezium_types.field_type({"type": "bytes", "name": "io.debezium.data.Bits"}) or ("", None)
    assert kind == "binary" and convert is not None
    sent = base64.b64encode(bytes([1, 0, 0, 0, 0, 0, 0, 0])).decode()
    assert base64.b64decode(convert(sent)) == bytes([0, 0, 0, 0, 0, 0, 0, 1])


def test_the_time_adjuster_is_off_so_year_1_stays_year_1() -> None:
    db = debezium_config.Database("mariadb", "127.0.0.1", 3306, "dbz", "pw", "shop", ("shop.t",))
    props = debezium_config.properties(
        db, debezium_config.Sink("http://127.0.0.1:8090"), name="shop", state_dir=Path("/s")
    )
    assert props["debezium.source.enable.time.adjuster"] == "false"
