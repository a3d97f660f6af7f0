"""A table whose metadata is lost never stops the others (issue 28).

Once a purge deleted every file of ``employees`` (its catalog row stayed), every ``cdc_apply``
plan failed on it (FileNotFoundError) and no table applied until an operator removed it by hand.
Here ``employees``'s files are deleted beside a healthy ``orders``, both with staging objects
pending: the apply plan applies ``orders`` and names ``employees`` in its log, ``cdc_freshness``
fails naming it (the alert), the maintenance plans and the staging clean-up go on without it,
and ``/metrics`` says which table it is. The maintenance plan also spares the files of a table
another one squats on (made before the REST catalog refused it): no orphan clean-up for either."""

from __future__ import annotations

import logging
import shutil
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from cdclake import staging
from cdclake.config.settings import Settings
from tests.orchestration.test_dags import runs_of, table_of
from tests.support import make_settings, stage
from tests.support.receiver import batch
from tests.support.rest import seed_table, sql_catalog

DAGS = Path(__file__).resolve().parents[2] / "dags"


@pytest.fixture(scope="module")
def dagbag():  # type: ignore[no-untyped-def]
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(DAGS))


@pytest.fixture()
def lake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Settings]:
    """``cdc.orders`` and ``cdc.employees``, each with rows and a pending staging object; then
    every file of ``employees`` deleted, its catalog row left."""
    monkeypatch.setenv("CDCLAKE_HOME", str(tmp_path))
    monkeypatch.setenv("CDCLAKE_SPARK_CONNECT_URL", "sc://127.0.0.1:15002")
    settings = make_settings(tmp_path)
    assert settings.namespace == "cdc"
    lost = seed_table(settings, ("cdc", "employees"))
    seed_table(settings, ("cdc", "orders"))
    stage(settings, [batch("s1", 1, ["orders", "employees"])])
    shutil.rmtree(Path(lost.location().removeprefix("file://")))
    yield settings


def _planned(jobs: list[dict[str, Any]]) -> list[str]:
    return sorted(table_of(a) for job in jobs for a in runs_of(job))


def test_cdc_apply_plans_the_other_tables_and_names_the_lost_one(
    dagbag: Any, lake: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    plan = dagbag.dags["cdc_apply"].get_task("plan").python_callable
    with caplog.at_level(logging.ERROR):
        jobs = plan(params={"tables": [], "max_objects": 10})
    assert _planned(jobs) == ["orders"]
    assert any("TABLE UNREADABLE employees" in r.getMessage() for r in caplog.records), caplog.text
    # Asked for by name, it is left out the same way.
    assert _planned(plan(params={"tables": ["employees", "orders"], "max_objects": 10})) == ["orders"]


def test_cdc_freshness_fails_naming_the_lost_table(dagbag: Any, lake: Settings) -> None:
    from airflow.sdk.exceptions import AirflowFailException

    check = dagbag.dags["cdc_freshness"].get_task("check").python_callable
    with pytest.raises(AirflowFailException) as raised:
        check()
    assert str(raised.value).startswith("TABLE UNREADABLE employees: its metadata cannot be read (")
    assert "orders" not in str(raised.value)  # measured, and within its objective


def expire_plan(dagbag: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    plan = dagbag.dags["iceberg_expire"].get_task("plan").python_callable
    monkeypatch.setitem(plan.__globals__, "_interval_end", lambda: datetime(2026, 3, 1, tzinfo=UTC))
    return plan


def test_maintenance_plans_and_staging_clean_up_go_on_without_it(
    dagbag: Any, lake: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cdclake.lake.cleanup import clean_staging

    expire = expire_plan(dagbag, monkeypatch)
    assert _planned(expire(params={})) == ["orders"]
    compact = dagbag.dags["iceberg_compaction"].get_task("candidates").python_callable
    assert _planned(compact(params={"tables": ["employees", "orders"]})) == ["orders"]
    store = staging.LocalStaging(lake.staging_dir)
    before = [k.path for k in store.list("employees")]
    result = clean_staging(lake, cutoff_ms=2**62)
    assert result["objects_not_yet_applied"] == 2
    assert [k.path for k in store.list("employees")] == before  # what it consumed is not known: kept


def test_metrics_name_the_lost_table_and_serve_the_others(lake: Settings) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from restcatalog.lakemetrics import LakeCollector

    registry = CollectorRegistry()
    registry.register(LakeCollector(lake))
    text = generate_latest(registry).decode()
    assert 'cdclake_table_unreadable{table="employees"} 1.0' in text
    assert "cdclake_lake_metrics_up 1.0" in text
    assert 'cdclake_table_pending_objects{table="orders"} 1.0' in text
    assert 'cdclake_table_pending_objects{table="employees"}' not in text


def test_no_orphan_clean_up_where_two_tables_overlap(
    dagbag: Any, lake: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    orders = sql_catalog(lake).load_table(("cdc", "orders"))
    seed_table(lake, ("cdc", "squat"), location=orders.location() + "/data")
    seed_table(lake, ("cdc", "apart"), location=orders.location() + "2")
    plan = expire_plan(dagbag, monkeypatch)
    argvs = {table_of(a): a for job in plan(params={}) for a in runs_of(job)}
    assert sorted(argvs) == ["apart", "orders", "squat"]
    assert {t for t, a in argvs.items() if "--orphans-older-than" in a} == {"apart"}
