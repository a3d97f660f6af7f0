"""An apply changes its table and side tables in one catalog commit (spark_jobs.stage,
cdclake.lake.publish): every table's main moves once, at one time; a crash between staging and
publishing leaves nothing visible and the re-run applies once; a refused publish re-runs the
apply. Rows against the reference model (cdclake.dev.reference)."""

from __future__ import annotations

from typing import Any

import pytest

from cdclake.config.settings import Settings
from cdclake.contracts.events import CHANGES_SUFFIX, QUARANTINE_SUFFIX, TOMBSTONES_SUFFIX
from cdclake.dev.reference import diff, expected_tables
from cdclake.lake.catalog import load_table
from cdclake.lake.publish import WAP_ENABLED, WAP_ID, publish_tables
from cdclake.lake.spark import table_ident
from spark_jobs.system import SimulatedCrash
from tests.support import apply_all, stage, staged_event_count, table_rows

pytestmark = pytest.mark.spark

TABLES = ("t", "t" + QUARANTINE_SUFFIX, "t" + CHANGES_SUFFIX, "t" + TOMBSTONES_SUFFIX)


def ev(seq: int, op: str, key: str, after: Any = None) -> dict[str, Any]:
    e = {"sequence": seq, "timestamp": 1_767_225_600_000 + seq, "operation": op, "table": "t", "rowId": key}
    return {**e, "after": after} if after is not None else e


def batch(n: int, *events: dict[str, Any]) -> dict[str, Any]:
    return {"source": "s", "sequenceNumber": n, "events": list(events)}


FIRST = [batch(1, ev(1, "INSERT", "1", {"v": 1.5}), ev(2, "INSERT", "2", {"v": 2.5}))]
# A second run that writes all four tables: an update, a delete, an insert, a value that does not fit.
SECOND = [
    batch(2, ev(3, "UPDATE", "1", {"v": 3.5}), ev(4, "DELETE", "2"), ev(5, "INSERT", "3", {"v": 4.0})),
    batch(3, ev(6, "INSERT", "4", {"v": "not a number"})),
]


def mains(settings: Settings) -> dict[str, tuple[int | None, int]]:
    """Each table's main snapshot and the length of its snapshot log."""
    out = {}
    for name in TABLES:
        t = load_table(settings, name)
        snap = t.current_snapshot() if t is not None else None
        out[name] = (snap.snapshot_id if snap else None, len(t.metadata.snapshot_log) if t is not None else 0)
    return out


def expected(spark: Any, settings: Settings, batches: list[dict[str, Any]]) -> None:
    want = expected_tables(batches)["t"]
    want.pop("4", None)  # quarantined: its value does not fit the double column
    assert not diff(want, table_rows(spark, table_ident(settings, "t")))
    changes = spark.table(table_ident(settings, "t" + CHANGES_SUFFIX))
    assert changes.count() == changes.select("_cdc_source", "_cdc_seq").distinct().count()


def test_an_apply_moves_its_four_tables_in_one_catalog_commit(
    spark: Any, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    stage(settings, FIRST)
    apply_all(spark, settings)
    stage(settings, SECOND)
    before = mains(settings)
    calls: list[list[str]] = []
    real = publish_tables

    def counted(s: Settings, moves: Any) -> Any:
        calls.append(sorted(moves))
        return real(s, moves)

    monkeypatch.setattr("spark_jobs.stage.publish_tables", counted)
    (r,) = apply_all(spark, settings)
    assert r["quarantined"] == 1 and r["applied"] == 3
    assert calls == [sorted(TABLES)]  # one publish, of all four tables
    after = mains(settings)
    logs = {n: load_table(settings, n).metadata.snapshot_log for n in TABLES}  # type: ignore[union-attr]
    for n in TABLES:
        assert after[n][0] != before[n][0] and after[n][1] == before[n][1] + 1, n  # main moved once
    assert len({logs[n][-1].timestamp_ms for n in TABLES}) == 1  # all at one time
    expected(spark, settings, FIRST + SECOND)


def test_a_crash_between_staging_and_the_publish_shows_nothing_and_the_rerun_applies_once(
    spark: Any, settings: Settings
) -> None:
    stage(settings, FIRST)
    apply_all(spark, settings)
    seen = table_rows(spark, table_ident(settings, "t"))
    stage(settings, SECOND)
    before = mains(settings)
    with pytest.raises(SimulatedCrash, match="after-stage"):
        apply_all(spark, settings, crash_at="after-stage")
    assert mains(settings) == before  # no table moved
    assert table_rows(spark, table_ident(settings, "t")) == seen
    for n in TABLES:  # the crashed run's writes are there, staged, in no table's history
        t = load_table(settings, n)
        assert t is not None and any(s.summary and WAP_ID in s.summary.additional_properties for s in t.snapshots())
    (r,) = apply_all(spark, settings)
    assert (r["objects"], "resumed" in r) == (2, False)  # a plain run, nothing to resume
    expected(spark, settings, FIRST + SECOND)
    ident = table_ident(settings, "t")
    received = spark.sql(
        f"""SELECT sum(cast(s.summary['cdclake.events-received'] AS int)) FROM {ident}.snapshots s
            JOIN {ident}.history h ON s.snapshot_id = h.snapshot_id WHERE h.is_current_ancestor"""
    )
    assert received.collect()[0][0] == staged_event_count(settings)


def test_a_publish_refused_because_main_moved_reruns_the_apply(
    spark: Any, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    import spark_jobs.apply as job

    stage(settings, FIRST)
    apply_all(spark, settings)
    stage(settings, SECOND)
    real = publish_tables
    raced: list[str] = []

    def after_another_commit(s: Settings, moves: Any) -> Any:
        if not raced:  # another writer commits to the table between the stage and the publish
            raced.append("t")
            ident = table_ident(settings, "t")
            spark.createDataFrame([], spark.table(ident).schema).writeTo(ident).append()
        return real(s, moves)

    monkeypatch.setattr("spark_jobs.stage.publish_tables", after_another_commit)
    monkeypatch.setattr("spark_jobs.job._sleep", lambda s: None)
    result = job.apply_with_retries(spark, settings, "t", 10_000)
    assert raced and result["attempts"] == 2
    expected(spark, settings, FIRST + SECOND)


def test_a_table_made_without_write_audit_publish_gets_it_at_its_next_apply(spark: Any, settings: Settings) -> None:
    """Tables an older cdclake created lack write.wap.enabled (without it Spark ignores the
    run's id and commits at once): the first staged write sets it, once."""
    stage(settings, FIRST)
    apply_all(spark, settings)
    for n in TABLES:
        spark.sql(f"ALTER TABLE {table_ident(settings, n)} UNSET TBLPROPERTIES ('{WAP_ENABLED}')")
    stage(settings, SECOND)
    before = mains(settings)
    with pytest.raises(SimulatedCrash):
        apply_all(spark, settings, crash_at="after-stage")
    assert mains(settings) == before  # staged, not committed
    for n in TABLES:
        t = load_table(settings, n)
        assert t is not None and t.properties.get(WAP_ENABLED) == "true", n
    apply_all(spark, settings)
    expected(spark, settings, FIRST + SECOND)
