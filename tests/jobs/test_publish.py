"""cdclake/lake/publish.py: snapshots staged by Spark (write-audit-publish) on several tables,
published in one catalog transaction, all or none; format v2 and v3; Spark reads the result and
commits on top of it; a publish whose base is no longer main is refused. Rows are checked
against a plain dict model of each table."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyiceberg.exceptions import CommitFailedException

from cdclake.config.settings import Settings
from cdclake.dev.reference import diff, expected_tables
from cdclake.dev.workload import generate
from cdclake.lake.catalog import load_table, open_catalog
from cdclake.lake.publish import (
    DELETE_AFTER_COMMIT,
    WAP_ENABLED,
    dropped,
    main_of,
    patched,
    publish_tables,
    small_files_since_rewrite,
    staged_snapshot,
)
from cdclake.lake.spark import table_ident
from spark_jobs.table import MERGE_MANIFESTS, MIN_COUNT_TO_MERGE
from tests.support import apply_all, fresh_settings, stage, table_rows

Model = dict[int, str]


def make(spark: Any, settings: Settings, name: str, version: int) -> Model:
    ident = table_ident(settings, name)
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {ident.rsplit('.', 1)[0]}")
    spark.sql(
        f"""CREATE TABLE {ident} (id bigint, v string) USING iceberg TBLPROPERTIES ('format-version'='{version}',
            'write.merge.mode'='merge-on-read', 'write.delete.mode'='merge-on-read', '{WAP_ENABLED}'='true')"""
    )
    spark.sql(f"INSERT INTO {ident} SELECT id, concat('v', id) FROM range(0, 20)")
    return {i: f"v{i}" for i in range(20)}


def merge(spark: Any, settings: Settings, name: str, model: Model, lo: int, hi: int, tag: str) -> Model:
    """Upsert ids lo..hi-1 with value tag-<id>; the model after it."""
    spark.sql(f"SELECT id, concat('{tag}-', id) AS v FROM range({lo}, {hi})").createOrReplaceTempView("pub_src")
    spark.sql(
        f"""MERGE INTO {table_ident(settings, name)} t USING pub_src s ON t.id = s.id
            WHEN MATCHED THEN UPDATE SET t.v = s.v WHEN NOT MATCHED THEN INSERT (id, v) VALUES (s.id, s.v)"""
    )
    return {**model, **{i: f"{tag}-{i}" for i in range(lo, hi)}}


def rows(spark: Any, settings: Settings, name: str) -> Model:
    return {r["id"]: r["v"] for r in spark.table(table_ident(settings, name)).collect()}


def main_id(settings: Settings, name: str) -> int | None:
    t = load_table(settings, name)
    assert t is not None
    snap = t.current_snapshot()
    return snap.snapshot_id if snap else None


def metadata_files(settings: Settings, name: str) -> set[str]:
    t = load_table(settings, name)
    assert t is not None
    folder = Path(t.metadata.location.removeprefix("file:")) / "metadata"
    return {p.name for p in folder.glob("*.metadata.json")}


@pytest.fixture()
def wap(spark: Any) -> Iterator[Any]:
    """Stage the writes in the block under one write-audit-publish id."""

    def under(wap_id: str) -> Any:
        spark.conf.set("spark.wap.id", wap_id)
        return wap_id

    yield under
    spark.conf.unset("spark.wap.id")


def stage_both(spark: Any, settings: Settings, models: dict[str, Model], wap: Any, tag: str) -> dict[str, Any]:
    """A MERGE into a, a MERGE into b, staged under one id; the moves and the models after."""
    before = {n: main_id(settings, n) for n in models}
    wap_id = wap(f"run-{tag}")
    after = {n: merge(spark, settings, n, models[n], 15, 25, f"{tag}{n}") for n in models}
    spark.conf.unset("spark.wap.id")
    moves = {}
    for n in models:
        t = load_table(settings, n)
        assert t is not None
        found = staged_snapshot(t, wap_id)
        assert found is not None and found[1] == before[n]  # staged on main, main untouched
        assert main_id(settings, n) == before[n]
        moves[n] = (found[0], before[n])
    return {"moves": moves, "after": after}


@pytest.mark.spark
@pytest.mark.parametrize("version", [2, 3])
def test_one_publish_moves_every_table_and_spark_commits_on_top(
    spark: Any, spark_home: Path, wap: Any, version: int
) -> None:
    settings = fresh_settings(spark_home)
    models = {n: make(spark, settings, n, version) for n in ("a", "b")}
    staged = stage_both(spark, settings, models, wap, "x")
    assert {n: rows(spark, settings, n) for n in models} == models  # nothing visible before the publish
    publish_tables(settings, staged["moves"])
    models = staged["after"]
    assert {n: rows(spark, settings, n) for n in models} == models
    logs = {n: load_table(settings, n).metadata.snapshot_log[-1] for n in models}  # type: ignore[union-attr]
    assert {n: e.snapshot_id for n, e in logs.items()} == {n: m[0] for n, m in staged["moves"].items()}
    assert len({e.timestamp_ms for e in logs.values()}) == 1  # one time for the whole publish
    # Each published snapshot's own time is that time too: travel to a snapshot's committed_at
    # finds it (the staged write's earlier time would find the snapshot before it).
    for n, e in logs.items():
        t = load_table(settings, n)
        assert t is not None and t.snapshot_by_id(e.snapshot_id).timestamp_ms == e.timestamp_ms  # type: ignore[union-attr]
    # A plain commit (a MERGE with deletion vectors on v3) on top of the patched metadata.
    models["a"] = merge(spark, settings, "a", models["a"], 0, 30, "later")
    spark.sql(f"DELETE FROM {table_ident(settings, 'a')} WHERE id < 3")
    models["a"] = {k: v for k, v in models["a"].items() if k >= 3}
    assert {n: rows(spark, settings, n) for n in models} == models
    t = load_table(settings, "a")
    assert t is not None and t.metadata.format_version == version
    assert {r["id"] for r in t.scan().to_arrow().to_pylist()} == set(models["a"])  # pyiceberg reads it too


@pytest.mark.spark
@pytest.mark.parametrize("version", [2, 3])
def test_a_refused_swap_on_one_table_moves_none(spark: Any, spark_home: Path, wap: Any, version: int) -> None:
    settings = fresh_settings(spark_home)
    models = {n: make(spark, settings, n, version) for n in ("a", "b")}
    staged = stage_both(spark, settings, models, wap, "y")
    files = {n: metadata_files(settings, n) for n in models}
    rows_a = open_catalog(settings).load_table((settings.namespace, "a")).metadata_location

    def race() -> None:  # b's row moves after the files are written, before the transaction
        spark.sql(f"INSERT INTO {table_ident(settings, 'b')} VALUES (100, 'race')")

    with pytest.raises(CommitFailedException):
        publish_tables(settings, staged["moves"], before_swap=race)
    models["b"] = {**models["b"], 100: "race"}
    assert open_catalog(settings).load_table((settings.namespace, "a")).metadata_location == rows_a
    assert {n: rows(spark, settings, n) for n in models} == models  # a not moved though its swap matched
    raced = open_catalog(settings).load_table((settings.namespace, "b")).metadata_location.rsplit("/", 1)[1]
    files["b"].add(raced)  # the racing commit's file; the publish's own are gone
    assert {n: metadata_files(settings, n) for n in models} == files
    # The retry: staged again on the new main, published.
    again = stage_both(spark, settings, models, wap, "z")
    publish_tables(settings, again["moves"])
    assert {n: rows(spark, settings, n) for n in models} == again["after"]


@pytest.mark.spark
def test_a_publish_whose_base_is_no_longer_main_is_refused(spark: Any, spark_home: Path, wap: Any) -> None:
    settings = fresh_settings(spark_home)
    models = {"a": make(spark, settings, "a", 3)}
    staged = stage_both(spark, settings, models, wap, "p")
    spark.sql(f"INSERT INTO {table_ident(settings, 'a')} VALUES (200, 'meanwhile')")  # another writer commits
    models["a"] = {**models["a"], 200: "meanwhile"}
    with pytest.raises(CommitFailedException, match="branch main has changed"):
        publish_tables(settings, staged["moves"])
    # Against main as it is now (a blind publish) it would drop the row committed meanwhile: refused.
    sid = staged["moves"]["a"][0]
    with pytest.raises(CommitFailedException, match="does not descend"):
        publish_tables(settings, {"a": (sid, main_id(settings, "a"))})
    assert rows(spark, settings, "a") == models["a"]


META: dict[str, Any] = {
    "format-version": 3,
    "last-updated-ms": 1000,
    "current-snapshot-id": 1,
    "refs": {"main": {"snapshot-id": 1, "type": "branch", "max-ref-age-ms": 5}},
    "snapshots": [
        {"snapshot-id": 1, "timestamp-ms": 900},
        {"snapshot-id": 2, "parent-snapshot-id": 1, "timestamp-ms": 950},
        {"snapshot-id": 3, "timestamp-ms": 960},
    ],
    "snapshot-log": [{"timestamp-ms": 900, "snapshot-id": 1}],
    "metadata-log": [{"timestamp-ms": 800, "metadata-file": "m0"}],
    "next-row-id": 77,
    "properties": {"write.metadata.previous-versions-max": "1"},
}


def test_the_patch_changes_only_what_a_ref_move_changes() -> None:
    meta = copy.deepcopy(META)
    new = patched(meta, "m1", ("ns", "a"), (2, 1), 2000)
    assert meta == META  # the input is not changed
    assert {k for k in new if new[k] != META.get(k)} == {
        "refs",
        "current-snapshot-id",
        "last-updated-ms",
        "snapshot-log",
        "metadata-log",
        "snapshots",
    }
    # Only the published snapshot's time changes: to the publish time, its log entry's.
    assert [s["timestamp-ms"] for s in new["snapshots"]] == [900, 2000, 960]
    assert new["refs"]["main"] == {"snapshot-id": 2, "type": "branch", "max-ref-age-ms": 5}
    assert new["snapshot-log"][-1] == {"timestamp-ms": 2000, "snapshot-id": 2}
    assert new["metadata-log"] == [{"timestamp-ms": 1000, "metadata-file": "m1"}]  # kept: 1 version
    assert main_of(new) == 2 and main_of({"current-snapshot-id": -1}) is None


@pytest.mark.parametrize(
    ("move", "why"),
    [((2, 5), "branch main has changed"), ((9, 1), "not in the table"), ((3, 1), "does not descend")],
)
def test_the_patch_refuses_a_changed_main_a_lost_or_unrelated_snapshot(move: tuple[int, int], why: str) -> None:
    with pytest.raises(CommitFailedException, match=why):
        patched(copy.deepcopy(META), "m1", ("ns", "a"), move, 2000)


def test_a_publish_names_the_files_its_log_drops_only_where_the_table_asks() -> None:
    log = [{"timestamp-ms": 700, "metadata-file": "m-1"}, *META["metadata-log"]]
    meta = {**copy.deepcopy(META), "metadata-log": log}
    new = patched(meta, "m1", ("ns", "a"), (2, 1), 2000)  # keeps one version: m1
    assert dropped(meta, "m1", new) == ()  # the property unset: Iceberg's default keeps them
    meta["properties"] = {**meta["properties"], DELETE_AFTER_COMMIT: "true"}
    assert dropped(meta, "m1", new) == ("m-1", "m0")  # never m1, which the new log names
    meta["properties"]["write.metadata.previous-versions-max"] = "0"  # Iceberg keeps one all the same
    new = patched(meta, "m1", ("ns", "a"), (2, 1), 2000)
    assert [e["metadata-file"] for e in new["metadata-log"]] == ["m1"] and dropped(meta, "m1", new) == ("m-1", "m0")


def test_small_files_are_counted_from_main_back_to_its_newest_rewrite_of_data_files() -> None:
    def snap(sid: int, parent: int | None, op: str, **summary: int | str) -> dict[str, Any]:
        counts = {k.replace("_", "-"): str(v) for k, v in summary.items()}
        return {"snapshot-id": sid, "parent-snapshot-id": parent, "summary": {"operation": op, **counts}}

    mb = 1024 * 1024
    line = [
        snap(1, None, "append", added_data_files=3, added_files_size=3 * mb),
        snap(2, 1, "replace", deleted_data_files=3, added_data_files=1, added_files_size=mb),  # compaction
        snap(3, 2, "overwrite", added_data_files=2, added_files_size=2 * mb),
        snap(4, 3, "replace"),  # rewrite_manifests: not a rewrite of data files
        snap(5, 4, "overwrite", added_data_files=1, added_files_size=64 * mb),  # a bulk apply's big file
        snap(6, 5, "append", added_data_files=4, added_files_size=4 * mb),
        snap(7, 6, "overwrite"),  # deletes only
        snap(8, 6, "append", added_data_files=9, added_files_size=9),  # not on main's line
        snap(9, 7, "overwrite", added_data_files=2, deleted_data_files=2, added_files_size=mb),  # copy-on-write
        snap(10, 9, "overwrite", added_data_files=3, deleted_data_files=1, added_files_size=mb),
        {"snapshot-id": 11, "parent-snapshot-id": 10, "summary": {"operation": "append", "added-data-files": "4"}},
        snap(12, 11, "append", added_data_files=5, added_files_size=mb, total_records="x"),
        {"snapshot-id": 13, "parent-snapshot-id": 12, "summary": {"operation": "append", "added-data-files": "many"}},
    ]
    meta: dict[str, Any] = {"snapshots": line, "refs": {"main": {"snapshot-id": 7, "type": "branch"}}}
    assert small_files_since_rewrite(meta) == 6  # 3's 2 and 6's 4; not 1's (before the rewrite), 5's or 8's
    assert small_files_since_rewrite(meta, small_bytes=128 * mb) == 7  # 5's file is small by this bound
    assert small_files_since_rewrite({**meta, "snapshots": line[2:]}) == 6  # an expired ancestor ends the walk
    assert small_files_since_rewrite({"snapshots": [], "current-snapshot-id": -1}) == 0
    # Added less removed (9: none, 10: 2); without its sizes (11) or with a count that is not a
    # number (13) a commit counts nothing, and a value it does not read (12's) fails nothing.
    meta["refs"]["main"]["snapshot-id"] = 13
    assert small_files_since_rewrite(meta) == 6 + 2 + 5


@pytest.mark.spark
def test_applies_keep_as_many_metadata_files_as_the_log_names(spark: Any, spark_home: Path) -> None:
    """Every commit writes a metadata file (the staged write and the publish); with the cleanup
    property cdclake gives its tables, the ones the log drops are deleted, Spark's commits and
    the publish's alike. Without it (set off half way) they pile up."""
    settings = fresh_settings(spark_home)
    w = generate(events=180, seed=3, tables=("t",), batch_size=20, duplicate_every=0, keys_per_table=50)
    ident = table_ident(settings, "t")
    stage(settings, w.batches[:1])
    apply_all(spark, settings)
    spark.sql(f"ALTER TABLE {ident} SET TBLPROPERTIES ('write.metadata.previous-versions-max'='2')")
    folder = Path(load_table(settings, "t").metadata_location.removeprefix("file:")).parent  # type: ignore[union-attr]

    def files() -> int:
        return len(list(folder.glob("*.metadata.json")))

    for b in w.batches[1:4]:
        stage(settings, [b])
        apply_all(spark, settings)
    assert files() <= 3  # the current file and the two its log names
    spark.sql(f"ALTER TABLE {ident} SET TBLPROPERTIES ('{DELETE_AFTER_COMMIT}'='false')")
    before = files()
    for b in w.batches[4:8]:
        stage(settings, [b])
        apply_all(spark, settings)
    assert files() >= before + 2 * 4  # a staged write and a publish per apply, none deleted
    # As an older cdclake made it: neither property. The next staged write gives it both.
    spark.sql(f"ALTER TABLE {ident} UNSET TBLPROPERTIES ('{DELETE_AFTER_COMMIT}', '{MIN_COUNT_TO_MERGE}')")
    assert MIN_COUNT_TO_MERGE not in load_table(settings, "t").properties  # type: ignore[union-attr]
    stage(settings, w.batches[8:])
    apply_all(spark, settings)
    props = load_table(settings, "t").properties  # type: ignore[union-attr]
    assert props[DELETE_AFTER_COMMIT] == "true" and props[MIN_COUNT_TO_MERGE] == MERGE_MANIFESTS[MIN_COUNT_TO_MERGE]
    assert not diff(expected_tables(w.batches)["t"], table_rows(spark, ident))
