"""The consistent publish (spark_jobs.apply.apply_together, cdclake.lake.selection): tables that
share a source's transactions are applied in one run and published in ONE catalog commit, whole
transactions only, every published snapshot carrying the source position; with the setting off,
each table alone shows the half transaction (what the feature prevents). Rows against the
reference model (cdclake.dev.reference)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from cdclake.config.settings import Settings
from cdclake.contracts.watermark import positions_of
from cdclake.dev.reference import diff, expected_tables
from cdclake.lake.catalog import load_table
from cdclake.lake.publish import publish_tables
from cdclake.lake.spark import table_ident
from spark_jobs.apply import apply_table, apply_together
from tests.support import stage, table_rows

pytestmark = pytest.mark.spark


def ev(seq: int, table: str, key: str, after: dict[str, Any], tx: str | None = None) -> dict[str, Any]:
    e: dict[str, Any] = {
        "sequence": seq,
        "timestamp": 1_767_225_600_000 + seq,
        "operation": "INSERT",
        "table": table,
        "rowId": key,
        "after": after,
    }
    return {**e, "transaction": {"id": tx}} if tx else e


def end(tx: str, tables: dict[str, int], position: str) -> dict[str, Any]:
    return {"id": tx, "status": "END", "eventCount": sum(tables.values()), "tables": tables, "position": position}


# tx1 whole in one batch; tx2's END and its orders event land first, its line later.
TX1 = {
    "source": "pg",
    "sequenceNumber": 1,
    "events": [
        ev(1, "orders", "o1", {"total": 5}, "tx1"),
        ev(2, "lines", "l1", {"order_id": "o1", "amount": 5}, "tx1"),
    ],
    "transactions": [{"id": "tx1", "status": "BEGIN"}, end("tx1", {"orders": 1, "lines": 1}, "100")],
}
TX2_HALF = {
    "source": "pg",
    "sequenceNumber": 2,
    "events": [ev(3, "orders", "o2", {"total": 7}, "tx2")],
    "transactions": [{"id": "tx2", "status": "BEGIN"}, end("tx2", {"orders": 1, "lines": 1}, "200")],
}
TX2_REST = {
    "source": "pg",
    "sequenceNumber": 3,
    "events": [ev(4, "lines", "l2", {"order_id": "o2", "amount": 7}, "tx2")],
}
ALL_TABLES = [t + s for t in ("lines", "orders") for s in ("", "__changes", "__quarantine", "__tombstones")]


def keys(spark: Any, settings: Settings, table: str) -> set[str]:
    return set(table_rows(spark, table_ident(settings, table)))


def test_a_transaction_is_published_in_all_its_tables_at_once_and_only_when_whole(
    spark: Any, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    publishes: list[list[str]] = []

    def counted(s: Settings, moves: Any) -> Any:
        publishes.append(sorted(moves))
        return publish_tables(s, moves)

    monkeypatch.setattr("spark_jobs.stage.publish_tables", counted)
    stage(settings, [TX1, TX2_HALF])
    results = apply_together(spark, settings, ["orders"], 10_000)  # the unit brings lines
    assert sorted(r["table"] for r in results) == ["lines", "orders"]
    assert len(publishes) == 1 and set(publishes[0]) >= {"lines", "orders", "lines__changes", "orders__changes"}
    assert keys(spark, settings, "orders") == {"o1"} and keys(spark, settings, "lines") == {"l1"}
    assert {r["table"]: r.get("waiting", 0) for r in results} == {"lines": 0, "orders": 1}
    [first] = [r for r in results if "held" in r]
    assert first["held"] == {"pg:tx2": "short: lines has 0 of 1 events"}
    stamped = {}
    for name in publishes[0]:
        t = load_table(settings, name)
        assert t is not None and t.current_snapshot() is not None
        stamped[name] = positions_of(t.current_snapshot().summary.additional_properties)  # type: ignore[union-attr]
    assert set(map(str, stamped.values())) == {str({"pg": "100"})}, stamped

    stage(settings, [TX2_REST])
    publishes.clear()
    apply_together(spark, settings, ["lines"], 10_000)
    assert len(publishes) == 1
    assert keys(spark, settings, "orders") == {"o1", "o2"} and keys(spark, settings, "lines") == {"l1", "l2"}
    want = expected_tables([TX1, TX2_HALF, TX2_REST])
    for table in ("orders", "lines"):
        assert not diff(want[table], table_rows(spark, table_ident(settings, table)))
        t = load_table(settings, table)
        assert t is not None and positions_of(t.current_snapshot().summary.additional_properties) == {"pg": "200"}  # type: ignore[union-attr]

    # Nothing left: a re-run commits nothing and publishes nothing.
    publishes.clear()
    again = apply_together(spark, settings, ["orders", "lines"], 10_000)
    assert not any(r["committed"] for r in again) and publishes == []


def test_switched_off_each_table_alone_shows_half_a_transaction(spark: Any, settings: Settings) -> None:
    """What the consistent publish prevents, shown: the orders row of tx2 without its line."""
    alone = dataclasses.replace(settings, consistent_publish=False)
    stage(alone, [TX1, TX2_HALF])
    apply_table(spark, alone, "orders", 10_000)
    assert keys(spark, alone, "orders") == {"o1", "o2"}
    assert not spark.catalog.tableExists(table_ident(alone, "lines"))  # o2's (and o1's) line: not yet


@pytest.mark.parametrize("crash_at", ["before-write", "after-aux", "after-stage", "after-commit"])
def test_a_crash_at_any_step_leaves_the_old_or_the_new_state_and_the_rerun_applies_once(
    spark: Any, settings: Settings, crash_at: str
) -> None:
    from spark_jobs.apply import apply_tables
    from spark_jobs.system import SimulatedCrash

    stage(settings, [TX1])
    with pytest.raises(SimulatedCrash):
        apply_tables(spark, settings, ["lines", "orders"], 10_000, crash_at=crash_at)
    published = crash_at == "after-commit"
    for name in ALL_TABLES:  # all of the run, or none of it
        t = load_table(settings, name)
        visible = t is not None and t.current_snapshot() is not None
        assert visible == (published and not name.endswith(("__quarantine", "__tombstones"))), name
    apply_together(spark, settings, ["orders"], 10_000)
    assert keys(spark, settings, "orders") == {"o1"} and keys(spark, settings, "lines") == {"l1"}
    for name in ("orders__changes", "lines__changes"):
        assert spark.table(table_ident(settings, name)).count() == 1  # applied once


def test_a_transaction_re_sent_under_another_batch_number_is_applied_once(spark: Any, settings: Settings) -> None:
    """A restarted Debezium re-sends a transaction's events in posts cut differently (new batch
    numbers): counted by their tableOrder they make the transaction whole once, and the apply
    keeps one delivery of each event."""

    def ordered(e: dict[str, Any], n: int) -> dict[str, Any]:
        return {**e, "transaction": {"id": "tx9", "tableOrder": n}}

    o1 = ordered(ev(10, "orders", "o9", {"total": 3}), 1)
    l1 = ordered(ev(11, "lines", "l9", {"order_id": "o9", "amount": 1}), 1)
    l2 = ordered(ev(12, "lines", "l10", {"order_id": "o9", "amount": 2}), 2)
    end9 = end("tx9", {"orders": 1, "lines": 2}, "900")
    first = {"source": "pg", "sequenceNumber": 7, "events": [o1, l1]}
    again = {"source": "pg", "sequenceNumber": 8, "events": [o1, l1, l2], "transactions": [end9]}
    stage(settings, [first, again])
    apply_together(spark, settings, ["orders"], 10_000)
    assert keys(spark, settings, "orders") == {"o9"} and keys(spark, settings, "lines") == {"l9", "l10"}
    assert spark.table(table_ident(settings, "lines__changes")).count() == 2
    assert spark.table(table_ident(settings, "orders__changes")).count() == 1
