"""Airflow's simple auth manager with one login narrowed to its job: the receiver's.

The simple auth manager knows four roles and no per-DAG rights: posting an Asset event
(``POST /api/v2/assets/events``) needs OP, and OP may also trigger, clear and delete the runs of
every DAG (``iceberg_expire`` among them) and read and change connections, variables and pools.
A role cannot be narrowed, so this subclass (``[core] auth_manager``, set by the embedded stack
and docker-compose) lets :data:`RECEIVER_USER` do only what the receiver does, and on top of its
role (``op``) still:

* assets: list them (GET, which also asks for asset aliases) and post their events (POST);
* ``cdc_apply``'s runs: list them (their listing shows ``cdc_apply``'s alone) and trigger one
  (``POST /flush``); no other DAG, no other
  entity of it (tasks, logs, XComs), no change to a run (PUT, DELETE);
* nothing else: no connection, variable, pool, configuration, view or menu.

Every other login is the simple auth manager's, unchanged. An Asset event triggers the DAGs
scheduled on that asset: ``cdc_apply`` is the only one here (on ``cdclake://staging``).
"""

from __future__ import annotations

from typing import Any

from airflow.api_fastapi.auth.managers.models.resource_details import (
    AccessView,
    AssetAliasDetails,
    AssetDetails,
    ConfigurationDetails,
    ConnectionDetails,
    DagAccessEntity,
    DagDetails,
    PoolDetails,
    TeamDetails,
    VariableDetails,
)
from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager
from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
from airflow.api_fastapi.common.types import MenuItem

from cdclake.lake.bootstrap import RECEIVER_USER

APPLY_DAG = "cdc_apply"
CLASS_PATH = f"{__name__}.CdclakeAuthManager"
"""``AIRFLOW__CORE__AUTH_MANAGER``."""


def narrowed(user: SimpleAuthManagerUser) -> bool:
    return user.get_name() == RECEIVER_USER


class CdclakeAuthManager(SimpleAuthManager):
    def is_authorized_dag(
        self,
        *,
        method: Any,
        user: SimpleAuthManagerUser,
        access_entity: DagAccessEntity | None = None,
        details: DagDetails | None = None,
    ) -> bool:
        if narrowed(user) and not (
            details is not None
            and details.id == APPLY_DAG
            and access_entity == DagAccessEntity.RUN
            and method in ("GET", "POST")
        ):
            return False
        return super().is_authorized_dag(method=method, user=user, access_entity=access_entity, details=details)

    def filter_authorized_dag_ids(
        self, *, dag_ids: set[str], user: SimpleAuthManagerUser, method: Any = "GET", team_name: str | None = None
    ) -> set[str]:
        # A listing of runs keeps the runs of the DAGs this filter returns; Airflow's own asks
        # is_authorized_dag without an entity, which the receiver's login is refused: its listing
        # of cdc_apply's runs came back empty, and every /flush made a new run.
        if narrowed(user):
            return dag_ids & {APPLY_DAG} if method == "GET" else set()
        return super().filter_authorized_dag_ids(dag_ids=dag_ids, user=user, method=method, team_name=team_name)

    def is_authorized_asset(
        self, *, method: Any, user: SimpleAuthManagerUser, details: AssetDetails | None = None
    ) -> bool:
        if narrowed(user) and method not in ("GET", "POST"):
            return False
        return super().is_authorized_asset(method=method, user=user, details=details)

    def is_authorized_asset_alias(
        self, *, method: Any, user: SimpleAuthManagerUser, details: AssetAliasDetails | None = None
    ) -> bool:
        if narrowed(user) and method != "GET":  # GET /api/v2/assets asks for aliases too
            return False
        return super().is_authorized_asset_alias(method=method, user=user, details=details)

    def is_authorized_connection(
        self, *, method: Any, user: SimpleAuthManagerUser, details: ConnectionDetails | None = None
    ) -> bool:
        return not narrowed(user) and super().is_authorized_connection(method=method, user=user, details=details)

    def is_authorized_variable(
        self, *, method: Any, user: SimpleAuthManagerUser, details: VariableDetails | None = None
    ) -> bool:
        return not narrowed(user) and super().is_authorized_variable(method=method, user=user, details=details)

    def is_authorized_pool(
        self, *, method: Any, user: SimpleAuthManagerUser, details: PoolDetails | None = None
    ) -> bool:
        return not narrowed(user) and super().is_authorized_pool(method=method, user=user, details=details)

    def is_authorized_configuration(
        self, *, method: Any, user: SimpleAuthManagerUser, details: ConfigurationDetails | None = None
    ) -> bool:
        return not narrowed(user) and super().is_authorized_configuration(method=method, user=user, details=details)

    def is_authorized_team(
        self, *, method: Any, user: SimpleAuthManagerUser, details: TeamDetails | None = None
    ) -> bool:
        return not narrowed(user) and super().is_authorized_team(method=method, user=user, details=details)

    def is_authorized_view(self, *, access_view: AccessView, user: SimpleAuthManagerUser) -> bool:
        return not narrowed(user) and super().is_authorized_view(access_view=access_view, user=user)

    def is_authorized_custom_view(self, *, method: Any, resource_name: str, user: SimpleAuthManagerUser) -> bool:
        if narrowed(user):
            return False
        allowed: bool = super().is_authorized_custom_view(method=method, resource_name=resource_name, user=user)
        return allowed

    def is_authorized_hitl_task(self, *, assigned_users: set[str], user: SimpleAuthManagerUser) -> bool:
        return not narrowed(user) and super().is_authorized_hitl_task(assigned_users=assigned_users, user=user)

    def filter_authorized_menu_items(
        self, menu_items: list[MenuItem], *, user: SimpleAuthManagerUser
    ) -> list[MenuItem]:
        return [] if narrowed(user) else super().filter_authorized_menu_items(menu_items, user=user)
