"""Table maintenance on real Spark + Iceberg tables: compaction after many small applies, expiry
that keeps the watermark, orphan removal that removes only orphans, staging clean-up that deletes
only applied objects, and the per-table lock. Results compared with the reference model."""

from __future__ import annotations

import os
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pyiceberg.manifest import ManifestContent

from cdclake import staging
from cdclake.config.settings import Settings
from cdclake.dev.reference import diff, expected_tables
from cdclake.dev.workload import generate
from cdclake.lake import changes, locks
from cdclake.lake.catalog import load_table, table_watermark
from cdclake.lake.cleanup import clean_staging
from cdclake.lake.health import compaction_candidates, table_health
from cdclake.lake.spark import table_ident
from spark_jobs.maintain import compact, expire, tidy
from spark_jobs.table import MERGE_MANIFESTS, MIN_COUNT_TO_MERGE
from tests.support import apply_all, fresh_settings, stage, table_rows

pytestmark = pytest.mark.spark


def many_small_applies(spark: Any, settings: Settings, runs: int = 12) -> list[dict[str, Any]]:
    """One apply per small batch; new keys mostly, so each run adds a file."""
    w = generate(
        events=runs * 20, seed=5, tables=("orders",), batch_size=20, duplicate_every=0, keys_per_table=runs * 15
    )
    for b in w.batches:
        stage(settings, [b])
        apply_all(spark, settings)
    return w.batches


def test_compaction_after_many_small_applies_leaves_one_file_and_the_same_rows(
    spark: Any, spark_home: Path, tmp_path: Path
) -> None:
    cfg = tmp_path / "tables.toml"
    cfg.write_text('[defaults]\nmerge_mode = "merge-on-read"\n')  # updates leave delete files
    settings = fresh_settings(spark_home, table_config=cfg)
    # 12 applies leave the data files and delete files asserted below for compaction to merge.
    # More applies only lengthen the test (50 took ~160 s of a CI run); the scan-time effect is the bench's.
    batches = many_small_applies(spark, settings)
    before = table_health(settings, "orders")
    assert before is not None and before.data_files >= 5 and before.delete_files > 0
    # Each apply added a data manifest and a delete manifest: merged by now, at cdclake's count
    # (spark_jobs.table.MERGE_MANIFESTS), not left to pile up to Iceberg's default of 100.
    table = load_table(settings, "orders")
    assert table is not None and table.current_snapshot() is not None
    manifests = table.current_snapshot().manifests(table.io)  # type: ignore[union-attr]
    data = [m for m in manifests if m.content == ManifestContent.DATA]
    at = int(MERGE_MANIFESTS[MIN_COUNT_TO_MERGE])
    assert at < 12 and len(data) < at and len(manifests) - len(data) < at, [m.manifest_path for m in manifests]
    assert "orders" in compaction_candidates(settings, min_files=5)
    wm = table_watermark(settings, "orders")
    ident = table_ident(settings, "orders")
    # The scan-time ratio before/after is a benchmark (tests/bench/compaction.py), not asserted here.
    out = compact(spark, settings, "orders", min_input_files=2)
    assert out["data_files"]["rewritten_data_files_count"] >= before.data_files - 1

    after = table_health(settings, "orders")
    assert after is not None and after.data_files <= 1 and after.delete_files == 0
    assert not diff(expected_tables(batches)["orders"], table_rows(spark, ident))
    assert table_watermark(settings, "orders") == wm  # found behind the compaction snapshot
    assert locks.holder(settings, "orders") is None  # released
    (r,) = apply_all(spark, settings)
    assert r["committed"] is False  # nothing pending, nothing applied twice


def test_expiry_keeps_retain_last_and_the_watermark_snapshot(spark: Any, settings: Settings) -> None:
    batches = many_small_applies(spark, settings, runs=4)
    compact(spark, settings, "orders", min_input_files=2)
    compact(spark, settings, "orders", min_input_files=1)  # a second maintenance snapshot
    ident = table_ident(settings, "orders")
    wm = table_watermark(settings, "orders")
    snaps = spark.sql(f"SELECT snapshot_id, summary FROM {ident}.snapshots ORDER BY committed_at").collect()
    assert len(snaps) >= 5 and "cdclake.watermark" not in snaps[-1][1]  # maintenance is current

    history = spark.sql(f"SELECT snapshot_id FROM {ident}.snapshots ORDER BY committed_at").collect()
    order = [r[0] for r in history]
    out = expire(spark, settings, "orders", datetime.now(UTC) + timedelta(hours=1), retain_last=1)
    ids = {r[0] for r in spark.sql(f"SELECT snapshot_id FROM {ident}.snapshots").collect()}
    # Everything older than the newest watermark snapshot went; it and the maintenance snapshots
    # after it (compaction: data files, delete files, manifests) stay.
    wm_at = order.index(out["watermark_snapshot"])
    assert ids == set(order[wm_at:]) and len(ids) < len(order)
    assert table_watermark(settings, "orders") == wm
    assert not diff(expected_tables(batches)["orders"], table_rows(spark, ident))


def test_orphan_removal_removes_only_orphans(spark: Any, settings: Settings) -> None:
    batches = many_small_applies(spark, settings, runs=2)
    ident = table_ident(settings, "orders")
    data_dir = Path(
        spark.sql(f"SELECT file_path FROM {ident}.files LIMIT 1").collect()[0][0].removeprefix("file:")
    ).parent
    orphan = data_dir / "00000-orphan-from-a-failed-write.parquet"
    orphan.write_bytes(b"PAR1 not really")
    old = time.time() - 10 * 86400
    os.utime(orphan, (old, old))
    cutoff = datetime.now(UTC) - timedelta(days=3)

    dry = expire(spark, settings, "orders", cutoff, orphans_older_than=cutoff, dry_run=True)
    assert [p for p in dry["orphan_files"] if p.endswith(orphan.name)] and orphan.exists()
    real = expire(spark, settings, "orders", cutoff, orphans_older_than=cutoff)
    assert len(real["orphan_files"]) == 1 and not orphan.exists()
    assert not diff(expected_tables(batches)["orders"], table_rows(spark, ident))


def test_staging_clean_up_deletes_only_applied_objects_and_spent_receipts(spark: Any, spark_home: Path) -> None:
    settings = fresh_settings(spark_home)
    store = staging.LocalStaging(settings.staging_dir)
    w = generate(events=120, seed=9, tables=("orders",), batch_size=20, duplicate_every=0)
    stage(settings, w.batches[:4])
    apply_all(spark, settings)
    stage(settings, w.batches[4:])  # landed, not applied
    for b in w.batches:  # receipts as the receiver writes them
        keys = [k.path for k in store.list("orders") if k.batch_sequence == b["sequenceNumber"]]
        receipt = staging.Receipt(
            b["source"], b["sequenceNumber"], 0, int(time.time() * 1000), "", len(b["events"]), keys
        )
        store.put_if_absent(staging.receipt_path(b["source"], b["sequenceNumber"]), staging.encode_receipt(receipt))
    future = int((time.time() + 3600) * 1000)
    dry = clean_staging(settings, future, dry_run=True)
    assert dry["objects_deleted"] == 4 and len(list(store.list("orders"))) == 6
    out = clean_staging(settings, future)
    left = list(store.list("orders"))
    assert out["objects_deleted"] == 4 and out["objects_not_yet_applied"] == 2
    assert sorted(k.batch_sequence for k in left) == [5, 6]
    receipts = store.list_names(staging.receipt_prefix("shop-db"))
    assert [staging.parse_receipt_name(n)[0] for n in receipts] == [5, 6]  # type: ignore[index]
    # What is left still applies, exactly once.
    apply_all(spark, settings)
    assert not diff(expected_tables(w.batches)["orders"], table_rows(spark, table_ident(settings, "orders")))
    # Too recent objects stay even when applied.
    assert clean_staging(settings, 0)["objects_deleted"] == 0


def test_table_lock_is_exclusive_waits_and_expires(spark_home: Path) -> None:
    settings = fresh_settings(spark_home)
    assert locks.try_acquire(settings, "t", "a", ttl_s=60)
    assert not locks.try_acquire(settings, "t", "b", ttl_s=60)
    assert locks.holder(settings, "t") == "a"
    locks.release(settings, "t", "b")  # not b's: nothing happens
    assert locks.holder(settings, "t") == "a"
    locks.release(settings, "t", "a")
    assert locks.try_acquire(settings, "t", "dead", ttl_s=0.5)
    time.sleep(0.6)  # its holder died: the row expires
    order: list[str] = []

    def worker(name: str) -> None:
        with locks.table_lock(settings, "t", name, wait_s=30, ttl_s=5):
            order.append(f"{name}-in")
            time.sleep(0.3)
            order.append(f"{name}-out")

    threads = [threading.Thread(target=worker, args=(n,)) for n in ("x", "y", "z")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # Never two holders at once: every "in" is followed by its own "out".
    assert all(order[i].removesuffix("-in") == order[i + 1].removesuffix("-out") for i in range(0, 6, 2))
    with (
        pytest.raises(locks.LockTimeout),
        locks.table_lock(settings, "t", "p", wait_s=30),
        locks.table_lock(settings, "t", "q", wait_s=0.5),
    ):
        pass


def test_a_side_table_is_locked_under_its_table_s_lock(spark_home: Path) -> None:
    """The apply writes a table and its side tables holding the table's lock; a compaction of a
    side table alone (the hourly DAG's) must wait for it, not take a lock of its own."""
    settings = fresh_settings(spark_home)
    assert [locks.lock_name(t) for t in ("t__changes", "t__Tombstones", "t__quarantine", "t", "t_changes")] == [
        "t",
        "t",
        "t",
        "t",
        "t_changes",
    ]
    with (
        pytest.raises(locks.LockTimeout, match="t: lock held by"),
        locks.table_lock(settings, "t", "apply", wait_s=30),
        locks.table_lock(settings, "t__changes", "compaction", wait_s=0.5),
    ):
        pass


def test_table_lock_is_first_come_first_served_so_maintenance_is_not_starved(spark_home: Path) -> None:
    """An apply that takes the lock again right after releasing it must not starve compaction."""
    settings = fresh_settings(spark_home)
    events: list[str] = []
    holding = threading.Event()
    done = threading.Event()

    def applier() -> None:
        for i in range(8):
            with locks.table_lock(settings, "t", "apply", wait_s=30, ttl_s=10):
                events.append(f"apply-in-{i}")
                holding.set()
                time.sleep(0.3)
            if done.is_set():
                return

    def compactor() -> None:
        holding.wait(10)
        with locks.table_lock(settings, "t", "compaction", wait_s=30, ttl_s=10, say=lambda _: events.append("wait")):
            events.append("compact-in")
        done.set()

    threads = [threading.Thread(target=applier), threading.Thread(target=compactor)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert "wait" in events and "compact-in" in events, events
    between = events[events.index("wait") + 1 : events.index("compact-in")]
    # The apply holding the lock when compaction queued finishes; the next one queues behind it.
    assert not [e for e in between if e.startswith("apply-in")], events
    assert locks.waiters(settings, "t") == [] and locks.holder(settings, "t") is None


def test_table_health_and_freshness_reach_the_receivers_metrics(spark: Any, spark_home: Path) -> None:
    from starlette.testclient import TestClient

    from receiver.app import create_app

    settings = fresh_settings(spark_home)
    batches = many_small_applies(spark, settings, runs=2)
    newest_ms = max(e["timestamp"] for b in batches for e in b["events"] if e["operation"] != "DELETE")
    app = create_app(settings)
    with TestClient(app) as c:
        app.state.service.backlog.refresh_health()
        text = c.get("/metrics").text
    metrics = {
        line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines() if line.startswith("cdclake_table_")
    }
    assert metrics['cdclake_table_data_files{table="orders"}'] >= 1
    assert metrics['cdclake_table_snapshots{table="orders"}'] == 2
    # valid-through: the newest applied event time, from the manifests' _cdc_ts upper bounds
    assert metrics['cdclake_table_valid_through_seconds{table="orders"}'] <= newest_ms / 1000
    assert metrics['cdclake_table_valid_through_seconds{table="orders"}'] > newest_ms / 1000 - 60
    assert metrics['cdclake_table_freshness_lag_seconds{table="orders"}'] > 0
    assert not any("__changes" in k for k in metrics)  # side tables are not CDC tables


def test_compaction_and_apply_running_concurrently_on_one_table(spark: Any, spark_home: Path, tmp_path: Path) -> None:
    """Two threads, two Spark sessions (separate SQL confs: the apply sets snapshot properties on
    its session), one table: applies and compactions interleave under the table lock; both
    always finish and the table matches the reference model."""
    from spark_jobs.apply import apply_with_retries

    cfg = tmp_path / "tables.toml"
    cfg.write_text('[defaults]\nmerge_mode = "merge-on-read"\n')
    settings = fresh_settings(spark_home, table_config=cfg)
    w = generate(events=240, seed=77, tables=("orders",), batch_size=30, duplicate_every=0, keys_per_table=80)
    stage(settings, w.batches[:1])
    apply_with_retries(spark, settings, "orders", 10_000)
    maint = spark.newSession()
    errors: list[BaseException] = []
    compactions: list[dict[str, Any]] = []
    done = threading.Event()

    def compactor() -> None:
        try:
            while not done.is_set():
                compactions.append(compact(maint, settings, "orders", min_input_files=1))
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=compactor)
    t.start()
    try:
        for b in w.batches[1:]:
            stage(settings, [b])
            seen = len(compactions)
            apply_with_retries(spark, settings, "orders", 10_000)  # the compactor waits on the lock
            deadline = time.monotonic() + 120
            while len(compactions) == seen and not errors and time.monotonic() < deadline:
                time.sleep(0.2)  # let a compaction in before the next apply queues behind it
    finally:
        done.set()
        t.join(timeout=300)
    assert not errors, errors
    assert len(compactions) >= len(w.batches) - 1
    assert not diff(expected_tables(w.batches)["orders"], table_rows(spark, table_ident(settings, "orders")))
    changes = spark.table(table_ident(settings, "orders__changes"))
    assert changes.count() == changes.select("_cdc_source", "_cdc_seq").distinct().count()


def test_a_compaction_where_with_a_dollar_brace_reaches_iceberg_as_written(spark: Any, spark_home: Path) -> None:
    """The user's ``where`` is quoted by sqltext.string_literal, the jobs' one helper, which writes
    ``${`` as ``$\\{`` because Spark may substitute ``${...}`` in SQL text before parsing it. The
    filter must still reach Iceberg as written: here, with a conf of that name set, it matches the
    three files that hold the text (not the session's value of the conf). On this Spark and
    Iceberg the CALL text was not substituted even with the old quoting; this holds the escape
    to being harmless and the filter to being exact."""
    settings = fresh_settings(spark_home)
    ident = table_ident(settings, "dollar")
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {settings.catalog_name}.{settings.namespace}")
    spark.sql(f"CREATE TABLE {ident} (id INT, name STRING) USING iceberg")
    for i, name in enumerate(["${cdclake.test.dollar}"] * 3 + ["other"]):
        # DataFrame values never pass through SQL text, so they are stored exactly as written.
        spark.createDataFrame([(i, name)], "id int, name string").writeTo(ident).append()
    spark.conf.set("cdclake.test.dollar", "substituted")
    try:
        out = compact(spark, settings, "dollar", min_input_files=2, where="name = '${cdclake.test.dollar}'")
    finally:
        spark.conf.unset("cdclake.test.dollar")
    assert out["data_files"]["rewritten_data_files_count"] == 3  # the three files whose rows match


def test_a_busy_table_keeps_at_most_its_snapshot_bound_and_its_watermark(
    spark: Any, spark_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past CDCLAKE_SNAPSHOTS_AT_MOST the apply that committed expires the oldest down to half,
    the side tables' too, and nothing applies twice after it. A failing trim is reported and the
    run still commits; the next trim expires at most the bound's worth at once."""
    settings = fresh_settings(spark_home, snapshots_at_most=4)
    w = generate(events=220, seed=8, tables=("orders",), batch_size=20, duplicate_every=0, keys_per_table=60)
    ident = table_ident(settings, "orders")

    def count(table: str) -> int:
        return int(spark.sql(f"SELECT count(*) FROM {table}.snapshots").collect()[0][0])

    def apply(b: dict[str, Any]) -> dict[str, Any]:
        stage(settings, [b])
        (r,) = apply_all(spark, settings)
        assert r["committed"] is True
        out: dict[str, Any] = r.get("trimmed", {}).get("orders", {})
        return out

    trims, most = 0, 0
    for b in w.batches[:6]:
        trimmed = apply(b)
        assert "error" not in trimmed, trimmed
        trims += bool(trimmed)
        most = max(most, count(ident), count(ident + "__changes"))
    assert trims >= 1 and most <= 4  # without the trim: one more per apply
    (r,) = apply_all(spark, settings)
    assert r["committed"] is False  # nothing pending, nothing applied twice

    def broken(*_: Any, **__: Any) -> None:
        raise RuntimeError("the expiry failed")

    with monkeypatch.context() as m:
        m.setattr("spark_jobs.maintain.expire_snapshots", broken)
        for b in w.batches[6:10]:
            trimmed = apply(b)
        assert "the expiry failed" in trimmed["error"] and count(ident) == 7
    assert apply(w.batches[10])["snapshots"] == 8 and count(ident) == 4  # 4 expired, not 6
    assert not diff(expected_tables(w.batches)["orders"], table_rows(spark, ident))


def _data_files(spark: Any, table: str) -> int:
    return int(spark.sql(f"SELECT count(*) FROM {table}.data_files").collect()[0][0])


def test_a_small_run_writes_each_side_table_s_rows_as_one_file(spark: Any, spark_home: Path) -> None:
    """A run of fewer than commit.ONE_FILE_BELOW events, here of many objects, writes one file
    to each side table (else one per task of its classification)."""
    settings = fresh_settings(spark_home)
    w = generate(events=600, seed=10, tables=("orders",), batch_size=25, duplicate_every=0, keys_per_table=80)
    stage(settings, w.batches)
    (r,) = apply_all(spark, settings)
    assert r["committed"] is True and r["objects"] == len(w.batches) and r["applied"] > 0
    ident = table_ident(settings, "orders")
    assert _data_files(spark, ident + "__changes") == 1 and _data_files(spark, ident + "__tombstones") == 1
    assert not diff(expected_tables(w.batches)["orders"], table_rows(spark, ident))


def test_a_busy_table_is_compacted_by_the_apply_past_its_small_files_bound(
    spark: Any, spark_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past CDCLAKE_SMALL_FILES_AT_MOST small files gained since its last rewrite, the apply that
    committed rewrites a table's small files, its side tables' too, and nothing applies twice
    after it; a change-feed subscriber paging through it reads each change once, in order. A
    failing rewrite is reported and the run still commits."""
    settings = fresh_settings(spark_home, small_files_at_most=2)
    w = generate(events=200, seed=9, tables=("orders",), batch_size=20, duplicate_every=0, keys_per_table=60)
    ident = table_ident(settings, "orders")

    def apply(b: dict[str, Any]) -> dict[str, Any]:
        stage(settings, [b])
        (r,) = apply_all(spark, settings)
        assert r["committed"] is True
        applied.append(r["applied"])
        tidied: dict[str, Any] = r.get("tidied", {})
        return tidied

    tidied, most, applied = set(), 0, list[int]()
    followed: list[changes.Change] = []  # a subscriber's change feed, page by page
    for b in w.batches[:6]:
        done = apply(b)
        assert not any("error" in how for how in done.values()), done
        tidied |= {t for t, how in done.items() if how["data_files"].get("rewritten_data_files_count", 0) > 2}
        most = max(most, _data_files(spark, ident))
        followed += _page(settings, followed, 8)  # behind the head: its cursor lands in compacted files
    assert {"orders", "orders__changes"} <= tidied and most <= 3  # without it: a file more per apply
    while page := _page(settings, followed, 50):
        followed += page
    # The change feed reads __changes by value, not by file: its compaction changes no page.
    assert [c.position for c in followed] == sorted({c.position for c in followed})  # in order, each once
    whole = changes.read_changes(settings, "orders", None, changes.OPERATIONS, 10_000)
    assert followed == whole and len(whole) == sum(applied)
    # Replayed in order, the feed makes what the reference model makes of the batches.
    replayed: dict[str, dict[str, Any]] = {}
    for c in followed:
        if c.after is None:
            replayed.pop(c.key, None)  # a DELETE (the workload sends no TRUNCATE)
        else:
            replayed[c.key] = c.after
    assert not diff(expected_tables(w.batches[:6])["orders"], replayed)
    (r,) = apply_all(spark, settings)
    assert r["committed"] is False  # nothing pending, nothing applied twice

    with monkeypatch.context() as m:
        m.setattr("spark_jobs.maintain._options", lambda _: "map('min-input-files', 'none')")
        errors = [how.get("error", "") for b in w.batches[6:] for how in apply(b).values()]
    assert errors and all('"none"' in e for e in errors), errors  # reported, and every run committed
    assert not diff(expected_tables(w.batches)["orders"], table_rows(spark, ident))
    # Due once a publish takes the count past a multiple of the bound: a rewrite that finds
    # nothing to do resets no count, and is not planned again at every apply.
    due = tidy(spark, settings, {"orders": (2, 3), "orders__changes": (3, 4), "orders__tombstones": (4, 5)})
    assert sorted(due) == ["orders", "orders__tombstones"]


def _page(settings: Settings, followed: list[changes.Change], limit: int) -> list[changes.Change]:
    """A subscriber's next page of ``orders``' change feed, after what it has ``followed``."""
    return changes.read_changes(
        settings, "orders", followed[-1].position if followed else None, changes.OPERATIONS, limit
    )


def test_the_apply_s_compaction_rewrites_small_files_and_a_big_one_only_once_all_its_rows_are_gone(
    spark: Any, spark_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tidy rewrites the files under SMALL_FILE_BYTES; a bigger one stays, whatever share of its
    rows is deleted (Iceberg's rewrite would take one with 30%), unless every row of it is."""
    settings = fresh_settings(spark_home, small_files_at_most=2)
    ident = table_ident(settings, "big")
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {settings.catalog_name}.{settings.namespace}")
    spark.sql(
        f"CREATE TABLE {ident} (id INT) USING iceberg "
        "TBLPROPERTIES ('format-version'='3', 'write.delete.mode'='merge-on-read')"
    )
    for i in range(3):
        spark.createDataFrame([(4 * i + j,) for j in range(4)], "id int").coalesce(1).writeTo(ident).append()
    spark.sql(f"DELETE FROM {ident} WHERE id % 2 = 0 OR id >= 8")  # half of two files, all of the third

    def rewritten() -> int:
        (how,) = tidy(spark, settings, {"big": (0, 3)}).values()
        assert "error" not in how, how
        return int(how["data_files"].get("rewritten_data_files_count", 0))

    with monkeypatch.context() as m:
        m.setattr("spark_jobs.maintain.SMALL_FILE_BYTES", 1)  # every file is big
        assert rewritten() == 1  # the third: all its rows deleted
    assert rewritten() == 2  # small: the two left, rewritten together
    assert sorted(r[0] for r in spark.table(ident).collect()) == [1, 3, 5, 7]
