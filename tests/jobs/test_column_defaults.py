"""A column added in the source with a DEFAULT shows it for the rows that existed before (issue 14,
F5). Postgres' ``ALTER TABLE docs ADD COLUMN score int DEFAULT 0`` emits no event for existing
rows; Debezium's Connect schema carries ``"default": 0`` on the field in every later event. The
envelopes are written here from Debezium's documented encodings (tests/e2e/test_debezium_server.py
runs the real server); every expected value is written by hand."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import pytest
from starlette.testclient import TestClient

from cdclake.config.settings import Settings
from cdclake.contracts import events
from cdclake.debezium import envelope as debezium
from cdclake.lake.catalog import load_table
from receiver.app import create_app
from spark_jobs.backfill import PREFIX
from spark_jobs.system import MARK_CRASH, SimulatedCrash
from tests.support import apply_all, exact_values

DECIMAL = "org.apache.kafka.connect.data.Decimal"
BASE: list[dict[str, Any]] = [{"field": "id", "type": "int64"}, {"field": "body", "type": "string", "optional": True}]
SCORE = {"field": "score", "type": "int32", "optional": True, "default": 0}
# decimal(5,2) with DEFAULT 1.50: Debezium sends the unscaled 150 as big-endian two's complement, base64.
RATE = {
    "field": "rate",
    "type": "bytes",
    "optional": True,
    "name": DECIMAL,
    "parameters": {"scale": "2", "connect.decimal.precision": "5"},
    "default": "AJY=",
}
# Quotes, a statement, a backtick, a parameter marker, Spark's variable substitution (${...}).
HOSTILE = "it's'; DROP TABLE docs; -- `x` \\' :v0 ${x} ${env:HOME} $\\{y} \"q\""
NOTE_NAME = 'it\'s "note"; --'  # a lawful column name with quotes (no backtick, dot or control)
NOTE = {"field": NOTE_NAME, "type": "string", "optional": True, "default": HOSTILE}


def envelope(
    fields: list[dict[str, Any]], after: dict[str, Any], lsn: int, op: str = "c", table: str = "docs"
) -> dict[str, Any]:
    return exact_values.envelope(fields, after, lsn, op, table)


def post(settings: Settings, envelopes: list[dict[str, Any]]) -> None:
    with TestClient(create_app(settings)) as c:
        r = c.post("/v1/debezium", json=envelopes)
    assert r.status_code == 200, r.text


def lake(spark: Any, settings: Settings, *columns: str, table: str = "docs") -> dict[int, tuple[Any, ...]]:
    df = spark.table(f"{settings.catalog_name}.{settings.namespace}.{table}")
    return {r["id"]: tuple(r[c] for c in columns) for r in df.collect()}


def marks(settings: Settings, table: str = "docs") -> list[str]:
    t = load_table(settings, table)
    assert t is not None
    return [k for k in t.properties if k.startswith(PREFIX)]


BEFORE = [  # the table before the ALTER: ids 1, 2 in an earlier run
    envelope(BASE, {"id": 1, "body": "a"}, 100),
    envelope(BASE, {"id": 2, "body": "b"}, 101),
]
AFTER_FIELDS = [*BASE, SCORE, RATE]
SAME_RUN = [
    envelope(BASE, {"id": 3, "body": "c"}, 200),  # in the run that adds the column, from before the ALTER
    envelope(BASE, {"id": 1, "body": "a2"}, 201, op="u"),  # an update from before the ALTER too
    # after the ALTER: explicit values, and an explicit NULL (a nullable column with a default)
    envelope(AFTER_FIELDS, {"id": 4, "body": "d", "score": 5, "rate": "ASw="}, 300),  # rate 3.00
    envelope(AFTER_FIELDS, {"id": 5, "body": "e", "score": None, "rate": None}, 301),
]
WANT = {
    1: ("a2", 0, Decimal("1.50")),
    2: ("b", 0, Decimal("1.50")),
    3: ("c", 0, Decimal("1.50")),
    4: ("d", 5, Decimal("3.00")),
    5: ("e", None, None),
}


def test_the_door_carries_debezium_defaults_converted_like_values() -> None:
    batch = debezium.to_batch([SAME_RUN[2]])
    (ev,) = batch.events
    assert ev.columnDefaults == {"score": 0, "rate": "1.50"}
    assert ev.columnTypes == {"id": "bigint", "body": "string", "score": "int", "rate": "decimal(5,2)"}
    array_default = {"field": "tags", "type": "array", "items": {"type": "string"}, "default": ["x"]}
    (ev,) = debezium.to_batch([envelope([*BASE, array_default], {"id": 1, "tags": []}, 1)]).events
    assert ev.columnDefaults is None  # no scalar: nothing the apply could cast, and no 400 for Debezium


@pytest.mark.parametrize(
    ("defaults", "field", "why"),
    [
        ({"x": [1]}, "$.events[0].columnDefaults.x", "got an array"),
        ({"x": None}, "$.events[0].columnDefaults.x", "got null"),
        ({"x": {"a": 1}}, "$.events[0].columnDefaults.x", "got an object"),
        ({"a`b": 1}, '$.events[0].columnDefaults["a`b"]', "backtick"),
        ({"_cdc_x": 1}, "$.events[0].columnDefaults._cdc_x", "reserved"),
    ],
)
def test_the_door_refuses_a_default_that_is_no_scalar_or_has_an_unlawful_name(
    defaults: dict[str, Any], field: str, why: str
) -> None:
    ev = {"sequence": 1, "timestamp": 1, "operation": "INSERT", "table": "t", "rowId": "1", "after": {"x": 1}}
    body = events.encode({"source": "s", "sequenceNumber": 1, "events": [{**ev, "columnDefaults": defaults}]})
    with pytest.raises(events.InvalidBatch) as exc:
        events.decode_batch(body)
    assert exc.value.field == field and why in exc.value.message, exc.value.as_json()
    ok = events.decode_batch(
        events.encode(
            {
                "source": "s",
                "sequenceNumber": 1,
                "events": [{**ev, "columnDefaults": {"x": 1, "y": "t", "z": 1.5, "w": True}}],
            }
        )
    )
    staged = json.loads(events.stage_lines(ok)["t"])
    assert staged["columnDefaults"] == {"x": 1, "y": "t", "z": 1.5, "w": True}


@pytest.mark.spark
def test_rows_written_before_the_column_get_its_default_later_rows_keep_theirs(spark: Any, settings: Settings) -> None:
    post(settings, BEFORE)
    apply_all(spark, settings)
    post(settings, SAME_RUN)
    (result,) = apply_all(spark, settings)
    assert lake(spark, settings, "body", "score", "rate") == WANT
    assert result["defaults_filled"] == ["rate", "score"], result
    assert marks(settings) == []
    # A later run that adds nothing changes nothing (the fill is not repeated).
    post(settings, [envelope(AFTER_FIELDS, {"id": 6, "body": "f", "score": None, "rate": None}, 400)])
    (again,) = apply_all(spark, settings)
    assert "defaults_filled" not in again
    assert lake(spark, settings, "body", "score", "rate") == {**WANT, 6: ("f", None, None)}


@pytest.mark.spark
def test_a_table_created_in_the_run_of_the_alter_fills_the_rows_before_it(spark: Any, settings: Settings) -> None:
    """The snapshot and the stream after the ALTER in one first run (what Debezium Server sends).
    A table created by a run whose events all have the column (``fresh``) needs no fill."""
    fresh = [
        envelope(AFTER_FIELDS, {"id": 7, "body": "g", "score": 8, "rate": None}, 500, table="fresh"),
        envelope(AFTER_FIELDS, {"id": 8, "body": "h", "score": None, "rate": "ASw="}, 501, table="fresh"),
    ]
    post(settings, [*BEFORE, *SAME_RUN, *fresh])
    results = {r["table"]: r for r in apply_all(spark, settings)}
    assert lake(spark, settings, "body", "score", "rate") == WANT
    assert results["docs"]["defaults_filled"] == ["rate", "score"]
    assert "defaults_filled" not in results["fresh"] and marks(settings, "fresh") == []
    assert lake(spark, settings, "score", "rate", table="fresh") == {7: (8, None), 8: (None, Decimal("3.00"))}


@pytest.mark.spark
@pytest.mark.parametrize("point", [MARK_CRASH, "after-commit"])
def test_a_crash_between_the_mark_and_the_column_or_the_merge_and_the_fill_still_fills(
    spark: Any, settings: Settings, point: str
) -> None:
    post(settings, BEFORE)
    apply_all(spark, settings)
    post(settings, SAME_RUN)
    with pytest.raises(SimulatedCrash):
        apply_all(spark, settings, crash_at=point)
    assert sorted(marks(settings)) == [PREFIX + "rate", PREFIX + "score"]
    columns = set(spark.table(f"{settings.catalog_name}.{settings.namespace}.docs").columns)
    assert ("score" in columns) == (point == "after-commit")
    apply_all(spark, settings)
    assert lake(spark, settings, "body", "score", "rate") == WANT
    assert marks(settings) == []


@pytest.mark.spark
def test_a_hostile_default_lands_as_data(spark: Any, settings: Settings) -> None:
    post(settings, BEFORE)
    apply_all(spark, settings)
    post(settings, [envelope([*BASE, NOTE], {"id": 3, "body": "c", NOTE_NAME: "mine"}, 200)])
    (result,) = apply_all(spark, settings)
    assert lake(spark, settings, "body", NOTE_NAME) == {1: ("a", HOSTILE), 2: ("b", HOSTILE), 3: ("c", "mine")}
    assert result["defaults_filled"] == [NOTE_NAME]
