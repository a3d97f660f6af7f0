"""The Lakehouse app that ``plugins/cdclake_plugin.py`` mounts in Airflow's api-server: the page
(``GET /``) and its JSON API, the compaction endpoints included (docs/operations.md).

Airflow does not authenticate a plugin's FastAPI app (it is mounted, and a mount inherits none of
the core API's dependencies), so every route here depends on Airflow's own ``get_user`` (the
``Authorization: Bearer`` JWT or the UI's ``_token`` cookie; anonymous: 401), and an action also on
``requires_access_dag("POST", RUN, <its DAG>)`` (403 for a user who may not trigger it), on proof
that the request is not another site's (:mod:`cdclake.lakehouse.same_origin`; 403), and on
the table existing (404 naming it; no run is made). An action then creates the run through
Airflow's REST API *with the caller's own token*, so the run is the user's, checked again by
Airflow, exactly as if triggered from the DAG page.

Routes are plain ``def``: FastAPI runs them in its thread pool, so pyiceberg's blocking reads never
hold the api-server's event loop. Nothing here touches the catalog before a request: an
unreachable catalog makes the page say so, not the api-server fail to start.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import httpx
from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.responses import HTMLResponse
from pydantic import BaseModel, Field

from cdclake.config.maintenance import MIN_INPUT_FILES
from cdclake.config.settings import Settings
from cdclake.lakehouse import same_origin

if TYPE_CHECKING:
    from cdclake.lakehouse.status import TableStatus

APPLY_DAG, COMPACTION_DAG, EXPIRE_DAG = "cdc_apply", "iceberg_compaction", "iceberg_expire"
DEFAULT_MIN_FILES = MIN_INPUT_FILES  # iceberg_compaction's min_input_files default
RECENT_RUNS = 10
COOKIE = "_token"  # airflow.api_fastapi.auth.managers.base_auth_manager.COOKIE_NAME_JWT_TOKEN


class TableAction(BaseModel):
    table: str = Field(min_length=1, max_length=255)


class CompactionRun(TableAction):
    where: str | None = Field(
        default=None, max_length=2000, description="Partition filter: iceberg_compaction's `where` param"
    )
    min_input_files: int = Field(default=DEFAULT_MIN_FILES, ge=1)


class AutoCompaction(BaseModel):
    min_input_files: int = Field(default=DEFAULT_MIN_FILES, ge=1)


def user_token(request: Request) -> str:
    """The credential Airflow's ``get_user`` accepted: the bearer token first, else the cookie."""
    auth = request.headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    return request.cookies.get(COOKIE, "")


def run_link(dag_id: str, run_id: str) -> str:
    """The run's page in the Airflow UI, relative to this app (mounted one level below the UI root)."""
    from urllib.parse import quote

    return f"../dags/{quote(dag_id, safe='')}/runs/{quote(run_id, safe='')}"


class Airflow:
    """Airflow's REST API, called with the requesting user's token."""

    def __init__(self, base_url: str, token: str) -> None:
        self._http = httpx.Client(base_url=base_url, timeout=30.0, headers={"Authorization": f"Bearer {token}"})

    def __enter__(self) -> Airflow:
        return self

    def __exit__(self, *exc: object) -> None:
        self._http.close()

    def trigger(self, dag_id: str, conf: dict[str, Any]) -> dict[str, str]:
        r = self._http.post(f"/api/v2/dags/{dag_id}/dagRuns", json={"logical_date": None, "conf": conf})
        if r.status_code >= 300:
            raise HTTPException(r.status_code, f"Airflow refused to trigger {dag_id}: {r.text[:300]}")
        run_id = str(r.json()["dag_run_id"])
        return {"dag_id": dag_id, "run_id": run_id, "url": run_link(dag_id, run_id)}

    def recent_runs(self, dag_id: str) -> list[dict[str, Any]]:
        r = self._http.get(f"/api/v2/dags/{dag_id}/dagRuns", params={"limit": RECENT_RUNS, "order_by": "-run_after"})
        if r.status_code >= 300:
            raise HTTPException(r.status_code, f"Airflow: {r.text[:300]}")
        keep = ("dag_run_id", "state", "run_after", "start_date", "end_date", "conf")
        return [{k: run.get(k) for k in keep} for run in r.json()["dag_runs"]]


def create_app(settings_of: Callable[[], Settings]) -> FastAPI:
    """The app; ``settings_of`` is called per request (cheap), so a test can point it anywhere."""
    from airflow.api_fastapi.core_api.security import get_user

    app = FastAPI(title="cdclake Lakehouse", dependencies=[Depends(get_user)], docs_url=None, redoc_url=None)
    _read_routes(app, settings_of)
    _action_routes(app, settings_of)
    return app


def _read_routes(app: FastAPI, settings_of: Callable[[], Settings]) -> None:
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
    from airflow.api_fastapi.core_api.security import requires_access_dag

    # What the page shows (tables, counts, quarantine reasons quoting values) is for users who may
    # read cdc_apply's runs, the DAG that writes it; being logged in is not enough.
    may_read = [Depends(requires_access_dag("GET", DagAccessEntity.RUN, param_dag_id=APPLY_DAG))]

    @app.get("/", response_class=HTMLResponse, dependencies=may_read)
    def page() -> HTMLResponse:
        from cdclake.lakehouse.page import render

        statuses, error, now_ms = _statuses(settings_of())
        return HTMLResponse(render(statuses, error, now_ms))

    @app.get("/v1/tables", dependencies=may_read)
    def tables() -> list[dict[str, Any]]:
        statuses, error, _ = _statuses(settings_of())
        if error:
            raise HTTPException(503, error)
        return [s.as_dict() for s in statuses]

    @app.get("/v1/compaction/candidates", dependencies=may_read)
    def candidates(min_input_files: int = Query(DEFAULT_MIN_FILES, ge=1)) -> dict[str, Any]:
        return {"min_input_files": min_input_files, "candidates": _candidates(settings_of(), min_input_files)}

    @app.get("/v1/compaction/metrics", dependencies=may_read)
    def metrics(request: Request) -> dict[str, Any]:
        statuses, error, _ = _statuses(settings_of())
        if error:
            raise HTTPException(503, error)
        keep = ("table", "data_files", "small_files", "delete_files", "snapshots", "compaction_candidate")
        with Airflow(settings_of().airflow_url, user_token(request)) as af:
            runs = af.recent_runs(COMPACTION_DAG)
        return {"tables": [{k: s.as_dict()[k] for k in keep} for s in statuses if s.exists], "recent_runs": runs}


def not_cross_site(request: Request) -> None:
    """403 unless the action provably comes from this origin (see :mod:`same_origin`)."""
    cookie_only = not request.headers.get("authorization", "").lower().startswith("bearer ")
    why = same_origin.refusal(request.headers, cookie_only)
    if why is not None:
        raise HTTPException(403, why)


def _action_routes(app: FastAPI, settings_of: Callable[[], Settings]) -> None:
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
    from airflow.api_fastapi.core_api.security import get_user, requires_access_dag

    def may_trigger(dag_id: str) -> Any:
        return Depends(requires_access_dag("POST", DagAccessEntity.RUN, param_dag_id=dag_id))

    def trigger(request: Request, dag_id: str, conf: dict[str, Any]) -> dict[str, str]:
        with Airflow(settings_of().airflow_url, user_token(request)) as af:
            return af.trigger(dag_id, conf)

    @app.post("/v1/compaction/run", dependencies=[may_trigger(COMPACTION_DAG), Depends(not_cross_site)])
    def compact(body: CompactionRun, request: Request) -> dict[str, str]:
        table = lake_table(settings_of(), body.table, staged_too=False)
        conf: dict[str, Any] = {"tables": [table], "min_input_files": body.min_input_files}
        if body.where:
            conf["where"] = body.where
        return trigger(request, COMPACTION_DAG, conf)

    @app.post("/v1/compaction/auto", dependencies=[may_trigger(COMPACTION_DAG), Depends(not_cross_site)])
    def auto(request: Request, body: AutoCompaction | None = None) -> dict[str, Any]:
        min_files = (body or AutoCompaction()).min_input_files
        found = [c["table"] for c in _candidates(settings_of(), min_files)]
        if not found:
            return {"candidates": [], "run": None}
        return {
            "candidates": found,
            "run": trigger(request, COMPACTION_DAG, {"tables": found, "min_input_files": min_files}),
        }

    @app.post("/v1/apply", dependencies=[may_trigger(APPLY_DAG), Depends(not_cross_site)])
    def apply(body: TableAction, request: Request) -> dict[str, str]:
        return trigger(request, APPLY_DAG, {"tables": [lake_table(settings_of(), body.table, staged_too=True)]})

    # Releasing a hold lets the next cdc_apply run publish: a right of whoever may trigger it.
    @app.post("/v1/holds/release", dependencies=[may_trigger(APPLY_DAG), Depends(not_cross_site)])
    def release(body: TableAction, user: Any = Depends(get_user)) -> dict[str, Any]:  # noqa: B008 - FastAPI's form
        from cdclake.lake import holds
        from cdclake.staging import stores

        table = body.table.lower()
        try:
            h = holds.release(stores.open_store(settings_of()), table, by=str(user.get_name()))
        except ValueError as exc:
            raise HTTPException(404, str(exc)) from None
        return {"table": table, "released": True, "tables": h.tables}

    @app.post("/v1/expire", dependencies=[may_trigger(EXPIRE_DAG), Depends(not_cross_site)])
    def expire(body: TableAction, request: Request) -> dict[str, str]:
        return trigger(request, EXPIRE_DAG, {"tables": [lake_table(settings_of(), body.table, staged_too=False)]})


def lake_table(settings: Settings, name: str, staged_too: bool) -> str:
    """``name`` as the lake spells it (lower case), or 404 naming it: a run for a table that does
    not exist would do nothing, and be one more run in Airflow for whoever triggers it. An Iceberg
    table of the namespace (side tables too); with ``staged_too`` (Apply), a CDC table, or one
    that staging objects wait to create."""
    from cdclake.contracts.events import TABLE_PATTERN

    table = name.lower()
    where = f"{settings.catalog_name}.{settings.namespace}"
    # A name the door would refuse cannot exist; checked first, as it reaches a staging path.
    if re.fullmatch(TABLE_PATTERN, name) and _exists(settings, table, staged_too):
        return table
    pending = " and no staging objects wait for it" if staged_too else ""
    raise HTTPException(404, f"table {name[:128]!r}: no such table in {where}{pending}")


def _exists(settings: Settings, table: str, staged_too: bool) -> bool:
    from cdclake.contracts.events import RESERVED_SUFFIXES
    from cdclake.lake.health import all_tables
    from cdclake.staging import stores

    try:
        if staged_too:  # a side table is applied with its CDC table, never by itself
            if table.endswith(RESERVED_SUFFIXES):
                return False
            if table in all_tables(settings):
                return True
            return next(iter(stores.open_store(settings).list(table)), None) is not None
        return table in all_tables(settings)
    except Exception as exc:  # any backend failure: 503 with the cause, as the read routes
        raise HTTPException(503, f"{type(exc).__name__}: {exc}") from exc


def _statuses(settings: Settings) -> tuple[list[TableStatus], str | None, int]:
    """Every table's status, or the reason the catalog or staging could not be read, and the time
    they were read at: the staging store's, the clock that named the pending objects and that
    cdc_freshness judges by (a host whose clock is off would show other waits)."""
    from cdclake.lakehouse.status import lake_status
    from cdclake.staging import stores
    from cdclake.staging.clock import StoreClock

    now_ms = int(time.time() * 1000)
    try:
        store = stores.open_store(settings)
        now_ms = StoreClock(store).lower_ms()
        return lake_status(settings, now_ms, store=store), None, now_ms
    except Exception as exc:  # any backend failure: the page says what it was
        return [], f"{type(exc).__name__}: {exc}", now_ms


def _candidates(settings: Settings, min_files: int) -> list[dict[str, Any]]:
    """Table health's compaction candidates (a partition with ``min_files`` small files, or any
    delete file), as iceberg_compaction itself picks them."""
    from cdclake.lake.health import compaction_candidates

    try:
        found = compaction_candidates(settings, min_files)
    except Exception as exc:  # the API answers 503 with the cause
        raise HTTPException(503, f"{type(exc).__name__}: {exc}") from exc
    return [found[t] for t in sorted(found)]
