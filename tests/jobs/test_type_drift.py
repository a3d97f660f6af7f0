"""A table's Iceberg types are the source's whatever the mix of operations in a run (issue 29,
item 4): Spark's JSON inference types every integer ``bigint``, so an ``int`` column the source
declared read a later run's values as ``bigint`` and widened the table to ``long``. Widening
happens only where the source widened (its declared type changed). Debezium envelopes as
tests/jobs/test_column_defaults.py writes them; the apply is the real one."""

from __future__ import annotations

from typing import Any

import pytest

from cdclake.config.settings import Settings
from tests.jobs.test_column_defaults import envelope, post
from tests.support import apply_all

pytestmark = pytest.mark.spark

FIELDS: list[dict[str, Any]] = [
    {"field": "id", "type": "int32"},
    {"field": "n", "type": "int32", "optional": True},
    {"field": "s", "type": "int16", "optional": True},
    {"field": "f", "type": "float32", "optional": True},
    {"field": "body", "type": "string", "optional": True},
]
TYPES = {"id": "int", "n": "int", "s": "int", "f": "float", "body": "string"}


def delete(fields: list[dict[str, Any]], before: dict[str, Any], lsn: int) -> dict[str, Any]:
    e = envelope(fields, before, lsn, op="d")
    e["payload"] = {**e["payload"], "after": None, "before": before}
    return e


def schema(spark: Any, settings: Settings, table: str = "docs") -> dict[str, str]:
    df = spark.table(f"{settings.catalog_name}.{settings.namespace}.{table}")
    return {f.name: f.dataType.simpleString() for f in df.schema.fields if not f.name.startswith("_cdc_")}


def rows(spark: Any, settings: Settings, table: str = "docs") -> dict[int, tuple[Any, ...]]:
    df = spark.table(f"{settings.catalog_name}.{settings.namespace}.{table}")
    return {r["id"]: (r["n"], r["s"], r["f"], r["body"]) for r in df.collect()}


def test_inserts_then_updates_and_deletes_keep_the_declared_int_types(spark: Any, settings: Settings) -> None:
    post(
        settings, [envelope(FIELDS, {"id": i, "n": i * 10, "s": i, "f": 1.5, "body": "a"}, 100 + i) for i in (1, 2, 3)]
    )
    apply_all(spark, settings)
    assert schema(spark, settings) == TYPES
    post(
        settings,
        [
            envelope(FIELDS, {"id": 1, "n": 11, "s": 2, "f": 2.5, "body": "b"}, 200, op="u"),
            envelope(FIELDS, {"id": 4, "n": 40, "s": 4, "f": 0.5, "body": "c"}, 201),
            delete(FIELDS, {"id": 2, "n": 20, "s": 2, "f": 1.5, "body": "a"}, 202),
        ],
    )
    apply_all(spark, settings)
    assert schema(spark, settings) == TYPES  # no drift: the source still says int
    assert rows(spark, settings) == {1: (11, 2, 2.5, "b"), 3: (30, 3, 1.5, "a"), 4: (40, 4, 0.5, "c")}
    # A third run of updates only: still the source's types.
    post(settings, [envelope(FIELDS, {"id": 3, "n": 31, "s": 3, "f": 1.5, "body": "d"}, 300, op="u")])
    apply_all(spark, settings)
    assert schema(spark, settings) == TYPES


def test_a_column_widens_when_the_source_widened(spark: Any, settings: Settings) -> None:
    """``ALTER COLUMN n TYPE bigint``: the declared type changes, the table widens int -> long
    (Iceberg's promotion); a later value past int's range lands exactly."""
    post(settings, [envelope(FIELDS, {"id": 1, "n": 1, "s": 1, "f": 1.0, "body": "a"}, 100)])
    apply_all(spark, settings)
    wide = [{**f, "type": "int64"} if f["field"] == "n" else f for f in FIELDS]
    wide = [{**f, "type": "float64"} if f["field"] == "f" else f for f in wide]
    post(settings, [envelope(wide, {"id": 2, "n": 2**40, "s": 2, "f": 0.1, "body": "b"}, 200)])
    apply_all(spark, settings)
    assert schema(spark, settings) == {**TYPES, "n": "bigint", "f": "double"}
    assert rows(spark, settings)[2] == (2**40, 2, 0.1, "b")
