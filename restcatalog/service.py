"""What every handler shares: the per-app :class:`Service` (the lifespan makes it, each request
reaches it as ``request.state.service``), and :func:`endpoint`, which puts a handler behind the
access check, the Iceberg error translation and the request metrics."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, TypedDict, TypeVar

import anyio.to_thread
from starlette.requests import Request
from starlette.responses import Response

from cdclake.config.settings import Settings
from cdclake.service.metrics import Metrics
from restcatalog import auth, errors
from restcatalog.catalog import Catalog
from restcatalog.errors import IcebergError, bad_request
from restcatalog.querylimits import QuerySlots

log = logging.getLogger("restcatalog")

T = TypeVar("T")


async def run(fn: Callable[..., T], *args: Any) -> T:
    """Catalog calls block (SQL, file reads): off the event loop."""
    return await anyio.to_thread.run_sync(functools.partial(fn, *args))


def describe_metrics(m: Metrics) -> None:
    m.describe(
        "cdclake_rest_requests_total",
        "counter",
        "REST catalog requests by route and status",
        ("route", "method", "status"),
    )
    m.describe("cdclake_rest_request_seconds", "histogram", "REST catalog request latency by route", ("route",))
    m.describe("cdclake_rest_commits_total", "counter", "Committed table changes")
    m.describe("cdclake_rest_commit_conflicts_total", "counter", "Commits refused with 409 (stale or lost race)")
    m.describe("cdclake_rest_metric_reports_total", "counter", "Scan/commit reports received from clients")
    m.describe("cdclake_queries_cancelled_total", "counter", "Query API statements interrupted: their client went away")


@dataclass(frozen=True)
class Service:
    """What the handlers share, one per app: made by the lifespan (the catalog opens there), and
    reached by every request as ``request.state.service`` (:class:`State`)."""

    settings: Settings
    tokens: auth.Tokens
    metrics: Metrics
    catalog: Catalog
    config: dict[str, str]
    """Non-secret FileIO hints for clients (:func:`restcatalog.catalog.client_config`)."""
    query_slots: QuerySlots
    """How many statements the query API runs at once (:mod:`restcatalog.querylimits`)."""
    query_sessions: Callable[[auth.Client], AbstractContextManager[Any]] | None = None
    """A new Spark session per statement of the query API, confined to the client's rights
    (:mod:`restcatalog.query`); None: no engine."""

    @property
    def known_warehouses(self) -> set[str]:
        s = self.settings
        return {"", s.catalog_name, s.warehouse, s.warehouse.rstrip("/")}

    def authorize(self, request: Request, need: auth.Access) -> auth.Client:
        """The request's client, if it has ``need``; else 401/403. A token this server issued
        holds its rights even without a tokens file: the query API's Spark sessions read through
        this server with a read-only one (:mod:`cdclake.query.session`)."""
        client = self.tokens.bearer(request.headers.get("authorization"))
        if client is None and self.tokens.open_access:
            return auth.ANYONE
        if client is None:
            raise errors.not_authorized("a valid bearer token is required (see POST /v1/oauth/tokens)")
        if client.access < need:
            raise errors.forbidden(f"client {client.id!r} has {client.access.name.lower()} access only")
        return client


class State(TypedDict):
    """What the lifespan yields; Starlette gives each request a copy as ``request.state``."""

    service: Service


def service_of(request: Request) -> Service:
    svc: Service = request.state.service
    return svc


Handler = Callable[[Request, Service], Awaitable[Response]]


def endpoint(name: str, need: auth.Access | None, fn: Handler) -> Callable[[Request], Awaitable[Response]]:
    """``fn`` behind the access check, the Iceberg error translation and the request metrics."""

    async def handle(request: Request) -> Response:
        svc = service_of(request)
        start = time.perf_counter()
        try:
            if need is not None:
                svc.authorize(request, need)
            resp = await fn(request, svc)
        except Exception as exc:
            err = errors.translate(exc)
            if err is None:
                if isinstance(exc, RecursionError):
                    err = bad_request("request nested too deeply")
                else:
                    log.exception("request failed", extra={"route": name, "method": request.method})
                    # For a commit, a fault after the metadata file was written leaves its
                    # outcome unknown to the client: Java and pyiceberg then do not retry blindly.
                    committing = name in ("commit", "transaction")
                    kind = "CommitStateUnknownException" if committing else "ServiceFailureException"
                    err = IcebergError(500, kind, f"{type(exc).__name__}: {exc}")
            resp = errors.response(err)
        svc.metrics.inc("cdclake_rest_requests_total", route=name, method=request.method, status=str(resp.status_code))
        svc.metrics.observe("cdclake_rest_request_seconds", time.perf_counter() - start, route=name)
        return resp

    return handle
