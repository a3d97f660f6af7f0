"""Issue 13, finding 3: a mapped task applies its group of tables in turn (spark_jobs/group.py),
through the same ``main`` the plain job runs, on real Spark + Iceberg tables."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from cdclake.dev.reference import diff, expected_tables
from cdclake.dev.workload import generate
from cdclake.lake.locks import table_lock
from cdclake.lake.spark import table_ident
from spark_jobs import apply, group
from tests.support import fresh_settings, stage, table_rows

pytestmark = pytest.mark.spark


def test_a_group_job_applies_each_of_its_tables(spark: Any, spark_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = fresh_settings(spark_home)
    for name, value in settings.as_env().items():  # the job reads its settings from the environment
        monkeypatch.setenv(name, value)
    tables = ("alpha", "beta", "gamma")
    w = generate(events=90, seed=3, tables=tables, batch_size=30, duplicate_every=0)
    stage(settings, w.batches)
    runs = [["--table", t, "--max-objects", "1000"] for t in tables]
    result = group.main(spark, ["--module", "spark_jobs.apply", "--runs", json.dumps(runs)])
    assert [r["table"] for r in result["runs"]] == list(tables)
    expected = expected_tables(w.batches)
    for t in tables:
        assert not diff(expected[t], table_rows(spark, table_ident(settings, t))), t
    # A retry of the whole group (Airflow's, after one table failed) applies nothing twice.
    again = group.main(spark, ["--module", "spark_jobs.apply", "--runs", json.dumps(runs)])
    assert all(r.get("objects", 0) == 0 for r in again["runs"]), again


def test_a_draining_task_applies_micro_batch_after_micro_batch(
    spark: Any, spark_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One object per pass (``--max-objects 1``): one drain call keeps applying until a pass finds
    nothing, one commit per object, and ends where the reference model does. A compaction that
    starts waiting for the table's lock during the first pass gets it before the second: the
    drain holds the lock per micro-batch, not for the whole drain."""
    settings = fresh_settings(spark_home)
    for name, value in settings.as_env().items():
        monkeypatch.setenv(name, value)
    order: list[str] = []
    waiter: list[threading.Thread] = []
    apply_tables = apply.apply_tables

    def compact() -> None:
        with table_lock(settings, "delta", "compact", wait_s=300):
            order.append("compact")

    def observed(spark: Any, settings: Any, run: list[str], max_objects: int) -> list[dict[str, Any]]:
        [table] = run
        order.append(table)
        if table == "delta" and not waiter:  # the first pass holds delta's lock here
            waiter.append(threading.Thread(target=compact))
            waiter[0].start()
            time.sleep(2)  # it queues for the lock while this pass still holds it
        return apply_tables(spark, settings, run, max_objects)

    monkeypatch.setattr(apply, "apply_tables", observed)
    tables = ("delta", "epsilon")
    w = generate(events=120, seed=5, tables=tables, batch_size=30, duplicate_every=0)
    keys = stage(settings, w.batches)
    objects = {t: sum(k.table == t for k in keys) for t in tables}
    assert min(objects.values()) >= 3, objects
    runs = [["--table", t, "--max-objects", "1"] for t in tables]
    result = group.main(spark, ["--module", "spark_jobs.apply", "--runs", json.dumps(runs), "--drain-seconds", "600"])
    per_table = {t: [r["objects"] for r in result["runs"] if r["table"] == t] for t in tables}
    assert per_table == {t: [1] * n + [0] for t, n in objects.items()}, per_table
    assert result["passes"] == max(objects.values()) + 1
    waiter[0].join(timeout=60)
    second_delta = order.index("delta", 1)
    assert "compact" in order[:second_delta], order  # not only after the whole drain
    expected = expected_tables(w.batches)
    for t in tables:
        assert not diff(expected[t], table_rows(spark, table_ident(settings, t))), t
        applies = spark.sql(f"SELECT count(*) AS n FROM {table_ident(settings, t)}.snapshots").first()
        assert applies is not None and applies["n"] >= objects[t], t  # a commit per micro-batch
