"""cdclake's auth manager (cdclake/orchestration/airflow_auth.py) asked directly, as Airflow's
routes ask it: the receiver's login (role op) may list assets, post their events and list or
trigger cdc_apply's runs, nothing else; another login of the same role keeps all of op. The
real api-server is asked in tests/deploy/test_embedded_privileges.py."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import yaml

from cdclake.lake.bootstrap import AUTH_MANAGER, RECEIVER_USER
from tests.support import make_settings

if TYPE_CHECKING:
    from cdclake.orchestration.airflow_auth import CdclakeAuthManager


@pytest.fixture
def manager() -> CdclakeAuthManager:
    from cdclake.orchestration.airflow_auth import CdclakeAuthManager

    return CdclakeAuthManager()  # type: ignore[no-untyped-call]


def asked(m: CdclakeAuthManager, user_name: str) -> dict[str, bool]:
    from airflow.api_fastapi.auth.managers.models.resource_details import (
        AccessView,
        ConnectionDetails,
        DagAccessEntity,
        DagDetails,
        VariableDetails,
    )
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

    user = SimpleAuthManagerUser(username=user_name, role="op")
    run = DagAccessEntity.RUN

    def dag(method: str, dag_id: str | None, entity: DagAccessEntity | None = run) -> bool:
        return m.is_authorized_dag(method=method, user=user, access_entity=entity, details=DagDetails(id=dag_id))

    return {
        "list cdc_apply runs": dag("GET", "cdc_apply"),
        "trigger cdc_apply": dag("POST", "cdc_apply"),
        "post an asset event": m.is_authorized_asset(method="POST", user=user),
        "list assets": m.is_authorized_asset(method="GET", user=user)
        and m.is_authorized_asset_alias(method="GET", user=user),
        "trigger iceberg_expire": dag("POST", "iceberg_expire"),
        "trigger any dag (~)": dag("POST", None),
        "clear a cdc_apply run": dag("PUT", "cdc_apply"),
        "delete a cdc_apply run": dag("DELETE", "cdc_apply"),
        "read cdc_apply's logs": dag("GET", "cdc_apply", DagAccessEntity.TASK_LOGS),
        "delete an asset's queued events": m.is_authorized_asset(method="DELETE", user=user),
        "read a connection": m.is_authorized_connection(
            method="GET", user=user, details=ConnectionDetails(conn_id="spark_default")
        ),
        "change a variable": m.is_authorized_variable(method="PUT", user=user, details=VariableDetails(key="k")),
        "read pools": m.is_authorized_pool(method="GET", user=user),
        "read the configuration": m.is_authorized_configuration(method="GET", user=user),
        # What a listing of runs keeps, as Airflow's own filter asks it.
        "see cdc_apply's runs in a listing": m.filter_authorized_dag_ids(
            dag_ids={"cdc_apply", "iceberg_expire"}, user=user, method="GET"
        )
        == {"cdc_apply"},
        "see every dag's runs in a listing": m.filter_authorized_dag_ids(
            dag_ids={"cdc_apply", "iceberg_expire"}, user=user, method="GET"
        )
        == {"cdc_apply", "iceberg_expire"},
        "see the UI's views": m.is_authorized_view(access_view=AccessView.PLUGINS, user=user),
    }


WHAT_IT_DOES = {
    "list cdc_apply runs",
    "trigger cdc_apply",
    "post an asset event",
    "list assets",
    "see cdc_apply's runs in a listing",
}


def test_the_receivers_login_may_do_its_job_and_nothing_more(manager: CdclakeAuthManager) -> None:
    got = asked(manager, RECEIVER_USER)
    assert {k for k, v in got.items() if v} == WHAT_IT_DOES, got


def test_another_login_of_the_same_role_keeps_all_of_it(manager: CdclakeAuthManager) -> None:
    got = asked(manager, "an-operator")
    assert {k for k, v in got.items() if not v} == {"see cdc_apply's runs in a listing"}, got  # it sees all


def test_the_stack_and_compose_run_airflow_with_it(tmp_path: Path) -> None:
    from cdclake.dev.stack import LocalStack
    from cdclake.orchestration.airflow_auth import CLASS_PATH

    assert AUTH_MANAGER == CLASS_PATH
    assert LocalStack(make_settings(tmp_path)).env()["AIRFLOW__CORE__AUTH_MANAGER"] == AUTH_MANAGER
    compose = yaml.safe_load((Path(__file__).resolve().parents[2] / "docker-compose.yaml").read_text())
    assert compose["x-airflow-env"]["AIRFLOW__CORE__AUTH_MANAGER"] == AUTH_MANAGER
