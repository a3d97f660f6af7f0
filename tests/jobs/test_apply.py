"""The Spark apply job on real Spark + Iceberg, checked against cdclake/dev/reference.py."""

from __future__ import annotations

import time
from typing import Any

import pytest

from cdclake import staging
from cdclake.config.settings import Settings
from cdclake.dev.reference import diff, expected_tables, rows_by_key
from cdclake.dev.workload import generate
from cdclake.lake.catalog import load_table, pending_tables, table_watermark
from cdclake.lake.spark import table_ident
from spark_jobs.decide import classify, narrow_join, rank_per_key
from spark_jobs.read import drop_exact_duplicates, flatten, normalise
from tests.support import apply_all, stage, staged_event_count, table_rows

pytestmark = pytest.mark.spark


def snapshots(spark: Any, settings: Settings, table: str) -> list[int]:
    return [r[0] for r in spark.sql(f"SELECT snapshot_id FROM {table_ident(settings, table)}.snapshots").collect()]


def assert_matches_reference(spark: Any, settings: Settings, batches: list[dict[str, Any]]) -> None:
    expected = expected_tables(batches)
    for table, rows in expected.items():
        problems = diff(rows, table_rows(spark, table_ident(settings, table)))
        assert not problems, f"{table}: {len(problems)} differences, first: {problems[:3]}"


@pytest.mark.parametrize("narrow", [True, False], ids=["batch-keys-broadcast", "table-shuffled"])
def test_transforms_dedup_rank_and_classify(spark: Any, narrow: bool) -> None:
    raw = spark.createDataFrame(
        [
            ("a", 1, 5, 100, "INSERT", "k1", {"v": "old"}),
            ("a", 1, 5, 100, "INSERT", "k1", {"v": "old"}),  # exact duplicate
            ("a", 2, 9, 200, "UPDATE", "k1", {"v": "new"}),
            ("a", 2, 7, 150, "UPDATE", "k1", {"v": "mid"}),  # older, arrived later
            ("a", 3, 8, 160, "DELETE", "k2", None),
            ("a", 3, 4, 160, "UPDATE", "k3", {"v": "stale"}),  # older than the stored row
            ("a", 3, 6, 160, "UPDATE", "k4", {"v": "dead"}),  # older than the key's tombstone
            ("a", 3, 2, 160, "UPDATE", "k5", {"v": "same"}),  # IS the stored row (redelivered)
        ],
        "source string, batchSequence long, sequence long, timestamp long, operation string, rowId string, "
        "after struct<v:string>",
    )
    deduped = drop_exact_duplicates(normalise(raw))
    assert deduped.count() == 7
    current = spark.createDataFrame(
        [("k3", 10, "a"), ("k5", 2, "a")], "_cdc_row_id string, _cdc_seq long, _cdc_source string"
    )
    tombs = spark.createDataFrame([("k4", 6, "b")], "_cdc_row_id string, _cdc_seq long, _cdc_source string")
    out = {
        (r["_cdc_row_id"], r["_cdc_seq"]): r["_cdc_w_outcome"]
        for r in classify(rank_per_key(flatten(deduped)), current, tombs, narrow).collect()
    }
    assert out == {
        ("k1", 9): "applied",
        ("k1", 7): "superseded",
        ("k1", 5): "superseded",
        ("k2", 8): "applied",
        ("k3", 4): "late",
        ("k4", 6): "late",  # same sequence, lower source id than the tombstone's
        ("k5", 2): "duplicate",
    }


def test_narrow_join_broadcasts_the_batch_keys_only_when_the_batch_is_small(spark: Any) -> None:
    ranked = rank_per_key(
        spark.createDataFrame(
            [("k1", 1, "a", [1])], "_cdc_row_id string, _cdc_seq long, _cdc_source string, _cdc_order array<bigint>"
        )
    )
    current = spark.createDataFrame([("k1", 0, "a")], "_cdc_row_id string, _cdc_seq long, _cdc_source string")
    tombs = spark.createDataFrame([("k2", 0, "a")], "_cdc_row_id string, _cdc_seq long, _cdc_source string")

    def plan(narrow: bool) -> str:
        # Not through df.explain(): its text goes to stdout; this is the same string.
        return str(classify(ranked, current, tombs, narrow)._jdf.queryExecution().executedPlan().toString())

    assert plan(True).count("LeftSemi") == 2
    assert "LeftSemi" not in plan(False)
    assert narrow_join(1_000, 1_000_000) and narrow_join(200, 1_000)
    assert not narrow_join(1_000_000, 1_000_000) and not narrow_join(30, 0)


def test_exact_duplicates_keep_the_delivery_of_the_first_object(spark: Any) -> None:
    """(source, sequence) is one event however often sent; the copy that landed first is kept,
    whatever order Spark reads the objects in, and every delivery is counted."""
    schema = (
        "source string, batchSequence long, sequence long, timestamp long, operation string, rowId string, "
        "after struct<v:string>, _cdc_w_object string"
    )
    rows = [
        ("a", 1, 5, 100, "UPDATE", "k1", {"v": "later"}, "2026-01-01/00/2-b.ndjson"),
        ("a", 1, 5, 100, "UPDATE", "k1", {"v": "last"}, "2026-01-01/00/3-c.ndjson"),
        ("a", 1, 6, 100, "UPDATE", "k1", {"v": "other"}, "2026-01-01/00/3-c.ndjson"),
        ("a", 1, 5, 100, "UPDATE", "k1", {"v": "first"}, "2026-01-01/00/1-a.ndjson"),
    ]
    # One partition per row, the first object's copy read last.
    parts = [spark.createDataFrame([r], schema).coalesce(1) for r in rows]
    raw = parts[0].unionByName(parts[1]).unionByName(parts[2]).unionByName(parts[3])
    got = drop_exact_duplicates(normalise(raw), copies="n").collect()
    assert sorted((r["_cdc_seq"], r["after"]["v"], r["n"]) for r in got) == [(5, "first", 3), (6, "other", 1)]


def test_apply_matches_reference_and_rerun_changes_nothing(spark: Any, settings: Settings) -> None:
    w = generate(events=900, seed=11)
    stage(settings, w.batches)
    results = apply_all(spark, settings)
    assert all(r["committed"] for r in results)
    assert sum(r["received"] for r in results) == staged_event_count(settings)
    assert_matches_reference(spark, settings, w.batches)

    before = {t: snapshots(spark, settings, t) for t in ("customers", "orders", "products")}
    again = apply_all(spark, settings)
    assert [r["committed"] for r in again] == [False, False, False]
    assert {t: snapshots(spark, settings, t) for t in before} == before
    assert_matches_reference(spark, settings, w.batches)


def test_many_small_runs_with_old_events_arriving_late(spark: Any, settings: Settings) -> None:
    """Each batch applied in its own run; out-of-order events cross run boundaries."""
    w = generate(events=300, seed=5, batch_size=30, tables=("orders",), late_fraction=0.15)
    for b in w.batches:
        stage(settings, [b])
        apply_all(spark, settings)
    assert_matches_reference(spark, settings, w.batches)
    # Every run's accounting adds up to what was sent.
    sums = spark.sql(
        f"SELECT sum(cast(summary['cdclake.events-received'] AS int)) FROM {table_ident(settings, 'orders')}.snapshots"
    ).collect()[0][0]
    assert sums == staged_event_count(settings)


def test_object_landing_after_a_later_named_one_was_consumed_is_applied_once(spark: Any, settings: Settings) -> None:
    """Listing order is not commit order: a slow writer's object shows up after a newer one was applied."""
    w = generate(events=120, seed=3, batch_size=40, tables=("customers",), duplicate_every=0, late_fraction=0)
    b1, b2, b3 = w.batches
    now = int(time.time() * 1000)
    stage(settings, [b1], landed_ms=now - 3000)
    stage(settings, [b3], landed_ms=now - 1000)
    apply_all(spark, settings)
    # b2 was named between b1 and b3 but only now became visible.
    stage(settings, [b2], landed_ms=now - 2000)
    assert pending_tables(settings) == {"customers": 1}
    (r,) = apply_all(spark, settings)
    assert r["objects"] == 1 and r["committed"]
    assert_matches_reference(spark, settings, w.batches)
    assert pending_tables(settings) == {}
    (r,) = apply_all(spark, settings)
    assert r["committed"] is False


def test_pyiceberg_reads_what_spark_wrote(spark: Any, settings: Settings) -> None:
    w = generate(events=200, seed=9, tables=("orders",))
    stage(settings, w.batches)
    apply_all(spark, settings)
    t = load_table(settings, "orders")
    assert t is not None
    rows = t.scan().to_arrow().to_pylist()
    via_pyiceberg = rows_by_key(rows)
    assert not diff(expected_tables(w.batches)["orders"], via_pyiceberg)
    assert t.schema().identifier_field_names() == {"_cdc_row_id"}
    first_object = next(staging.LocalStaging(settings.staging_dir).list("orders"))
    watermark = table_watermark(settings, "orders")
    assert watermark is not None and watermark.consumed(first_object.name)


def test_new_column_is_added_to_the_table(spark: Any, settings: Settings) -> None:
    ev = {"timestamp": 1, "table": "users", "operation": "INSERT"}
    first = {**ev, "sequence": 1, "rowId": "1", "after": {"id": 1}}
    stage(settings, [{"source": "s", "sequenceNumber": 1, "events": [first]}])
    apply_all(spark, settings)
    stage(
        settings,
        [
            {
                "source": "s",
                "sequenceNumber": 2,
                "events": [{**ev, "sequence": 2, "rowId": "2", "after": {"id": 2, "email": "b@x"}}],
            }
        ],
    )
    apply_all(spark, settings)
    rows = table_rows(spark, table_ident(settings, "users"))
    assert rows == {"1": {"id": 1, "email": None}, "2": {"id": 2, "email": "b@x"}}


def test_a_key_deleted_in_two_runs_is_guarded_by_its_newest_delete(spark: Any, settings: Settings) -> None:
    """Tombstones are appended, one row per applied delete: after a delete, a re-insert and a
    second delete in later runs, the key has two. An update older than the second delete (but
    newer than the first) is late, and counted once: classify takes the newest tombstone, it
    does not join the event to each of them (that would double it, and the accounting fails)."""
    ev = {"timestamp": 1, "table": "users", "rowId": "1"}
    runs = [
        [
            {**ev, "sequence": 1, "operation": "INSERT", "after": {"id": 1}},
            {**ev, "sequence": 2, "operation": "DELETE"},
        ],
        [{**ev, "sequence": 5, "operation": "INSERT", "after": {"id": 5}}],
        [{**ev, "sequence": 8, "operation": "DELETE"}],
        [{**ev, "sequence": 6, "operation": "UPDATE", "after": {"id": 6}}],
    ]
    results = []
    for n, events in enumerate(runs, start=1):
        stage(settings, [{"source": "s", "sequenceNumber": n, "events": events}])
        results += apply_all(spark, settings)
    assert table_rows(spark, table_ident(settings, "users")) == {}
    assert results[-1]["late"] == 1 and results[-1]["received"] == 1, results[-1]
    tombs = spark.table(table_ident(settings, "users__tombstones")).where("_cdc_row_id = '1'")
    assert sorted(r["_cdc_seq"] for r in tombs.collect()) == [2, 8]


def test_late_update_does_not_resurrect_a_deleted_row(spark: Any, settings: Settings) -> None:
    ev = {"timestamp": 1, "table": "users", "rowId": "1"}
    stage(
        settings,
        [
            {
                "source": "s",
                "sequenceNumber": 1,
                "events": [
                    {**ev, "sequence": 1, "operation": "INSERT", "after": {"id": 1}},
                    {**ev, "sequence": 3, "operation": "DELETE"},
                ],
            }
        ],
    )
    apply_all(spark, settings)
    stage(
        settings,
        [
            {
                "source": "s",
                "sequenceNumber": 2,
                "events": [{**ev, "sequence": 2, "operation": "UPDATE", "after": {"id": 1}}],
            }
        ],
    )
    apply_all(spark, settings)
    assert table_rows(spark, table_ident(settings, "users")) == {}
