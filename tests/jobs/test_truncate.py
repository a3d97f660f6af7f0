"""TRUNCATE through the real apply (issue 29, item 5): every row of the table goes at the
TRUNCATE's position; events ordered before it are gone (in its batch and in later ones), events
after it apply to the emptied table; ``__changes`` records it and the change feed serves it.
Each expectation is also the independent reference model's (cdclake/dev/reference.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from starlette.testclient import TestClient

from cdclake.config.settings import Settings
from cdclake.contracts import events
from cdclake.debezium import envelope as debezium
from cdclake.dev.reference import diff, expected_runs
from cdclake.lake.changes import read_changes
from cdclake.lake.spark import table_ident
from cdclake.query.statements import history_sql
from receiver.app import create_app
from spark_jobs.system import CRASH_POINTS, SimulatedCrash
from tests.jobs.test_semantics import batch, ev, rows
from tests.support import apply_all, stage

pytestmark = pytest.mark.spark


def truncate(seq: int, table: str = "t") -> dict[str, Any]:
    return {
        "sequence": seq,
        "timestamp": 1_767_225_600_000 + seq,
        "operation": "TRUNCATE",
        "table": table,
        "rowId": events.TRUNCATE_ROW_ID,
    }


def run(spark: Any, settings: Settings, runs: list[list[dict[str, Any]]]) -> None:
    """Each run's batches staged and applied; after each, the table is the reference model's."""
    for i, batches in enumerate(runs):
        stage(settings, batches)
        apply_all(spark, settings)
        want = expected_runs(runs[: i + 1]).tables.get("t", {})
        got = rows(spark, settings)
        assert not diff(want, got), (i, diff(want, got))


def test_truncate_in_the_middle_of_a_batch(spark: Any, settings: Settings) -> None:
    run(spark, settings, [[batch(1, *[ev(i, "INSERT", str(i), {"id": i, "v": i}) for i in (1, 2, 3)])]])
    run_two = [
        batch(
            2,
            ev(4, "UPDATE", "1", {"id": 1, "v": 10}),  # before the TRUNCATE: gone
            ev(5, "INSERT", "4", {"id": 4, "v": 4}),  # before: gone
            truncate(6),
            ev(7, "INSERT", "2", {"id": 2, "v": 20}),  # a re-insert after it
            ev(8, "INSERT", "5", {"id": 5, "v": 5}),
            ev(9, "UPDATE", "5", {"id": 5, "v": 50}),
        )
    ]
    stage(settings, run_two)
    (result,) = apply_all(spark, settings)
    assert rows(spark, settings) == {"2": {"id": 2, "v": 20}, "5": {"id": 5, "v": 50}}
    assert not diff(
        expected_runs([[batch(1, *[ev(i, "INSERT", str(i), {"id": i, "v": i}) for i in (1, 2, 3)])], run_two]).tables[
            "t"
        ],
        rows(spark, settings),
    )
    assert result["applied"] == 3 and result["superseded"] == 3, result  # the truncate, 2 and 5; 4, 5, 8
    log = spark.table(table_ident(settings, "t__changes")).where("_cdc_operation = 'TRUNCATE'").collect()
    assert [(r["_cdc_row_id"], r["_cdc_outcome"], list(r["_cdc_order"])) for r in log] == [("*", "applied", [6])]
    history = spark.sql(history_sql(settings.catalog_name, settings.namespace, "t")).where(
        "_cdc_operation = 'TRUNCATE'"
    )
    assert [(r["_cdc_row_id"], r["_cdc_is_current"]) for r in history.collect()] == [("*", False)]
    feed = read_changes(settings, "t", None, ["TRUNCATE", "INSERT", "UPDATE"], 100)
    assert [(c.operation, c.key, c.after) for c in feed if c.order[0] >= 6] == [
        ("TRUNCATE", "*", None),
        ("INSERT", "2", {"id": 2, "v": 20}),
        ("UPDATE", "5", {"id": 5, "v": 50}),  # its INSERT superseded in the run
    ]


def test_truncate_across_batches_and_runs_and_late_events(spark: Any, settings: Settings) -> None:
    run(
        spark,
        settings,
        [
            [batch(1, *[ev(i, "INSERT", str(i), {"id": i, "v": i}) for i in (1, 2, 3)])],
            # the TRUNCATE alone in one batch, the re-inserts in the next, one run
            [
                batch(2, ev(10, "UPDATE", "3", {"id": 3, "v": 30}), truncate(20)),
                batch(3, ev(21, "INSERT", "1", {"id": 1, "v": 100})),
            ],
            # a later run: an event ordered before the TRUNCATE (late) and one after it
            [batch(4, ev(15, "INSERT", "9", {"id": 9, "v": 9}), ev(22, "INSERT", "7", {"id": 7, "v": 7}))],
            # a second TRUNCATE, then nothing: the table is empty
            [batch(5, truncate(30))],
            [batch(6, ev(31, "INSERT", "1", {"id": 1, "v": 1}))],
        ],
    )
    assert rows(spark, settings) == {"1": {"id": 1, "v": 1}}


def test_debezium_truncate_lands_as_a_truncate(spark: Any, settings: Settings) -> None:
    """Debezium's op ``t`` (PostgreSQL pgoutput, with skipped.operations=none): no images, the
    table in ``source``; the receiver takes it and the apply empties the table."""

    def pg(op: str, after: dict[str, Any] | None, lsn: int) -> dict[str, Any]:
        source = {
            "connector": "postgresql",
            "name": "pg",
            "ts_ms": 1,
            "table": "t",
            "schema": "public",
            "lsn": lsn,
            "sequence": json.dumps([str(lsn), str(lsn)]),
        }
        return {"before": None, "after": after, "source": source, "op": op, "ts_ms": 1_767_225_600_000 + lsn}

    posts = [[pg("c", {"id": 1}, 10), pg("c", {"id": 2}, 11)], [pg("t", None, 12), pg("c", {"id": 3}, 13)]]
    with TestClient(create_app(settings)) as c:
        for body in posts:
            r = c.post("/v1/debezium", json=body)
            assert r.status_code == 200, r.text
    (t,) = [e for e in debezium.to_batch(posts[1]).events if e.operation == "TRUNCATE"]
    assert (t.rowId, t.before, t.after, t.order) == ("*", None, None, [12, 12])
    apply_all(spark, settings)
    assert rows(spark, settings) == {"3": {"id": 3}}


@pytest.mark.parametrize("point", CRASH_POINTS)
def test_a_crash_at_any_point_of_a_run_with_a_truncate_then_the_rerun(
    spark: Any, settings: Settings, point: str
) -> None:
    first = [batch(1, *[ev(i, "INSERT", str(i), {"id": i, "v": i}) for i in (1, 2, 3)])]
    second = [batch(2, ev(4, "UPDATE", "1", {"id": 1, "v": 10}), truncate(6), ev(7, "INSERT", "2", {"id": 2, "v": 20}))]
    stage(settings, first)
    apply_all(spark, settings)
    stage(settings, second)
    with pytest.raises(SimulatedCrash):
        apply_all(spark, settings, crash_at=point)
    (result,) = apply_all(spark, settings)
    assert rows(spark, settings) == expected_runs([first, second]).tables["t"] == {"2": {"id": 2, "v": 20}}
    log = spark.table(table_ident(settings, "t__changes")).where("_cdc_operation = 'TRUNCATE'").collect()
    assert [r["_cdc_outcome"] for r in log] == ["applied"], (point, result)
