"""Issue 14 finding F6 on real Spark + Iceberg: Debezium's ``__debezium_unavailable_value`` never
becomes a silent NULL. A primary-key change (a DELETE of the old key and an INSERT of the new one
at one source position, as Debezium sends it for Postgres) carries the old key's value to the new
key, whether the old key's row is stored or was written earlier in the same run, along chains of
key changes; with nothing to carry from, the event is quarantined with the column and why.

Expected rows are written out by hand, and checked against the reference model as well."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from cdclake import staging
from cdclake.config.settings import Settings
from cdclake.contracts import events
from cdclake.contracts.events import UNAVAILABLE
from cdclake.dev.reference import diff, expected_runs
from cdclake.lake.spark import table_ident
from tests.support import apply_all, table_rows

pytestmark = pytest.mark.spark

U = UNAVAILABLE
LONG = "".join(f"{i:08x}" for i in range(4740))  # 37,920 characters, as a TOASTed text
_seq = iter(range(1, 1_000_000))


def ev(op: str, key: str, at: tuple[int, int], after: dict[str, Any] | None = None) -> dict[str, Any]:
    """One event at source position ``at`` = (commit LSN, LSN), the ordering Debezium gives Postgres."""
    seq = next(_seq)
    e: dict[str, Any] = {
        "sequence": seq,
        "timestamp": 1_767_225_600_000 + seq,
        "operation": op,
        "table": "docs",
        "rowId": key,
        "order": list(at),
    }
    if after is not None:
        e["after"] = after
    return e


def batch(*evs: dict[str, Any]) -> dict[str, Any]:
    return {"source": "pg", "sequenceNumber": next(_seq), "events": list(evs)}


def run(spark: Any, settings: Settings, *evs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Stage one batch (typed decode, as the receiver lands it) and apply it: (batch, result)."""
    b = batch(*evs)
    typed = msgspec.convert(b, events.Batch)
    store = staging.LocalStaging(settings.staging_dir)
    for table, data in events.stage_lines(typed).items():
        store.put(staging.make_key(table, typed.source, typed.sequenceNumber), data)
    (result,) = apply_all(spark, settings)
    return b, result


def rows(spark: Any, settings: Settings) -> dict[str, dict[str, Any]]:
    return table_rows(spark, table_ident(settings, "docs"))


def quarantine(spark: Any, settings: Settings) -> dict[str, str]:
    ident = table_ident(settings, "docs__quarantine")
    if not spark.catalog.tableExists(ident):
        return {}
    return {r["_cdc_row_id"]: r["_cdc_reason"] for r in spark.table(ident).collect()}


def test_a_key_change_carries_the_stored_value_to_the_new_key(spark: Any, settings: Settings) -> None:
    b1, _ = run(spark, settings, ev("INSERT", "1", (100, 100), {"id": 1, "title": "t", "body": LONG, "n": 7}))
    # UPDATE docs SET id = 10 WHERE id = 1: body (text) and n (bigint) untouched, so unavailable.
    b2, r = run(
        spark,
        settings,
        ev("DELETE", "1", (200, 150)),
        ev("INSERT", "10", (200, 150), {"id": 10, "title": "t", "body": U, "n": U}),
    )
    assert rows(spark, settings) == {"10": {"id": 10, "title": "t", "body": LONG, "n": 7}}
    assert (r["applied"], r["quarantined"]) == (2, 0)
    assert quarantine(spark, settings) == {}
    assert not diff(expected_runs([[b1], [b2]]).tables["docs"], rows(spark, settings))


def test_chained_key_changes_in_one_run_carry_the_value_written_earlier_in_the_run(
    spark: Any, settings: Settings
) -> None:
    b1, _ = run(spark, settings, ev("INSERT", "9", (90, 90), {"id": 9, "body": "stored nine"}))
    b2, r = run(
        spark,
        settings,
        ev("INSERT", "1", (100, 100), {"id": 1, "body": "v1"}),
        ev("UPDATE", "1", (110, 110), {"id": 1, "body": "v2"}),
        ev("UPDATE", "1", (115, 112), {"id": 1, "body": U, "note": "n"}),
        # 1 -> 2 -> 3, each in its own transaction
        ev("DELETE", "1", (120, 118), None),
        ev("INSERT", "2", (120, 118), {"id": 2, "body": U, "note": U}),
        ev("DELETE", "2", (130, 125), None),
        ev("INSERT", "3", (130, 125), {"id": 3, "body": U, "note": "m"}),
        # the stored key 9 -> 90, then 90 -> 91 in the same transaction
        ev("DELETE", "9", (140, 131), None),
        ev("INSERT", "90", (140, 131), {"id": 90, "body": U}),
        ev("DELETE", "90", (140, 132), None),
        ev("INSERT", "91", (140, 132), {"id": 91, "body": U, "note": "last"}),
    )
    assert rows(spark, settings) == {
        "3": {"id": 3, "body": "v2", "note": "m"},
        "91": {"id": 91, "body": "stored nine", "note": "last"},
    }
    assert r["quarantined"] == 0
    assert not diff(expected_runs([[b1], [b2]]).tables["docs"], rows(spark, settings))


def test_a_key_change_whose_delete_applied_in_an_earlier_run_is_quarantined(spark: Any, settings: Settings) -> None:
    b1, _ = run(spark, settings, ev("INSERT", "1", (100, 100), {"id": 1, "body": LONG}))
    b2, _ = run(spark, settings, ev("DELETE", "1", (200, 150)))
    # The create of the same key change arrives in the next run: the old row is gone.
    b3, r = run(spark, settings, ev("INSERT", "10", (200, 150), {"id": 10, "title": "t", "body": U}))
    assert rows(spark, settings) == {}
    assert (r["applied"], r["quarantined"]) == (0, 1)
    reason = quarantine(spark, settings)["10"]
    assert reason.startswith("column body: unavailable value (__debezium_unavailable_value")
    assert "no row before this event" in reason and "deleted at this event's source position" in reason
    expected = expected_runs([[b1], [b2], [b3]])
    assert expected.quarantined["docs"] == {("pg", b3["events"][0]["sequence"])}
    assert not diff(expected.tables["docs"], rows(spark, settings))


def test_a_placeholder_with_nothing_to_keep_is_quarantined_never_null(spark: Any, settings: Settings) -> None:
    b1, _ = run(spark, settings, ev("INSERT", "5", (50, 50), {"id": 5, "body": "five"}))
    deleted_then_created = [
        ev("INSERT", "1", (100, 100), {"id": 1, "body": "one"}),
        ev("DELETE", "1", (110, 110)),
        ev("INSERT", "1", (120, 120), {"id": 1, "body": U}),  # the row was deleted: nothing to keep
    ]
    ambiguous = [  # two deletes at the new key's position: which old key is unknowable
        ev("DELETE", "5", (130, 130)),
        ev("INSERT", "6", (130, 130), {"id": 6, "body": "six"}),
        ev("DELETE", "6", (140, 135)),
        ev("DELETE", "1", (140, 135)),
        ev("INSERT", "7", (140, 135), {"id": 7, "body": U}),
    ]
    never_stored = [ev("UPDATE", "8", (150, 150), {"id": 8, "body": U, "title": "x"})]
    b2, r = run(spark, settings, *deleted_then_created, *ambiguous, never_stored[0])
    assert rows(spark, settings) == {}
    assert r["quarantined"] == 3
    reasons = quarantine(spark, settings)
    assert sorted(reasons) == ["1", "7", "8"]
    assert reasons["1"] == (
        "column body: unavailable value (__debezium_unavailable_value: the source did not capture it) with no "
        "earlier value to keep: the key has no row before this event and no other key is deleted at this "
        "event's source position in this run"
    )
    assert "2 deletes at this event's source position" in reasons["7"] and "ambiguous" in reasons["7"]
    assert reasons["8"].startswith("column body: ") and reasons["8"].endswith("the key has no row before this event")
    expected = expected_runs([[b1], [b2]])
    assert {rid for _, rid in [(s, _row(b2, q)) for s, q in expected.quarantined["docs"]]} == {"1", "7", "8"}
    assert not diff(expected.tables["docs"], rows(spark, settings))


def test_a_placeholder_keeps_the_stored_row_when_it_is_newer_than_the_runs_earlier_events(
    spark: Any, settings: Settings
) -> None:
    """An event of this run older than the stored row is no state a newer event saw."""
    b1, _ = run(spark, settings, ev("INSERT", "1", (200, 200), {"id": 1, "body": "stored"}))
    b2, _ = run(
        spark,
        settings,
        ev("UPDATE", "1", (150, 150), {"id": 1, "body": "late"}),
        ev("UPDATE", "1", (300, 300), {"id": 1, "body": U, "title": "new"}),
    )
    assert rows(spark, settings) == {"1": {"id": 1, "body": "stored", "title": "new"}}
    assert not diff(expected_runs([[b1], [b2]]).tables["docs"], rows(spark, settings))


def _row(b: dict[str, Any], seq: int) -> str:
    row_id: str = next(e["rowId"] for e in b["events"] if e["sequence"] == seq)
    return row_id


def test_a_placeholder_keeps_the_stored_value_when_the_event_spells_the_column_differently(
    spark: Any, settings: Settings
) -> None:
    """The table has ``Body``; an event sending ``body`` fills it, and its placeholder must keep it."""
    run(spark, settings, ev("INSERT", "1", (100, 100), {"id": 1, "Body": LONG}))
    run(spark, settings, ev("UPDATE", "1", (200, 200), {"id": 1, "body": U, "title": "t"}))
    assert rows(spark, settings) == {"1": {"id": 1, "Body": LONG, "title": "t"}}
