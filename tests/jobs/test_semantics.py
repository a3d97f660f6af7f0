"""CDC semantics of the apply job on real Spark + Iceberg: quarantine, schema evolution, change
history, key changes, tombstones, crashes at every commit point, and random workloads in random
run splits, all checked against cdclake/dev/reference.py."""

from __future__ import annotations

import contextlib
import itertools
import json
import time
import types
from collections.abc import Iterator
from dataclasses import dataclass
from functools import reduce
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, StructType
from pyspark.storagelevel import StorageLevel

from cdclake.config.settings import Settings
from cdclake.contracts.events import CHANGES_SUFFIX, QUARANTINE_SUFFIX
from cdclake.dev.reference import diff, expected_runs, expected_tables, rows_by_key
from cdclake.dev.workload import generate
from cdclake.lake.catalog import load_table
from cdclake.lake.spark import table_ident
from spark_jobs.apply import apply_table
from spark_jobs.system import CRASH_POINTS, OLDER_AUX_CRASH, SimulatedCrash
from tests.support import apply_all, fresh_settings, stage, staged_event_count, table_rows

pytestmark = pytest.mark.spark


def ev(seq: int, op: str, key: str, after: Any = None, table: str = "t") -> dict[str, Any]:
    e = {"sequence": seq, "timestamp": 1_767_225_600_000 + seq, "operation": op, "table": table, "rowId": key}
    if after is not None:
        e["after"] = after
    return e


def batch(n: int, *events: dict[str, Any], source: str = "s") -> dict[str, Any]:
    return {"source": source, "sequenceNumber": n, "events": list(events)}


def rows(spark: Any, settings: Settings, table: str = "t") -> dict[str, dict[str, Any]]:
    return table_rows(spark, table_ident(settings, table))


def test_values_that_do_not_fit_are_quarantined_and_the_rest_applies(spark: Any, settings: Settings) -> None:
    stage(settings, [batch(1, ev(1, "INSERT", "1", {"id": 1, "v": 10, "d": 0.5}))])
    apply_all(spark, settings)  # v bigint, d double
    stage(
        settings,
        [
            batch(
                2,
                ev(2, "INSERT", "2", {"id": 2, "v": "abc", "d": 1.5}),
                ev(3, "INSERT", "3", {"id": 3, "v": "7", "d": 2}),  # a string is no bigint
                ev(4, "UPDATE", "1", {"id": 1, "v": 12.5, "d": True}),
                ev(5, "INSERT", "5", {"id": 5, "v": 5, "d": 5}),  # an integer fits a double column
            )
        ],
    )
    (r,) = apply_all(spark, settings)
    assert (r["received"], r["quarantined"], r["applied"]) == (4, 3, 1)
    assert rows(spark, settings) == {"1": {"id": 1, "v": 10, "d": 0.5}, "5": {"id": 5, "v": 5, "d": 5.0}}
    q = {x["_cdc_row_id"]: x["_cdc_reason"] for x in spark.table(table_ident(settings, "t__quarantine")).collect()}
    assert q == {
        "1": "column d: boolean true does not fit double; column v: number 12.5 does not fit bigint",
        "2": 'column v: string "abc" does not fit bigint',
        "3": 'column v: string "7" does not fit bigint',
    }


def test_the_run_releases_its_cached_events_when_some_are_corrupt(
    spark: Any, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fitted rows are cached once; explaining corrupt events derives another DataFrame from
    them, and the run must unpersist the cached one (a Spark Connect server outlives runs)."""
    import spark_jobs.fit as fit

    stage(settings, [batch(1, ev(1, "INSERT", "1", {"id": 1, "v": 10}))])
    apply_all(spark, settings)  # v bigint
    stage(settings, [batch(2, ev(2, "INSERT", "2", {"id": 2, "v": "abc"}), ev(3, "INSERT", "3", {"id": 3, "v": 3}))])
    cached: list[Any] = []
    real = fit.fit_to_table

    def recording(*args: Any, **kwargs: Any) -> Any:
        cached.append(real(*args, **kwargs))
        return cached[-1]

    monkeypatch.setattr(fit, "fit_to_table", recording)
    (r,) = apply_all(spark, settings)
    assert (r["quarantined"], r["applied"]) == (1, 1) and len(cached) == 1
    assert cached[0].storageLevel == StorageLevel.NONE, "the run left its events cached"


def test_a_failed_commit_releases_the_cached_events_too(
    spark: Any, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A commit that fails (a conflict the retry will run again) must not leave the attempt's
    cache behind on a long-lived Spark Connect server."""
    import spark_jobs.apply as apply
    import spark_jobs.fit as fit

    stage(settings, [batch(1, ev(1, "INSERT", "1", {"id": 1, "v": 10}))])
    cached: list[Any] = []
    real = fit.fit_to_table

    def recording(*args: Any, **kwargs: Any) -> Any:
        cached.append(real(*args, **kwargs))
        return cached[-1]

    def failing(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("simulated commit failure")

    monkeypatch.setattr(fit, "fit_to_table", recording)
    monkeypatch.setattr(apply, "commit_table", failing)
    with pytest.raises(RuntimeError, match="simulated commit failure"):
        apply.apply_table(spark, settings, "t", max_objects=10)
    assert len(cached) == 1 and cached[0].storageLevel == StorageLevel.NONE, "the failed run left its events cached"


def test_safe_widening_is_applied_to_the_table(spark: Any, settings: Settings) -> None:
    ident = table_ident(settings, "t")
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {settings.catalog_name}.{settings.namespace}")
    spark.sql(
        f"CREATE TABLE {ident} (_cdc_row_id string NOT NULL, v int, f float, _cdc_seq bigint, "
        "_cdc_ts timestamp, _cdc_source string) USING iceberg"
    )
    stage(settings, [batch(1, ev(1, "INSERT", "1", {"v": 3_000_000_000, "f": 1.5}))])
    apply_all(spark, settings)
    types = {f.name: f.dataType.simpleString() for f in spark.table(ident).schema.fields}
    assert (types["v"], types["f"]) == ("bigint", "double")
    assert rows(spark, settings) == {"1": {"v": 3_000_000_000, "f": 1.5}}


def test_new_nested_fields_are_added_and_structs_kept(spark: Any, settings: Settings) -> None:
    b1 = batch(1, ev(1, "INSERT", "1", {"id": 1, "addr": {"city": "a"}, "tags": [{"k": "x"}]}))
    b2 = batch(2, ev(2, "INSERT", "2", {"id": 2, "addr": {"zip": "z", "city": "b"}, "tags": [{"k": "y", "w": 2}]}))
    stage(settings, [b1])
    apply_all(spark, settings)
    stage(settings, [b2])
    apply_all(spark, settings)
    schema = spark.table(table_ident(settings, "t")).schema
    assert schema["addr"].dataType.simpleString() == "struct<city:string,zip:string>"
    assert schema["tags"].dataType.simpleString() == "array<struct<k:string,w:bigint>>"
    assert not diff(expected_tables([b1, b2])["t"], rows(spark, settings))


def test_key_change_and_late_event_after_delete(spark: Any, settings: Settings) -> None:
    stage(settings, [batch(1, ev(1, "INSERT", "1", {"id": 1, "v": 1}), ev(2, "INSERT", "9", {"id": 9, "v": 9}))])
    apply_all(spark, settings)
    # Primary key 1 -> 2, as Debezium sends it: delete of the old key, create of the new one.
    stage(settings, [batch(2, ev(3, "DELETE", "1"), ev(4, "INSERT", "2", {"id": 2, "v": 1}), ev(5, "DELETE", "9"))])
    apply_all(spark, settings)
    # A late update of key 9 older than its delete must not resurrect it.
    stage(settings, [batch(3, ev(4, "UPDATE", "9", {"id": 9, "v": 99}, table="t"), source="s")])
    (r,) = apply_all(spark, settings)
    assert rows(spark, settings) == {"2": {"id": 2, "v": 1}}
    assert r["late"] + r["duplicate"] == 1


def test_tombstones_expire_after_their_retention(spark: Any, spark_home: Path) -> None:
    from datetime import UTC, datetime, timedelta

    from spark_jobs.maintain import expire

    settings = fresh_settings(spark_home)
    stage(settings, [batch(1, ev(1, "INSERT", "1", {"v": 1}), ev(2, "DELETE", "1"), ev(3, "DELETE", "9"))])
    apply_all(spark, settings)
    tombstones = table_ident(settings, "t__tombstones")
    assert spark.table(tombstones).count() == 2  # the apply keeps them; iceberg_expire forgets them
    now = datetime.now(UTC)
    out = expire(spark, settings, "t", now - timedelta(days=5), tombstones_older_than=now - timedelta(hours=1))
    assert out["tombstones_expired"] == 0  # younger than the retention: kept
    out = expire(spark, settings, "t", now - timedelta(days=5), tombstones_older_than=now + timedelta(seconds=1))
    assert out["tombstones_expired"] == 2
    spark.catalog.refreshTable(tombstones)
    assert spark.table(tombstones).count() == 0
    # Forgotten: an event older than the delete now counts as new (that is what retention means).
    stage(settings, [batch(2, ev(2, "UPDATE", "9", {"v": 7}), source="late")])
    apply_all(spark, settings)
    assert rows(spark, settings) == {"9": {"v": 7}}


def test_change_history_has_every_distinct_event_with_its_outcome(spark: Any, settings: Settings) -> None:
    w = generate(events=300, seed=17, tables=("orders",), batch_size=30)
    half = len(w.batches) // 2
    stage(settings, w.batches[:half])
    apply_all(spark, settings)
    stage(settings, w.batches[half:])
    apply_all(spark, settings)
    changes = spark.table(table_ident(settings, "orders__changes")).collect()
    sent = {(b["source"], e["sequence"]) for b in w.batches for e in b["events"]}
    assert {(c["_cdc_source"], c["_cdc_seq"]) for c in changes} == sent
    assert {c["_cdc_outcome"] for c in changes} <= {"applied", "superseded", "late"}
    # The newest change of every live key is the row the table holds.
    live = rows(spark, settings, "orders")
    newest: dict[str, Any] = {}
    for c in changes:
        if c["_cdc_row_id"] not in newest or c["_cdc_seq"] > newest[c["_cdc_row_id"]]["_cdc_seq"]:
            newest[c["_cdc_row_id"]] = c
    assert {k for k, c in newest.items() if c["_cdc_operation"] != "DELETE"} == set(live)


@pytest.mark.parametrize("point", CRASH_POINTS)
def test_crash_at_any_point_then_rerun_gives_the_same_tables(spark: Any, spark_home: Path, point: str) -> None:
    settings = fresh_settings(spark_home)
    w = generate(events=240, seed=23, tables=("customers",), batch_size=20)
    third = len(w.batches) // 3
    stage(settings, w.batches[:third])
    apply_all(spark, settings)
    stage(settings, w.batches[third : 2 * third])
    with pytest.raises(SimulatedCrash):
        apply_all(spark, settings, crash_at=point)
    apply_all(spark, settings)
    stage(settings, w.batches[2 * third :])
    apply_all(spark, settings)
    assert not diff(expected_tables(w.batches)["customers"], rows(spark, settings, "customers"))
    ident = table_ident(settings, "customers")
    # Every event accounted for exactly once across the committed runs (a staged, never
    # published snapshot of the crashed run is not in the table's ancestry).
    received = spark.sql(
        f"""SELECT sum(cast(s.summary['cdclake.events-received'] AS int)) FROM {ident}.snapshots s
            JOIN {ident}.history h ON s.snapshot_id = h.snapshot_id WHERE h.is_current_ancestor"""
    )
    assert received.collect()[0][0] == staged_event_count(settings)
    # The change history holds no event twice.
    changes = spark.table(f"{ident}__changes")
    assert changes.count() == changes.select("_cdc_source", "_cdc_seq").distinct().count()


# ------------------------------------------------------------------------- property-based

event_st = st.tuples(
    st.sampled_from(["a", "b"]),  # table
    st.integers(1, 4),  # key
    st.sampled_from(["UPSERT", "UPSERT", "DELETE"]),
    st.integers(0, 1000),  # value
)


@st.composite
def workloads(draw: st.DrawFn) -> list[list[dict[str, Any]]]:
    """Events in source order -> shuffled arrival -> batches (some re-sent) -> apply runs."""
    raw = draw(st.lists(event_st, min_size=1, max_size=30))
    events = []
    alive: set[tuple[str, int]] = set()
    for seq, (table, key, op, value) in enumerate(raw, start=1):
        if op == "DELETE":
            alive.discard((table, key))
            events.append(ev(seq, "DELETE", str(key), table=table))
        else:
            events.append(ev(seq, "UPDATE" if (table, key) in alive else "INSERT", str(key), {"v": value}, table))
            alive.add((table, key))
    arrival = draw(st.permutations(events))
    cuts = sorted(draw(st.lists(st.integers(1, max(1, len(arrival) - 1)), max_size=4, unique=True)))
    chunks = [arrival[i:j] for i, j in zip([0, *cuts], [*cuts, len(arrival)], strict=True) if arrival[i:j]]
    batches: list[dict[str, Any]] = []
    for n, chunk in enumerate(chunks, start=1):
        batches.append(batch(n, *chunk))
        if draw(st.booleans()):
            batches.append(batch(n, *chunk))  # the producer retried
    runs = draw(st.integers(1, min(3, len(batches))))
    size = -(-len(batches) // runs)
    return [batches[i : i + size] for i in range(0, len(batches), size)]


@hsettings(
    max_examples=6,
    derandomize=True,  # the same examples in every CI run
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(runs=workloads())
def test_random_workloads_in_random_runs_match_the_reference(spark: Any, spark_home: Path, runs: Any) -> None:
    settings = fresh_settings(spark_home)
    for run in runs:
        stage(settings, run)
        apply_all(spark, settings)
    expected = expected_tables([b for run in runs for b in run])
    for table, want in expected.items():
        ident = table_ident(settings, table)
        got = table_rows(spark, ident) if spark.catalog.tableExists(ident) else {}
        assert not diff(want, got), (table, diff(want, got)[:3])
        # The same rows through pyiceberg, the other engine on the shared catalog.
        t = load_table(settings, table)
        via_pyiceberg = rows_by_key(t.scan().to_arrow().to_pylist()) if t is not None else {}
        assert not diff(want, via_pyiceberg), (table, "pyiceberg", diff(want, via_pyiceberg)[:3])


# Workloads with everything at once: two tables, two producers, key changes, columns and struct
# fields that appear later, values of conflicting types, redeliveries (same or new batch number,
# in the same or a later run), random run splits, and in most runs a crash at a random point of
# one table's apply, followed by the normal re-run.

# Values a column's type cannot always hold, and where they go: `v` (bigint when the table gets it),
# the struct `info` itself, or its field `info.a`.
CONFLICTING = st.one_of(st.sampled_from([2.5, -0.5, 7.0]), st.sampled_from(["abc", "7"]), st.booleans())
CONFLICT = st.one_of(
    *[st.none()] * 3,
    st.tuples(st.sampled_from(["v", "v", "info", "info.a"]), CONFLICTING, st.integers(0, 3)),
)

rich_event_st = st.tuples(
    st.sampled_from(["a", "b"]),  # table
    st.sampled_from(["s", "s", "p"]),  # producer
    st.integers(1, 4),  # key
    st.sampled_from(["UPSERT", "UPSERT", "UPSERT", "DELETE", "REKEY"]),
    st.integers(0, 999),  # column v
    st.booleans(),  # with the struct column `info`
    st.integers(1, 6),  # the new key of a REKEY
    CONFLICT,  # (where, value, 0 = even in the first run) or None
)


@dataclass
class Workload:
    runs: list[list[dict[str, Any]]]
    crashes: dict[int, tuple[str, int]]  # run -> (crash point, which of the run's tables) for some runs

    def __repr__(self) -> str:  # what hypothesis prints for a failing example
        return f"Workload(crashes={self.crashes}, runs={json.dumps(self.runs)})"


def image(key: int, v: int, info: bool, i: int, w_from: int, b_from: int) -> dict[str, Any]:
    after: dict[str, Any] = {"id": key, "v": v}
    if i >= w_from:
        after["w"] = key * 10  # a column the table gains later
    if info:
        after["info"] = {"a": key}
        if i >= b_from:
            after["info"]["b"] = f"x{key}"  # a struct field the table gains later
    return after


@st.composite
def rich_workloads(draw: st.DrawFn) -> Workload:
    raw = draw(st.lists(rich_event_st, min_size=4, max_size=24))
    w_from, b_from = draw(st.integers(0, len(raw))), draw(st.integers(0, len(raw)))
    seqs = {"s": 0, "p": 0}
    events: list[tuple[str, dict[str, Any]]] = []  # (producer, event) in source order
    conflicts: dict[int, tuple[str, Any, int]] = {}  # id(event) -> its conflict
    for i, (table, source, key, op, v, info, new_key, conflict) in enumerate(raw):
        seqs[source] += 1
        if op == "DELETE":
            events.append((source, ev(seqs[source], "DELETE", str(key), table=table)))
            continue
        if op == "UPSERT":
            events.append((source, ev(seqs[source], "UPDATE", str(key), image(key, v, info, i, w_from, b_from), table)))
        else:  # primary key change, as Debezium sends it: delete of the old key, create of the new
            nk = new_key if new_key != key else new_key % 6 + 1
            events.append((source, ev(seqs[source], "DELETE", str(key), table=table)))
            seqs[source] += 1
            created = ev(seqs[source], "INSERT", str(nk), image(nk, v, info, i, w_from, b_from), table)
            created["timestamp"] = events[-1][1]["timestamp"]  # one source transaction
            events.append((source, created))
        if conflict is not None:
            conflicts[id(events[-1][1])] = conflict
    arrival = draw(st.permutations(events))
    cuts = sorted(draw(st.lists(st.integers(1, max(1, len(arrival) - 1)), max_size=5, unique=True)))
    numbers = {"s": 0, "p": 0}
    batches: list[dict[str, Any]] = []
    for lo, hi in zip([0, *cuts], [*cuts, len(arrival)], strict=True):
        for source in ("s", "p"):
            chunk = [e for src, e in arrival[lo:hi] if src == source]
            if chunk:
                numbers[source] += 1
                batches.append(batch(numbers[source], *chunk, source=source))
    # Redeliveries: the same events again, under the same or a new batch number, later on.
    placed = [((i, 0), b) for i, b in enumerate(batches)]
    for j, (which, same_number, later) in enumerate(
        draw(st.lists(st.tuples(st.integers(0, 10**6), st.booleans(), st.integers(0, 10**6)), max_size=3))
    ):
        i = which % len(batches)
        b = batches[i]
        if not same_number:
            numbers[b["source"]] += 1
        n = b["sequenceNumber"] if same_number else numbers[b["source"]]
        placed.append(((i + 1 + later % (len(batches) - i), j + 1), batch(n, *b["events"], source=b["source"])))
    ordered = [b for _, b in sorted(placed, key=lambda p: p[0])]
    cuts = sorted(draw(st.lists(st.integers(1, max(1, len(ordered) - 1)), max_size=3, unique=True)))
    runs = [ordered[lo:hi] for lo, hi in zip([0, *cuts], [*cuts, len(ordered)], strict=True) if ordered[lo:hi]]
    # Type conflicts mostly after the first run: a conflict in the run that creates the column
    # only makes the column a string. Redeliveries share the event, so they carry it too.
    first_run: dict[int, int] = {}
    for n, run in enumerate(runs):
        for b in run:
            for e in b["events"]:
                first_run.setdefault(id(e), n)
    for _, e in events:
        where, value, anywhere = conflicts.get(id(e), ("", None, 1))
        if not where or (first_run[id(e)] == 0 and anywhere != 0):
            continue
        if where == "v":
            e["after"]["v"] = value
        elif where == "info":
            e["after"]["info"] = value
        elif isinstance(e["after"].get("info"), dict):
            e["after"]["info"]["a"] = value
    points = draw(st.lists(st.sampled_from([None, *CRASH_POINTS]), min_size=len(runs), max_size=len(runs)))
    crashes = {n: (p, draw(st.integers(0, 1))) for n, p in enumerate(points) if p is not None}
    return Workload(runs, crashes)


def column_types(t: Any) -> Any:
    """A Spark schema as the reference writes types: simple names, structs as dicts, arrays as
    one-element lists."""
    if isinstance(t, StructType):
        return {f.name: column_types(f.dataType) for f in t.fields if not f.name.startswith("_cdc_")}
    if isinstance(t, ArrayType):
        return [column_types(t.elementType)]
    return t.simpleString()


def event_ids(settings: Settings, table: str) -> list[tuple[str, int]]:
    """(source, sequence) of every row of a side table, through pyiceberg; [] if there is none."""
    t = load_table(settings, table)
    if t is None:
        return []
    return [(r["_cdc_source"], r["_cdc_seq"]) for r in t.scan().to_arrow().to_pylist()]


def events_received(settings: Settings, table: str) -> int:
    """Events the committed runs of ``table`` accounted for (summed over its snapshot ancestry)."""
    t = load_table(settings, table)
    if t is None or t.current_snapshot() is None:
        return 0
    from pyiceberg.table.snapshots import ancestors_of

    summaries = [s.summary.additional_properties for s in ancestors_of(t.current_snapshot(), t.metadata) if s.summary]
    return sum(int(p.get("cdclake.events-received", 0)) for p in summaries)


@hsettings(
    max_examples=6,  # ~30 s each on 2 cores: every run applies two tables, plus a crashed apply
    derandomize=True,  # the same examples in every CI run
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(w=rich_workloads())
def test_rich_workloads_with_a_crash_match_the_reference_with_quarantine(
    spark: Any, spark_home: Path, w: Workload
) -> None:
    settings = fresh_settings(spark_home)
    landed = itertools.count(int(time.time() * 1000))  # every delivery its own staging object
    for i, run in enumerate(w.runs):
        for b in run:
            stage(settings, [b], landed_ms=next(landed))
        if i in w.crashes:
            point, pick = w.crashes[i]
            tables = sorted({e["table"] for b in run for e in b["events"]})
            with pytest.raises(SimulatedCrash):
                apply_table(spark, settings, tables[pick % len(tables)], 10_000, crash_at=point)
        apply_all(spark, settings)
    expected = expected_runs(w.runs)
    for table, want in expected.tables.items():
        ident = table_ident(settings, table)
        got = table_rows(spark, ident)
        assert not diff(want, got), (table, diff(want, got)[:3])
        t = load_table(settings, table)
        assert t is not None
        via_pyiceberg = rows_by_key(t.scan().to_arrow().to_pylist())
        assert not diff(want, via_pyiceberg), (table, "pyiceberg", diff(want, via_pyiceberg)[:3])
        assert column_types(spark.table(ident).schema) == expected.types[table]

        assert events_received(settings, table) == sum(
            1 for run in w.runs for b in run for e in b["events"] if e["table"] == table
        ), "every delivery accounted for once across the committed runs"
        for side, want_ids in ((QUARANTINE_SUFFIX, expected.quarantined), (CHANGES_SUFFIX, expected.changes)):
            ids = event_ids(settings, table + side)
            assert set(ids) == want_ids.get(table, set()), (
                side,
                sorted(set(ids) - want_ids.get(table, set())),
                sorted(want_ids.get(table, set()) - set(ids)),
            )
            assert len(ids) == len(set(ids)), (side, "logged twice", sorted({x for x in ids if ids.count(x) > 1}))


# Divergences between the pipeline and the semantics that the workloads above once found, each
# reduced to a minimal case.


@pytest.mark.parametrize(
    ("as_values", "collected"),
    [(True, True), (False, True), (False, False)],
    ids=["run-ids-as-values", "ids-collected", "ids-checkpointed"],
)
def test_an_event_delivered_again_in_a_later_run_is_logged_once(
    spark: Any, settings: Settings, monkeypatch: pytest.MonkeyPatch, as_values: bool, collected: bool
) -> None:
    """Each way the history is searched: the run's ids as values in its filter (a small run) or
    joined with its events; and each way the seen ids reach the join: as values and checkpointed."""
    from spark_jobs import apply, decide

    monkeypatch.setattr(apply, "IDS_AS_VALUES_AT_MOST", 100 if as_values else 0)
    monkeypatch.setattr(decide, "SEEN_COLLECTED_AT_MOST", 100 if collected else 0)
    first = batch(1, ev(1, "INSERT", "1", {"v": 1}), ev(2, "UPDATE", "1", {"v": 2}))
    bad = batch(2, ev(3, "INSERT", "2", {"v": "abc"}))
    results = []
    for b in (first, bad, batch(3, *first["events"]), batch(4, *bad["events"])):  # the producer re-sent both
        stage(settings, [b])
        results += apply_all(spark, settings)
    assert [(r["received"], r["duplicate"]) for r in results[2:]] == [(2, 2), (1, 1)], "re-sent: duplicates"
    assert rows(spark, settings) == {"1": {"v": 2}}
    changes = event_ids(settings, "t" + CHANGES_SUFFIX)
    quarantine = event_ids(settings, "t" + QUARANTINE_SUFFIX)
    assert sorted(changes) == [("s", 1), ("s", 2)], "each distinct event once in the change history"
    assert quarantine == [("s", 3)], "each distinct event once in the quarantine"


def test_the_history_filter_of_a_run_from_many_producers_is_a_plan_spark_connect_takes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The filter ORs a term per producer; Spark Connect's client cannot build an expression
    nested 100 protobuf levels deep, which a chain of ORs reaches at about 50 terms."""
    from spark_jobs.decide import history_window

    monkeypatch.setenv("SPARK_CONNECT_MODE_ENABLED", "1")  # Connect columns, built client-side
    for n in (1, 2, 47, 1000):
        ranges = [(f"p{i}", 1, 10) for i in range(n)]
        window, by_values = history_window(ranges, {f"p{i}": [1, 5, 10] for i in range(n)})
        window._expr.to_plan(None)  # type: ignore[operator]
        assert by_values, n
    chain = reduce(lambda a, b: a | b, [F.col("s") == f"p{i}" for i in range(100)])  # the filter before
    with pytest.raises(Exception, match="Exceeded"):
        chain._expr.to_plan(None)  # type: ignore[operator]


def test_a_wide_object_whose_types_differ_is_a_plan_spark_connect_takes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whether a value fits ORs a term per field (spark_jobs.schema.conform): as a chain, an
    object of 50 fields was an expression the Connect client cannot build."""
    from pyspark.sql.types import LongType, StringType, StructField

    from spark_jobs.schema import conform

    monkeypatch.setenv("SPARK_CONNECT_MODE_ENABLED", "1")
    for n in (50, 1000):
        dst = StructType([StructField(f"c{i}", LongType()) for i in range(n)])
        src = StructType([*dst.fields[:-1], StructField(f"c{n - 1}", StringType())])
        for column in conform(F.col("o"), src, dst):
            column._expr.to_plan(None)  # type: ignore[operator]


def test_a_long_keeps_its_precision_in_a_run_that_also_has_fractions(spark: Any, settings: Settings) -> None:
    stage(settings, [batch(1, ev(1, "INSERT", "1", {"v": 1}))])
    apply_all(spark, settings)
    stage(settings, [batch(2, ev(2, "INSERT", "2", {"v": 2**53 + 1}), ev(3, "INSERT", "3", {"v": 2.5}))])
    apply_all(spark, settings)
    assert rows(spark, settings)["2"] == {"v": 2**53 + 1}  # not 9007199254740992, a double's


def test_one_malformed_value_does_not_quarantine_the_valid_values_of_its_run(spark: Any, settings: Settings) -> None:
    stage(settings, [batch(1, ev(1, "INSERT", "1", {"v": 1.5, "n": {"a": 1}}))])
    apply_all(spark, settings)  # v double, n struct<a:bigint>
    stage(settings, [batch(2, ev(2, "INSERT", "2", {"v": 5, "n": {"a": 2}}), ev(3, "INSERT", "3", {"v": "x", "n": 3}))])
    apply_all(spark, settings)
    assert event_ids(settings, "t" + QUARANTINE_SUFFIX) == [("s", 3)]  # not (s, 2): 5 fits a double
    assert rows(spark, settings)["2"] == {"v": 5.0, "n": {"a": 2}}


def test_new_data_before_the_rerun_of_a_crashed_apply_keeps_one_fate_per_event(spark: Any, settings: Settings) -> None:
    """The resume path, for a table an older cdclake (a commit per table) left with its side
    tables committed ahead of it: this version publishes them together and cannot."""
    stage(settings, [batch(1, ev(1, "INSERT", "1", {"v": 1.5}))])
    apply_all(spark, settings)  # v double
    stage(settings, [batch(2, ev(2, "INSERT", "2", {"v": 5}))])
    with pytest.raises(SimulatedCrash):
        apply_all(spark, settings, crash_at=OLDER_AUX_CRASH)  # (s, 2) logged as applied
    stage(settings, [batch(3, ev(3, "INSERT", "3", {"v": "x"}))])  # lands before the retry
    (r,) = apply_all(spark, settings)  # finishes the crashed run's object only
    assert (r["objects"], r["resumed"], r["pending_total"]) == (1, True, 2)
    changes = set(event_ids(settings, "t" + CHANGES_SUFFIX))
    quarantined = set(event_ids(settings, "t" + QUARANTINE_SUFFIX))
    assert not changes & quarantined, "an event is either accepted or quarantined"
    assert ("2" in rows(spark, settings)) == (("s", 2) in changes)
    (r,) = apply_all(spark, settings)  # then what landed meanwhile
    assert (r["objects"], r["quarantined"], "resumed" in r) == (1, 1, False)
    assert set(event_ids(settings, "t" + QUARANTINE_SUFFIX)) == {("s", 3)}
    assert rows(spark, settings) == {"1": {"v": 1.5}, "2": {"v": 5.0}}


def test_a_struct_column_gains_fields_in_a_run_that_also_has_values_of_another_kind(
    spark: Any, settings: Settings
) -> None:
    """Inference merges objects and strings into a string: the run's new struct (and array
    element) fields are then found from each value, not lost."""
    b1 = batch(1, ev(1, "INSERT", "1", {"info": {"a": 1}, "tags": [{"k": "x"}]}))
    b2 = batch(
        2,
        ev(2, "INSERT", "2", {"info": {"a": 2, "b": "new", "c": {"d": 2.5}}, "tags": [{"k": "y", "w": 7}]}),
        ev(3, "INSERT", "3", {"info": "abc", "tags": "nope"}),
    )
    for b in (b1, b2):
        stage(settings, [b])
        apply_all(spark, settings)
    schema = spark.table(table_ident(settings, "t")).schema
    assert column_types(schema) == {
        "info": {"a": "bigint", "b": "string", "c": {"d": "double"}},
        "tags": [{"k": "string", "w": "bigint"}],
    }
    expected = expected_runs([[b1], [b2]])
    assert column_types(schema) == expected.types["t"]
    assert rows(spark, settings) == {
        "1": {"info": {"a": 1, "b": None, "c": None}, "tags": [{"k": "x", "w": None}]},
        "2": {"info": {"a": 2, "b": "new", "c": {"d": 2.5}}, "tags": [{"k": "y", "w": 7}]},
    }
    assert not diff(expected.tables["t"], rows(spark, settings))
    q = {x["_cdc_row_id"]: x["_cdc_reason"] for x in spark.table(table_ident(settings, "t__quarantine")).collect()}
    assert q == {
        "3": 'column info: string "abc" does not fit struct<a:bigint,b:string,c:struct<d:double>>; '
        'column tags: string "nope" does not fit array<struct<k:string,w:bigint>>'
    }


def test_an_unavailable_placeholder_in_a_column_of_another_type_keeps_the_stored_value(
    spark: Any, settings: Settings
) -> None:
    u = "__debezium_unavailable_value"
    b1 = batch(1, ev(1, "INSERT", "1", {"n": 1, "doc": {"x": 1}, "s": "a"}))
    b2 = batch(2, ev(2, "UPDATE", "1", {"n": u, "doc": u, "s": "b"}), ev(3, "INSERT", "2", {"n": 2, "doc": None}))
    for b in (b1, b2):
        stage(settings, [b])
        apply_all(spark, settings)
    assert rows(spark, settings) == {"1": {"n": 1, "doc": {"x": 1}, "s": "b"}, "2": {"n": 2, "doc": None, "s": None}}
    assert event_ids(settings, "t" + QUARANTINE_SUFFIX) == []
    assert not diff(expected_runs([[b1], [b2]]).tables["t"], rows(spark, settings))


def test_unavailable_values_keep_the_stored_value(spark: Any, settings: Settings) -> None:
    u = "__debezium_unavailable_value"
    b1 = batch(
        1,
        ev(1, "INSERT", "1", {"id": 1, "doc": "big text", "n": 1}),
        ev(2, "INSERT", "2", {"id": 2, "doc": "x", "n": 2}),
    )
    # key 1: placeholder against the stored row; key 2: against an earlier event in the same run.
    b2 = batch(
        2,
        ev(3, "UPDATE", "1", {"id": 1, "doc": u, "n": 10}),
        ev(4, "UPDATE", "2", {"id": 2, "doc": "y", "n": 20}),
        ev(5, "UPDATE", "2", {"id": 2, "doc": u, "n": 21}),
    )
    for b in (b1, b2):
        stage(settings, [b])
        apply_all(spark, settings)
    assert rows(spark, settings) == {"1": {"id": 1, "doc": "big text", "n": 10}, "2": {"id": 2, "doc": "y", "n": 21}}
    assert not diff(expected_tables([b1, b2])["t"], rows(spark, settings))


def test_configured_partitioning_and_merge_mode(spark: Any, spark_home: Path, tmp_path: Path) -> None:
    cfg = tmp_path / "tables.toml"
    cfg.write_text('[tables.t]\npartition_by = ["bucket(4, _cdc_row_id)", "region"]\nmerge_mode = "merge-on-read"\n')
    settings = fresh_settings(spark_home, table_config=cfg)
    b1 = batch(1, *[ev(i, "INSERT", str(i), {"id": i}) for i in range(1, 9)])
    b2 = batch(2, *[ev(10 + i, "UPDATE", str(i), {"id": i, "region": "eu" if i % 2 else "us"}) for i in range(1, 5)])
    stage(settings, [b1])
    apply_all(spark, settings)
    stage(settings, [b2])
    apply_all(spark, settings)
    ident = table_ident(settings, "t")
    props = {r["key"]: r["value"] for r in spark.sql(f"SHOW TBLPROPERTIES {ident}").collect()}
    assert props["write.merge.mode"] == "merge-on-read"
    # The region column appeared in the second batch: its partition field was added then.
    assert props["cdclake.partition-by"] == '["bucket(4, _cdc_row_id)", "region"]'
    partition_fields = spark.table(f"{ident}.partitions").schema["partition"].dataType.fieldNames()
    assert partition_fields == ["_cdc_row_id_bucket_4", "region"]
    summary = spark.sql(f"SELECT summary FROM {ident}.snapshots ORDER BY committed_at DESC LIMIT 1").collect()[0][0]
    assert int(summary.get("total-position-deletes", "0")) > 0  # merge-on-read wrote delete files
    assert not diff(expected_tables([b1, b2])["t"], rows(spark, settings))


def test_compaction_between_applies_changes_no_result(spark: Any, settings: Settings) -> None:
    w = generate(events=300, seed=31, tables=("orders",), batch_size=50)
    ident = table_ident(settings, "orders")
    for i, b in enumerate(w.batches):
        stage(settings, [b])
        apply_all(spark, settings)
        if i % 3 == 2:
            spark.sql(
                f"CALL {settings.catalog_name}.system.rewrite_data_files(table => '{settings.namespace}.orders', "
                "options => map('rewrite-all', 'true'))"
            ).collect()
    ops = [r[0] for r in spark.sql(f"SELECT operation FROM {ident}.snapshots").collect()]
    assert "replace" in ops  # compaction snapshots (no watermark) sit in the ancestry
    assert not diff(expected_tables(w.batches)["orders"], rows(spark, settings, "orders"))
    (r,) = apply_all(spark, settings)
    assert r["committed"] is False  # the watermark was found behind the compaction snapshots


def test_compaction_committing_inside_an_apply_changes_no_result(
    spark: Any, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Maintenance commits after the apply classified its events against the table but before
    its MERGE: the MERGE plans against the compacted snapshot and the result is unchanged."""
    import spark_jobs.apply as job
    import spark_jobs.commit as commit
    from spark_jobs.pending import TOMBSTONES

    w = generate(events=200, seed=41, tables=("orders",), batch_size=50, duplicate_every=0)
    half = len(w.batches) // 2
    stage(settings, w.batches[:half])
    apply_all(spark, settings)
    stage(settings, w.batches[half:])

    real_merge = commit.merge_rows
    raced: list[str] = []

    def merge_after_a_compaction(spark_: Any, ident: str, *args: Any, **kwargs: Any) -> None:
        if not raced and not ident.endswith(TOMBSTONES):
            raced.append(ident)
            spark_.sql(
                f"CALL {settings.catalog_name}.system.rewrite_data_files(table => '{settings.namespace}.orders', "
                "options => map('rewrite-all', 'true'))"
            ).collect()
        real_merge(spark_, ident, *args, **kwargs)

    monkeypatch.setattr(commit, "merge_rows", merge_after_a_compaction)
    result = job.apply_with_retries(spark, settings, "orders", 10_000)
    assert raced and result["attempts"] == 1
    monkeypatch.undo()
    assert not diff(expected_tables(w.batches)["orders"], rows(spark, settings, "orders"))
    changes = spark.table(table_ident(settings, "orders__changes"))
    assert changes.count() == changes.select("_cdc_source", "_cdc_seq").distinct().count()


def test_commit_conflicts_rerun_the_apply_other_errors_do_not(monkeypatch: pytest.MonkeyPatch) -> None:
    """A losing optimistic commit cannot be caused on demand here (the race is inside Iceberg's
    commit), so its exception is simulated; everything after it is the real retry path."""
    import spark_jobs.apply as job
    from spark_jobs.decide import AccountingError

    calls: list[int] = []

    def flaky(*args: Any, **kwargs: Any) -> list[dict[str, Any]]:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("org.apache.iceberg.exceptions.CommitFailedException: metadata location changed")
        return [{"table": "t", "committed": True}]

    @contextlib.contextmanager
    def unlocked(*args: Any, **kwargs: Any) -> Iterator[str]:
        yield "test"  # the lock is tests/jobs/test_apply_lock.py's subject

    monkeypatch.setattr(job, "table_lock", unlocked)
    monkeypatch.setattr(job, "refresh_tables", lambda *args: None)
    monkeypatch.setattr(job, "apply_tables", flaky)
    monkeypatch.setattr("spark_jobs.apply.time.sleep", lambda s: None)
    alone = types.SimpleNamespace(consistent_publish=False)
    assert job.apply_with_retries(None, alone, "t", 1) == {"table": "t", "committed": True, "attempts": 2}  # type: ignore[arg-type]

    def broken(*args: Any, **kwargs: Any) -> dict[str, Any]:
        raise AccountingError("received 3 != accounted 2")

    monkeypatch.setattr(job, "apply_tables", broken)
    with pytest.raises(AccountingError):
        job.apply_with_retries(None, alone, "t", 1)  # type: ignore[arg-type]
