"""DAG integrity: every DAG imports cleanly and cdc_apply keeps its guarantees."""

from __future__ import annotations

from pathlib import Path

import pytest

DAGS = Path(__file__).resolve().parent.parent / "dags"


@pytest.fixture(scope="module")
def dagbag():  # type: ignore[no-untyped-def]
    # AIRFLOW_HOME points at a temporary folder (tests/conftest.py) before airflow is imported.
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(DAGS))


def test_every_dag_imports_without_errors(dagbag) -> None:  # type: ignore[no-untyped-def]
    assert dagbag.import_errors == {}
    assert {p.stem for p in DAGS.glob("*.py")} <= set(dagbag.dag_ids)


def test_every_dag_is_documented_owned_and_tagged(dagbag) -> None:  # type: ignore[no-untyped-def]
    for dag_id, dag in dagbag.dags.items():
        assert dag.doc_md, dag_id
        assert dag.tags, dag_id
        for t in dag.tasks:
            assert t.owner == "cdclake", (dag_id, t.task_id)
            assert t.retries >= 1 and t.execution_timeout is not None, (dag_id, t.task_id)


def test_cdc_apply_never_runs_twice_at_once_and_has_its_params(dagbag) -> None:  # type: ignore[no-untyped-def]
    dag = dagbag.dags["cdc_apply"]
    assert dag.max_active_runs == 1
    assert {"tables", "max_objects"} <= set(dag.params)
    assert {t.task_id for t in dag.tasks} == {"plan", "apply"}
    assert dag.get_task("apply").upstream_task_ids == {"plan"}


def test_maintenance_dags_have_their_params_and_order(dagbag) -> None:  # type: ignore[no-untyped-def]
    comp = dagbag.dags["iceberg_compaction"]
    assert {"tables", "target_file_size_bytes", "min_input_files", "partial_progress", "where"} <= set(comp.params)
    assert comp.get_task("compact").upstream_task_ids == {"candidates"}
    exp = dagbag.dags["iceberg_expire"]
    assert {"retain_last", "snapshot_max_age_hours", "orphan_min_age_hours", "dry_run"} <= set(exp.params)
    assert exp.get_task("clean_staging").upstream_task_ids == {"expire"}
    for dag in (comp, exp):
        assert (dag.max_active_runs == 1 and dag.schedule is not None) or dag.timetable is not None


def test_cdc_apply_is_scheduled_on_the_receivers_asset(dagbag) -> None:  # type: ignore[no-untyped-def]
    from cdclake.staging import ASSET_NAME

    dag = dagbag.dags["cdc_apply"]
    names = (
        {a.name for a in dag.timetable.asset_condition.iter_assets().values()}
        if hasattr(dag.timetable.asset_condition, "iter_assets")
        else set()
    )
    assert ASSET_NAME in names or ASSET_NAME in repr(dag.timetable.asset_condition)
