"""Issue 13, finding 3: a mapped task applies its group of tables in turn (spark_jobs/group.py),
through the same ``main`` the plain job runs, on real Spark + Iceberg tables."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cdclake.dev.reference import diff, expected_tables
from cdclake.dev.workload import generate
from cdclake.lake.spark import table_ident
from spark_jobs import group
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
