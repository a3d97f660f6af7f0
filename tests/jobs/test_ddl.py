"""What a Debezium-fed table does for each kind of source DDL (issue 29, item 6; README "Source
DDL"). Debezium sends no DDL to the sink: a change shows only in the Connect schema of the row
events after it. Pinned here through the real apply, with envelopes as
tests/jobs/test_column_defaults.py writes them:

* DROP COLUMN: the lake keeps the column (Iceberg never drops one on its own); rows written after
  the drop hold NULL there, rows no event touched since keep their last value.
* RENAME COLUMN: a new column of the new name (its declared type); the old one stays as for DROP.
* A widening type change (int -> bigint, float -> double, a decimal's precision up): the column
  widens (tests/jobs/test_type_drift.py).
* Any other type change: the column keeps its type; a value that converts to it lands, one that
  does not quarantines its event with the reason, as any value that does not fit its column."""

from __future__ import annotations

from typing import Any

import pytest

from cdclake.config.settings import Settings
from cdclake.lake.spark import table_ident
from tests.jobs.test_column_defaults import envelope, post
from tests.jobs.test_type_drift import schema
from tests.support import apply_all

pytestmark = pytest.mark.spark

ID = {"field": "id", "type": "int64"}
A = {"field": "a", "type": "int32", "optional": True}
B = {"field": "b", "type": "string", "optional": True}


def lake(spark: Any, settings: Settings) -> dict[int, dict[str, Any]]:
    df = spark.table(table_ident(settings, "docs"))
    return {
        r["id"]: {k: v for k, v in r.asDict().items() if not k.startswith("_cdc_") and k != "id"} for r in df.collect()
    }


def quarantined(spark: Any, settings: Settings) -> list[tuple[str, str]]:
    df = spark.table(table_ident(settings, "docs__quarantine"))
    return sorted((r["_cdc_row_id"], r["_cdc_reason"]) for r in df.collect())


def test_drop_column_keeps_the_column_null_in_rows_written_after_it(spark: Any, settings: Settings) -> None:
    post(settings, [envelope([ID, A, B], {"id": i, "a": i, "b": f"b{i}"}, 100 + i) for i in (1, 2)])
    apply_all(spark, settings)
    # ALTER TABLE docs DROP COLUMN a: later events have no field a
    post(settings, [envelope([ID, B], {"id": 1, "b": "new"}, 200, op="u"), envelope([ID, B], {"id": 3, "b": "c"}, 201)])
    apply_all(spark, settings)
    assert schema(spark, settings) == {"id": "bigint", "a": "int", "b": "string"}
    assert lake(spark, settings) == {
        1: {"a": None, "b": "new"},  # written after the drop
        2: {"a": 2, "b": "b2"},  # untouched: its value from before the drop
        3: {"a": None, "b": "c"},
    }


def test_rename_column_adds_the_new_name_and_keeps_the_old(spark: Any, settings: Settings) -> None:
    post(settings, [envelope([ID, A], {"id": i, "a": i}, 100 + i) for i in (1, 2)])
    apply_all(spark, settings)
    # ALTER TABLE docs RENAME COLUMN a TO c
    c = {**A, "field": "c"}
    post(settings, [envelope([ID, c], {"id": 1, "c": 10}, 200, op="u")])
    apply_all(spark, settings)
    assert schema(spark, settings) == {"id": "bigint", "a": "int", "c": "int"}
    assert lake(spark, settings) == {1: {"a": None, "c": 10}, 2: {"a": 2, "c": None}}


def test_a_type_change_that_is_no_widening_keeps_the_type(spark: Any, settings: Settings) -> None:
    post(settings, [envelope([ID, A], {"id": 1, "a": 1}, 101)])
    apply_all(spark, settings)
    # ALTER TABLE docs ALTER COLUMN a TYPE text
    text = {**A, "type": "string"}
    post(
        settings,
        [envelope([ID, text], {"id": 2, "a": "x"}, 200), envelope([ID, text], {"id": 1, "a": "5"}, 201, op="u")],
    )
    apply_all(spark, settings)
    assert schema(spark, settings) == {"id": "bigint", "a": "int"}
    assert lake(spark, settings) == {1: {"a": 1}}  # neither text value is an int: both events held back
    got = quarantined(spark, settings)
    assert [k for k, _ in got] == ["1", "2"] and all("a" in why for _, why in got), got
