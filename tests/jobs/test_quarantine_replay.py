"""The quarantine's lifecycle on real Spark + Iceberg: side tables that exist with their table,
the staged line kept with each quarantined event, and `cdclake quarantine replay` after the
column was widened: each replayed event decided once, the accounting balanced every run."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest

from cdclake.cli.main import main
from cdclake.config.settings import Settings
from cdclake.contracts.events import CHANGES_SUFFIX, QUARANTINE_SUFFIX, TOMBSTONES_SUFFIX
from cdclake.lake.catalog import load_table
from cdclake.lake.spark import table_ident
from spark_jobs.maintain import expire
from tests.support import apply_all, stage

pytestmark = pytest.mark.spark

OUTCOMES = ("applied", "duplicate", "superseded", "late", "quarantined")


def ev(seq: int, op: str, key: str, price: Any = None) -> dict[str, Any]:
    e: dict[str, Any] = {"sequence": seq, "timestamp": 1_767_225_600_000 + seq, "operation": op, "table": "t"}
    e["rowId"] = key
    if op != "DELETE":
        e["after"] = {"id": key, "price": price}
    return e


def batch(n: int, *events: dict[str, Any]) -> dict[str, Any]:
    return {"source": "s", "sequenceNumber": n, "events": list(events)}


def apply_once(spark: Any, settings: Settings) -> dict[str, Any]:
    (r,) = apply_all(spark, settings)
    assert r["received"] == sum(r[k] for k in OUTCOMES), f"accounting: {r}"
    return {k: r[k] for k in ("received", *OUTCOMES)}


def cli(spark: Any, settings: Settings, *argv: str) -> list[dict[str, Any]]:
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["quarantine", *argv, "--format", "json"], spark=spark, settings=settings) == 0
    return [json.loads(line) for line in out.getvalue().splitlines() if line]


def prices(spark: Any, settings: Settings) -> dict[str, Decimal]:
    return {r["id"]: r["price"] for r in spark.table(table_ident(settings, "t")).collect()}


def quarantine(spark: Any, settings: Settings) -> list[tuple[int, str, bool]]:
    q = spark.table(table_ident(settings, "t" + QUARANTINE_SUFFIX))
    return sorted((r["_cdc_seq"], r["_cdc_row_id"], r["_cdc_replayed_at"] is not None) for r in q.collect())


def changes(spark: Any, settings: Settings) -> list[tuple[int, str]]:
    c = spark.table(table_ident(settings, "t" + CHANGES_SUFFIX))
    return sorted((r["_cdc_seq"], r["_cdc_outcome"]) for r in c.collect())


def test_side_tables_exist_with_their_table(spark: Any, settings: Settings) -> None:
    stage(settings, [batch(1, ev(1, "INSERT", "a", 1))])
    assert apply_once(spark, settings)["applied"] == 1
    for suffix in (QUARANTINE_SUFFIX, TOMBSTONES_SUFFIX):  # nothing quarantined, nothing deleted
        assert spark.sql(f"SELECT * FROM {table_ident(settings, 't' + suffix)}").collect() == []
    columns = spark.table(table_ident(settings, "t" + QUARANTINE_SUFFIX)).columns
    assert {"_cdc_reason", "_cdc_event", "_cdc_replayed_at", "_cdc_replay"} <= set(columns)
    for suffix in (QUARANTINE_SUFFIX, CHANGES_SUFFIX, TOMBSTONES_SUFFIX):
        side = load_table(settings, "t" + suffix)
        assert side is not None and side.format_version == 2
    # iceberg_expire takes every table of the namespace: one without a snapshot yet too.
    now = datetime.now(UTC)
    orphans = now - timedelta(days=3)  # Iceberg refuses less than a day
    out = expire(spark, settings, "t" + QUARANTINE_SUFFIX, now, retain_last=1, orphans_older_than=orphans)
    assert out["orphan_files"] == [] and "watermark_snapshot" not in out
    assert spark.table(table_ident(settings, "t" + QUARANTINE_SUFFIX)).count() == 0


def test_values_that_fit_after_widening_are_replayed_each_once(spark: Any, settings: Settings) -> None:
    first = ev(1, "INSERT", "a", 1.5)
    first["columnTypes"] = {"price": "decimal(5,2)"}
    stage(settings, [batch(1, first)])
    assert apply_once(spark, settings)["applied"] == 1
    stage(
        settings,
        [
            batch(
                2,
                ev(2, "UPDATE", "a", 12345.67),  # 7 digits: no decimal(5,2)
                ev(3, "INSERT", "b", 99999.99),
                ev(4, "INSERT", "c", 3.25),  # fits
                ev(5, "INSERT", "d", 55555.55),  # superseded by seq 7 before the replay
                ev(6, "INSERT", "e", "abc"),  # fits no decimal: stays quarantined
            )
        ],
    )
    assert apply_once(spark, settings) == dict(received=5, applied=1, duplicate=0, superseded=0, late=0, quarantined=4)
    stage(settings, [batch(3, ev(7, "UPDATE", "d", 7))])
    assert apply_once(spark, settings)["applied"] == 1
    (line,) = [
        r["_cdc_event"] for r in spark.table(table_ident(settings, "t__quarantine")).collect() if r["_cdc_seq"] == 3
    ]
    assert {k: json.loads(line)[k] for k in ("source", "batchSequence", "sequence", "rowId")} == {
        "source": "s",
        "batchSequence": 2,
        "sequence": 3,
        "rowId": "b",
    }
    listed = {(r["reason"], r["status"]): r["events"] for r in cli(spark, settings, "list", "t")}
    assert listed == {
        ("column price: number 12345.67 does not fit decimal(5,2)", "quarantined"): 1,
        ("column price: number 99999.99 does not fit decimal(5,2)", "quarantined"): 1,
        ("column price: number 55555.55 does not fit decimal(5,2)", "quarantined"): 1,
        ('column price: string "abc" does not fit decimal(5,2)', "quarantined"): 1,
    }

    spark.sql(f"ALTER TABLE {table_ident(settings, 't')} ALTER COLUMN price TYPE decimal(9,2)")
    (done,) = cli(spark, settings, "replay", "t", "--reason", "column price: number")
    assert (done["events"], done["rows"], done["already_replayed"]) == (3, 3, 0)
    assert quarantine(spark, settings) == [(2, "a", True), (3, "b", True), (5, "d", True), (6, "e", False)]
    # Each replayed event decided once against the table as it is now: seq 5 is older than the row
    # seq 7 wrote.
    assert apply_once(spark, settings) == dict(received=3, applied=2, duplicate=0, superseded=0, late=1, quarantined=0)
    want = {"a": Decimal("12345.67"), "b": Decimal("99999.99"), "c": Decimal("3.25"), "d": Decimal("7.00")}
    assert prices(spark, settings) == want
    applied = [(seq, "applied") for seq in (1, 2, 3, 4, 7)]
    assert changes(spark, settings) == sorted([*applied, (5, "late")])

    # Replaying again lands nothing; forced, the events come back and are duplicates of their decision.
    (again,) = cli(spark, settings, "replay", "t", "--reason", "column price: number")
    assert (again["events"], again["already_replayed"]) == (0, 3)
    assert [r["objects"] for r in apply_all(spark, settings)] == [0]
    (forced,) = cli(spark, settings, "replay", "t", "--reason", "column price: number", "--force")
    assert forced["events"] == 3
    assert apply_once(spark, settings) == dict(received=3, applied=0, duplicate=3, superseded=0, late=0, quarantined=0)
    assert prices(spark, settings) == want
    assert len(changes(spark, settings)) == 6

    # The event that still does not fit comes back to the quarantine, as a new row not replayed.
    (rest,) = cli(spark, settings, "replay", "t")
    assert rest["events"] == 1
    assert apply_once(spark, settings) == dict(received=1, applied=0, duplicate=0, superseded=0, late=0, quarantined=1)
    assert quarantine(spark, settings)[-2:] == [(6, "e", False), (6, "e", True)]
    assert prices(spark, settings) == want


def test_a_quarantine_from_before_replays_gets_the_columns_and_keeps_its_rows(spark: Any, settings: Settings) -> None:
    stage(settings, [batch(1, ev(1, "INSERT", "a", 1))])
    apply_once(spark, settings)  # price bigint
    q = table_ident(settings, "t" + QUARANTINE_SUFFIX)
    spark.sql(f"DROP TABLE {q}")
    spark.sql(
        f"""CREATE TABLE {q} (_cdc_row_id string, _cdc_seq bigint, _cdc_ts timestamp, _cdc_source string,
            _cdc_operation string, _cdc_object string, _cdc_reason string, _cdc_quarantined_at timestamp)
            USING iceberg TBLPROPERTIES ('format-version'='2')"""
    )
    spark.sql(f"INSERT INTO {q} VALUES ('z', 0, now(), 's', 'INSERT', 'x', 'an old reason', now())")
    stage(settings, [batch(2, ev(2, "INSERT", "b", "abc"))])
    assert apply_once(spark, settings)["quarantined"] == 1
    listed = {(r["reason"], r["status"]) for r in cli(spark, settings, "list", "t")}
    assert listed == {("an old reason", "no event"), ('column price: string "abc" does not fit bigint', "quarantined")}
    (done,) = cli(spark, settings, "replay", "t")
    assert (done["events"], done["rows"], done["without_event"]) == (1, 2, 1)
    # Still no bigint: decided again, quarantined again.
    assert apply_once(spark, settings) == dict(received=1, applied=0, duplicate=0, superseded=0, late=0, quarantined=1)
    assert quarantine(spark, settings) == [(0, "z", False), (2, "b", False), (2, "b", True)]


def test_a_table_without_a_quarantine_is_an_error(spark: Any, settings: Settings, capsys: Any) -> None:
    assert main(["quarantine", "list", "nosuch"], spark=spark, settings=settings) == 1
    assert "no quarantine table" in capsys.readouterr().err
    # A name that is no CDC table's never reaches the SQL the replay writes.
    assert main(["quarantine", "replay", "x; DROP TABLE y"], spark=spark, settings=settings) == 1
    assert "not a CDC table name" in capsys.readouterr().err


def test_a_replay_that_dies_before_marking_applies_nothing_until_run_again(
    spark: Any, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    import cdclake.lake.quarantine as lake_quarantine

    first = ev(1, "INSERT", "a", 1.5)
    first["columnTypes"] = {"price": "decimal(5,2)"}
    stage(settings, [batch(1, first), batch(2, ev(2, "INSERT", "b", 12345.67))])
    assert apply_once(spark, settings)["quarantined"] == 1
    spark.sql(f"ALTER TABLE {table_ident(settings, 't')} ALTER COLUMN price TYPE decimal(9,2)")

    def killed(*args: Any) -> None:
        raise RuntimeError("replay killed before marking")

    with monkeypatch.context() as m:
        m.setattr(lake_quarantine, "_mark", killed)
        assert main(["quarantine", "replay", "t"], spark=spark, settings=settings) == 1
    # Landed, not marked: the apply takes the events for the ones it quarantined before.
    assert apply_once(spark, settings) == dict(received=1, applied=0, duplicate=1, superseded=0, late=0, quarantined=0)
    assert quarantine(spark, settings) == [(2, "b", False)]
    (done,) = cli(spark, settings, "replay", "t")
    assert done["events"] == 1
    assert apply_once(spark, settings) == dict(received=1, applied=1, duplicate=0, superseded=0, late=0, quarantined=0)
    assert prices(spark, settings) == {"a": Decimal("1.50"), "b": Decimal("12345.67")}
