"""Every read sees the newest committed snapshot, however often it asks: a client polling the query
API every second, and a ``cdclake sql`` session that lives across commits, each see every apply's
commit in their next answer after it (issue 28, finding 8: Iceberg's caching catalog kept a table
until 30 s after its last use, so a poller faster than that never saw a new snapshot).

The rows are compared with the reference model after each commit; the snapshot with the table's
own current one, read with pyiceberg."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from cdclake.dev.reference import diff, expected_tables, rows_by_key
from cdclake.dev.workload import generate
from cdclake.lake.catalog import load_table
from tests.support import apply_all, fresh_settings, stage
from tests.support.query import served

TABLE = "orders"


def parts(n: int) -> list[list[dict[str, Any]]]:
    """The workload's batches in ``n`` runs, no retried batch parted from its original."""
    b = generate(events=200, seed=11, tables=(TABLE,), batch_size=20, keys_per_table=30).batches
    cuts = [0]
    for i in range(1, len(b)):
        if len(cuts) < n and i >= len(b) * len(cuts) // n and b[i]["sequenceNumber"] != b[i - 1]["sequenceNumber"]:
            cuts.append(i)
    return [b[a:z] for a, z in zip(cuts, [*cuts[1:], len(b)], strict=True)]


def current_snapshot(settings: Any) -> int:
    t = load_table(settings, TABLE)
    assert t is not None and t.current_snapshot() is not None
    return t.current_snapshot().snapshot_id  # type: ignore[union-attr]


@pytest.mark.spark
def test_a_client_polling_every_second_sees_each_commit_in_its_next_answer(
    spark: Any, connect_url: str, spark_home: Path
) -> None:
    settings = fresh_settings(spark_home)
    runs = parts(4)
    stage(settings, runs[0])
    apply_all(spark, settings)
    answers: list[tuple[float, dict[str, Any]]] = []  # (when the question was sent, the answer)
    stop = threading.Event()
    with served(settings, connect_url) as api:

        def poll() -> None:
            while not stop.is_set():
                asked = time.monotonic()
                r = api.post("/v1/query", json={"sql": f"SELECT * FROM {TABLE}", "maxRows": 10_000})
                answers.append((asked, r.json()))
                stop.wait(1.0)

        poller = threading.Thread(target=poll)
        poller.start()
        try:
            for upto in range(1, len(runs)):
                stage(settings, runs[upto])
                apply_all(spark, settings)
                committed, snap = time.monotonic(), current_snapshot(settings)
                deadline = committed + 120
                while not any(t > committed for t, _ in answers):
                    assert time.monotonic() < deadline, "no answer after the commit"
                    time.sleep(0.1)
                got = next(a for t, a in answers if t > committed)
                assert got["snapshots"] == [
                    {"table": f"{settings.catalog_name}.{settings.namespace}.{TABLE}", "snapshotId": snap}
                ], (upto, got)
                names = [c["name"] for c in got["columns"]]
                rows = [dict(zip(names, r, strict=True)) for r in got["rows"]]
                want = expected_tables([b for run in runs[: upto + 1] for b in run])[TABLE]
                assert not diff(want, rows_by_key(rows)), upto
        finally:
            stop.set()
            poller.join(120)
    assert len(answers) >= len(runs)


@pytest.mark.spark
def test_a_cdclake_sql_session_sees_each_commit(spark: Any, connect_url: str, spark_home: Path) -> None:
    """``cdclake sql`` on the Spark Connect server (its session lives as long as the shell): the
    same statement, asked again right after each commit, answers the new rows."""
    from cdclake.cli.query import query_session
    from cdclake.lake.spark import connect_session
    from cdclake.query.session import release

    settings = fresh_settings(spark_home)
    runs = parts(3)
    stage(settings, runs[0])
    apply_all(spark, settings)
    remote = connect_session(connect_url, mark_process=False)
    try:
        with query_session(settings, spark=remote, say=lambda _: None) as qs:
            for upto in range(len(runs)):
                if upto:
                    stage(settings, runs[upto])
                    apply_all(spark, settings)
                got = qs.run(f"SELECT * FROM {TABLE}")
                rows = [dict(zip(got.columns, r, strict=True)) for r in got.rows]
                want = expected_tables([b for run in runs[: upto + 1] for b in run])[TABLE]
                assert not diff(want, rows_by_key(rows)), upto
    finally:
        release(remote)
