"""What a Debezium-fed table does for each kind of source DDL (issue 29, item 6; docs/debezium.md "Source
DDL"). Debezium sends no DDL to the sink: a change shows only in the Connect schema of the row
events after it. Pinned here through the real apply, with envelopes as
tests/jobs/test_column_defaults.py writes them:

* DROP COLUMN: the lake keeps the column (Iceberg never drops one on its own); rows written after
  the drop hold NULL there, rows no event touched since keep their last value.
* RENAME COLUMN: a new column of the new name (its declared type); the old one stays as for DROP.
* A widening type change (int -> bigint, float -> double, a decimal's precision up): the column
  widens (tests/jobs/test_type_drift.py).
* Any other type change (int -> text): the column keeps its type and the run's values are read as
  text: one that is exactly a value of the column's type (its text is that value's one spelling)
  lands typed, any other lands as NULL with its exact text in ``<column>__text`` (docs/debezium.md "Source
  types"): nothing quarantined. Also through a producer's own batches declaring ``columnTypes``,
  checked against the reference model (cdclake/dev/reference.py).
* A value that does not fit while the declared type is the table's is wrong: still quarantined."""

from __future__ import annotations

from typing import Any

import pytest

from cdclake.config.settings import Settings
from cdclake.dev.reference import diff, expected_runs
from cdclake.lake.spark import table_ident
from tests.jobs.test_column_defaults import envelope, post
from tests.jobs.test_semantics import batch, ev, rows
from tests.jobs.test_type_drift import schema
from tests.support import apply_all, stage

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


def test_a_type_change_that_is_no_widening_keeps_the_type_and_every_value(spark: Any, settings: Settings) -> None:
    post(settings, [envelope([ID, A], {"id": 1, "a": 1}, 101)])
    apply_all(spark, settings)
    # ALTER TABLE docs ALTER COLUMN a TYPE text
    text = {**A, "type": "string"}
    post(
        settings,
        [envelope([ID, text], {"id": 2, "a": "x"}, 200), envelope([ID, text], {"id": 1, "a": "5"}, 201, op="u")],
    )
    (result,) = apply_all(spark, settings)
    assert result["quarantined"] == 0, result
    assert schema(spark, settings) == {"id": "bigint", "a": "int", "a__text": "string"}
    assert lake(spark, settings) == {1: {"a": 5, "a__text": None}, 2: {"a": None, "a__text": "x"}}
    assert quarantined(spark, settings) == []


def declares(types: dict[str, str], e: dict[str, Any]) -> dict[str, Any]:
    return {**e, "columnTypes": types}


def test_values_of_a_retyped_column_land_typed_or_as_their_text_as_the_reference_says(
    spark: Any, settings: Settings
) -> None:
    """An int column; a run declaring it ``string`` (the source's ALTER ... TYPE text): '7' is an
    int, '007' and 'abc' are not (their text is no int's one spelling): every row lands, none is
    quarantined. A later run declaring int again: updates with ints clear the companion; a string
    in an int column declared int is a wrong value again, quarantined."""
    ints, texts = {"id": "bigint", "a": "int"}, {"id": "bigint", "a": "string"}
    runs = [
        [batch(1, *[declares(ints, ev(i, "INSERT", str(i), {"id": i, "a": i})) for i in (1, 2)])],
        [
            batch(
                2,
                declares(texts, ev(3, "INSERT", "3", {"id": 3, "a": "7"})),
                declares(texts, ev(4, "INSERT", "4", {"id": 4, "a": "007"})),
                declares(texts, ev(5, "UPDATE", "1", {"id": 1, "a": "abc"})),
                declares(texts, ev(6, "INSERT", "5", {"id": 5, "a": None})),
            )
        ],
        [
            batch(
                3,
                declares(ints, ev(7, "UPDATE", "1", {"id": 1, "a": 10})),
                declares(ints, ev(8, "UPDATE", "4", {"id": 4, "a": 7})),
                declares(ints, ev(9, "INSERT", "6", {"id": 6, "a": "x"})),  # wrong: quarantined
            )
        ],
    ]
    wanted = [
        {"1": (1, None), "2": (2, None)},
        {"1": (None, "abc"), "2": (2, None), "3": (7, None), "4": (None, "007"), "5": (None, None)},
        {"1": (10, None), "2": (2, None), "3": (7, None), "4": (7, None), "5": (None, None)},
    ]
    quarantines = [0, 0, 1]
    for i, (run, want, held) in enumerate(zip(runs, wanted, quarantines, strict=True)):
        stage(settings, run)
        (result,) = apply_all(spark, settings)
        assert result["quarantined"] == held, (i, result)
        got = rows(spark, settings)
        assert {k: (r["a"], r.get("a__text")) for k, r in got.items()} == want, i
        model = expected_runs(runs[: i + 1])
        assert not diff(model.tables["t"], got), (i, diff(model.tables["t"], got))
        assert schema(spark, settings, "t") == {
            c: {"bigint": "bigint", "int": "int", "string": "string"}[t] for c, t in model.types["t"].items()
        }, i
        assert len(model.quarantined["t"]) == sum(quarantines[: i + 1])
    assert schema(spark, settings, "t") == {"id": "bigint", "a": "int", "a__text": "string"}
    log = spark.table(table_ident(settings, "t__quarantine")).collect()
    assert [(r["_cdc_row_id"], r["_cdc_reason"]) for r in log] == [("6", 'column a: string "x" does not fit int')]


def test_a_run_spanning_the_type_change_and_a_wrong_value_beside_a_retyped_one(spark: Any, settings: Settings) -> None:
    """One run with events from before the ALTER (``a`` declared int) and after it (``a``
    declared string): ``a`` is read as text for the whole run, and its ints land typed. An event
    whose other column is wrong (``b``, declared int, is ``"zz"``) is still quarantined, for
    ``b`` only; the others with it land, as the reference model says."""
    ints = {"id": "bigint", "a": "int", "b": "int"}
    texts = {**ints, "a": "string"}
    runs = [
        [batch(1, *[declares(ints, ev(i, "INSERT", str(i), {"id": i, "a": i, "b": i})) for i in (1, 2)])],
        [
            batch(
                2,
                declares(ints, ev(3, "UPDATE", "1", {"id": 1, "a": 5, "b": 1})),
                declares(texts, ev(4, "INSERT", "3", {"id": 3, "a": "abc", "b": 3})),
                declares(texts, ev(5, "INSERT", "4", {"id": 4, "a": "x", "b": "zz"})),
                declares(texts, ev(6, "UPDATE", "2", {"id": 2, "a": "007", "b": 2})),
            )
        ],
    ]
    for i, run in enumerate(runs):
        stage(settings, run)
        apply_all(spark, settings)
        model = expected_runs(runs[: i + 1])
        assert not diff(model.tables["t"], rows(spark, settings)), (i, diff(model.tables["t"], rows(spark, settings)))
    got = {k: (r["a"], r["a__text"], r["b"]) for k, r in rows(spark, settings).items()}
    assert got == {"1": (5, None, 1), "2": (None, "007", 2), "3": (None, "abc", 3)}
    log = spark.table(table_ident(settings, "t__quarantine")).collect()
    assert [(r["_cdc_row_id"], r["_cdc_reason"]) for r in log] == [("4", 'column b: string "zz" does not fit int')]
