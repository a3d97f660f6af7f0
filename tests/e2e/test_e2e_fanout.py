"""End to end, issue 13 findings 3 and 9 on the real parts: 50 flushes (30 at once) while
``cdc_apply`` is paused make ONE run, answered to all of them; five tables are applied in two
mapped tasks (CDCLAKE_APPLY_TASKS=2, groups on the stack's Spark Connect server), and once
that run is done the tables match the reference model."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from cdclake.dev.reference import diff, expected_tables
from cdclake.dev.workload import generate
from tests.support import attach_catalog, running_stack, table_rows

pytestmark = [pytest.mark.e2e, pytest.mark.spark]
TABLES = tuple(f"g{i}" for i in range(5))


def test_flushes_share_one_run_that_applies_grouped_tables(tmp_path: Path, spark: Any) -> None:
    with running_stack(tmp_path, catalog_name="grp", landing_grace_s=5, apply_tasks=2) as stack:
        settings, af = stack.settings, stack.airflow
        af.wait_dag("cdc_apply")
        af.pause("cdc_apply")  # runs stay queued: what the flushes must find and share
        w = generate(events=300, seed=4, tables=TABLES, batch_size=30)
        with httpx.Client(base_url=settings.receiver_url, timeout=60) as http:
            for b in w.batches:
                assert http.post("/v1/batches", json=b).status_code == 200
            with ThreadPoolExecutor(10) as pool:
                answers = list(pool.map(lambda _: http.post("/flush"), range(30)))
            answers += [http.post("/flush") for _ in range(20)]
        assert {a.status_code for a in answers} == {202}, {a.text for a in answers if a.status_code != 202}
        run_ids = {a.json()["dag_run_id"] for a in answers}
        assert len(run_ids) == 1, run_ids
        run_id = run_ids.pop()
        runs = af.json("GET", "/api/v2/dags/cdc_apply/dagRuns")["dag_runs"]
        assert [r["dag_run_id"] for r in runs if r["run_type"] == "manual"] == [run_id]

        af.unpause("cdc_apply")
        assert af.wait_run("cdc_apply", run_id, timeout=1200, progress=print) == "success"
        # A scheduled run (every 5 minutes) may have gone first and applied the data; either way
        # every run mapped at most two apply tasks, and two of them applied the five tables.
        applies = {
            r["dag_run_id"]: [t for t in af.task_instances("cdc_apply", r["dag_run_id"]) if t["task_id"] == "apply"]
            for r in af.json("GET", "/api/v2/dags/cdc_apply/dagRuns")["dag_runs"]
        }
        assert all(len(tis) <= 2 for tis in applies.values()), applies
        done = [t for tis in applies.values() for t in tis if t["state"] == "success" and t["map_index"] >= 0]
        assert len(done) >= 2 and not [t for tis in applies.values() for t in tis if t["state"] == "failed"]

        attach_catalog(spark, settings)
        expected = expected_tables(w.batches)
        for t in TABLES:
            assert not diff(expected[t], table_rows(spark, f"grp.cdc.{t}")), t
