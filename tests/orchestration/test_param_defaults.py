"""The DAGs' Param defaults are not second copies: cdc_apply's max_objects defers to
CDCLAKE_MAX_OBJECTS_PER_RUN, the maintenance DAGs' defaults are cdclake.config.maintenance's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cdclake.config import maintenance
from tests.orchestration.test_dags import runs_of

DAGS = Path(__file__).resolve().parents[2] / "dags"


@pytest.fixture(scope="module")
def dagbag():  # type: ignore[no-untyped-def]
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(DAGS))


def _defaults(dag: Any) -> dict[str, Any]:
    return {name: dag.params[name] for name in dag.params}


def test_cdc_apply_max_objects_is_the_setting_unless_the_run_says(dagbag, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(
        "cdclake.lake.catalog.pending_tables", lambda settings, only=None, store=None, unreadable=None: {"t": 3}
    )
    dag = dagbag.dags["cdc_apply"]
    params = _defaults(dag)
    assert params["max_objects"] is None  # a number here would shadow the setting
    plan = dag.get_task("plan").python_callable
    monkeypatch.setenv("CDCLAKE_MAX_OBJECTS_PER_RUN", "7")
    [job] = plan(params=params)
    assert runs_of(job) == [["--table", "t", "--max-objects", "7"]]
    [job] = plan(params={**params, "max_objects": 3})
    assert runs_of(job) == [["--table", "t", "--max-objects", "3"]]


def test_maintenance_params_default_to_the_one_place(dagbag) -> None:  # type: ignore[no-untyped-def]
    comp = _defaults(dagbag.dags["iceberg_compaction"])
    assert comp["target_file_size_bytes"] == maintenance.TARGET_FILE_SIZE_BYTES
    assert comp["min_input_files"] == maintenance.MIN_INPUT_FILES
    exp = _defaults(dagbag.dags["iceberg_expire"])
    assert exp["retain_last"] == maintenance.RETAIN_LAST
    assert exp["snapshot_max_age_hours"] == maintenance.SNAPSHOT_MAX_AGE_HOURS
    assert exp["orphan_min_age_hours"] == maintenance.ORPHAN_MIN_AGE_HOURS
    assert exp["staging_retention_hours"] == maintenance.STAGING_RETENTION_HOURS
