"""Starlette application factory: ``create_app(settings)``, the Iceberg REST catalog API over
the SQL catalog the pipeline writes.

GET  /v1/config                                   defaults, overrides, endpoints (?warehouse=)
POST /v1/oauth/tokens                             client_credentials / token-exchange -> bearer
GET|POST /v1/namespaces                           list (?parent=), create
GET|HEAD|DELETE /v1/namespaces/{ns}               load, exists, drop
POST /v1/namespaces/{ns}/properties               set / remove properties
GET|POST /v1/namespaces/{ns}/tables               list, create (stage-create too)
GET|HEAD|POST|DELETE /v1/namespaces/{ns}/tables/{t}  load, exists, commit, drop (?purgeRequested)
POST /v1/namespaces/{ns}/register                 register a metadata file
POST /v1/namespaces/{ns}/tables/{t}/metrics       scan/commit reports (accepted, counted)
GET  /v1/namespaces/{ns}/tables/{t}/partitions    partitions of a snapshot (?snapshot-id=)
GET  /v1/namespaces/{ns}/tables/{t}/partition-stats  per-partition counts and sizes
POST /v1/tables/rename                            rename
POST /v1/transactions/commit                      several tables, atomically
POST /v1/query                                    read-only Spark SQL over the lake (restcatalog.query)
POST /v1/query/plan                               its plan and the data files it would read (restcatalog.plan)
GET  /v1/changes /v1/subscribe                    applied changes from a cursor: a page, or SSE (restcatalog.changes)
GET  /health /metrics /openapi.json
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from cdclake.config.settings import Settings
from cdclake.service.metrics import CONTENT_TYPE, Metrics
from restcatalog import auth, errors, openapi
from restcatalog.catalog import Catalog, client_config
from restcatalog.changes import get_changes, subscribe
from restcatalog.commits import commit_table, commit_transaction
from restcatalog.errors import IcebergError, bad_request
from restcatalog.lakemetrics import LakeCollector
from restcatalog.namespaces import (
    create_namespace,
    drop_namespace,
    list_namespaces,
    load_namespace,
    namespace_exists,
    update_properties,
)
from restcatalog.oauth import oauth_tokens
from restcatalog.plan import post_query_plan
from restcatalog.query import Sessions, connect_sessions, post_query
from restcatalog.querylimits import QuerySlots
from restcatalog.service import Handler, Service, State, describe_metrics, endpoint, run, service_of
from restcatalog.tables import (
    create_table,
    drop_table,
    list_partitions,
    list_tables,
    load_table,
    partition_stats,
    register_table,
    rename_table,
    report_metrics,
    table_exists,
)

P = "/v1/{prefix}"
ENDPOINTS = [
    f"GET {P}/namespaces",
    f"POST {P}/namespaces",
    f"GET {P}/namespaces/{{namespace}}",
    f"HEAD {P}/namespaces/{{namespace}}",
    f"DELETE {P}/namespaces/{{namespace}}",
    f"POST {P}/namespaces/{{namespace}}/properties",
    f"GET {P}/namespaces/{{namespace}}/tables",
    f"POST {P}/namespaces/{{namespace}}/tables",
    f"GET {P}/namespaces/{{namespace}}/tables/{{table}}",
    f"HEAD {P}/namespaces/{{namespace}}/tables/{{table}}",
    f"POST {P}/namespaces/{{namespace}}/tables/{{table}}",
    f"DELETE {P}/namespaces/{{namespace}}/tables/{{table}}",
    f"POST {P}/namespaces/{{namespace}}/register",
    f"POST {P}/namespaces/{{namespace}}/tables/{{table}}/metrics",
    f"POST {P}/tables/rename",
    f"POST {P}/transactions/commit",
]
"""Advertised in /v1/config: without the list, Java and pyiceberg assume a default set."""


class RawPath:
    """Route on the path as sent, still percent-encoded: a table named ``a%2Fb`` must stay one
    path segment (and be refused by names.py), not become two."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        raw = scope.get("raw_path") if scope["type"] == "http" else None
        if raw:
            scope = {**scope, "path": raw.decode("latin-1")}
        await self.app(scope, receive, send)


# -- config


async def get_config(request: Request, svc: Service) -> Response:
    wh = request.query_params.get("warehouse")
    if wh is not None and wh not in svc.known_warehouses:
        raise bad_request(f"unknown warehouse {wh!r}: this catalog serves {svc.settings.catalog_name!r}")
    return JSONResponse({"defaults": svc.config, "overrides": {}, "endpoints": ENDPOINTS})


# -- operations


async def health(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


async def prometheus(request: Request) -> Response:
    # Off the event loop: the lake's metrics (restcatalog.lakemetrics) read table metadata.
    return Response(await run(service_of(request).metrics.render), media_type=CONTENT_TYPE)


async def openapi_json(request: Request) -> Response:
    return JSONResponse(openapi.document())


async def not_found(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    kind = "NoSuchRouteException" if exc.status_code == 404 else "BadRequestException"
    text = f"{request.method} {request.url.path}: {exc.detail}"
    return errors.response(IcebergError(exc.status_code, kind, text))


def route(path: str, method: str, name: str, need: auth.Access | None, fn: Handler) -> Route:
    return Route(path, endpoint(name, need, fn), methods=[method], name=name)


R, W = auth.Access.READ, auth.Access.WRITE
NS_PATH = "/v1/namespaces/{namespace}"
T_PATH = NS_PATH + "/tables/{table}"

ROUTES: list[BaseRoute] = [
    route("/v1/config", "GET", "config", R, get_config),
    Route("/v1/oauth/tokens", oauth_tokens, methods=["POST"], name="oauth_tokens"),
    route("/v1/namespaces", "GET", "list_namespaces", R, list_namespaces),
    route("/v1/namespaces", "POST", "create_namespace", W, create_namespace),
    # HEAD before GET: Starlette answers HEAD with a GET route too.
    route(NS_PATH, "HEAD", "namespace_exists", R, namespace_exists),
    route(NS_PATH, "GET", "load_namespace", R, load_namespace),
    route(NS_PATH, "DELETE", "drop_namespace", W, drop_namespace),
    route(NS_PATH + "/properties", "POST", "update_properties", W, update_properties),
    route(NS_PATH + "/tables", "GET", "list_tables", R, list_tables),
    route(NS_PATH + "/tables", "POST", "create_table", W, create_table),
    route(NS_PATH + "/register", "POST", "register_table", W, register_table),
    route(T_PATH, "HEAD", "table_exists", R, table_exists),
    route(T_PATH, "GET", "load_table", R, load_table),
    route(T_PATH, "POST", "commit", W, commit_table),
    route(T_PATH, "DELETE", "drop_table", W, drop_table),
    # A reader's scan reports metrics too: read access is enough.
    route(T_PATH + "/metrics", "POST", "report_metrics", R, report_metrics),
    route(T_PATH + "/partitions", "GET", "partitions", R, list_partitions),
    route(T_PATH + "/partition-stats", "GET", "partition_stats", R, partition_stats),
    route("/v1/tables/rename", "POST", "rename_table", W, rename_table),
    route("/v1/transactions/commit", "POST", "transaction", W, commit_transaction),
    # Not an Iceberg REST route: the query API (restcatalog.query), read access and table rights.
    route("/v1/query", "POST", "query", None, post_query),
    route("/v1/query/plan", "POST", "query_plan", None, post_query_plan),
    route("/v1/changes", "GET", "changes", None, get_changes),
    route("/v1/subscribe", "GET", "subscribe", None, subscribe),
    Route("/health", health, methods=["GET"]),
    Route("/metrics", prometheus, methods=["GET"]),
    Route("/openapi.json", openapi_json, methods=["GET"]),
]


def create_app(settings: Settings, query_sessions: Sessions | None = None) -> Starlette:
    """The server; ``query_sessions`` gives ``POST /v1/query`` its Spark sessions (default: a new
    Spark Connect session per statement on ``CDCLAKE_SPARK_CONNECT_URL``, confined to the client's
    rights)."""
    # A bad tokens file fails here, before the server binds.
    tokens = (
        auth.Tokens.load(settings.rest_tokens_file, settings.rest_token_ttl_s)
        if settings.rest_tokens_file
        else auth.Tokens.open(settings.rest_token_ttl_s)
    )
    metrics = Metrics()
    describe_metrics(metrics)
    metrics.registry.register(LakeCollector(settings))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[State]:
        catalog = await run(Catalog, settings)
        try:
            sessions = query_sessions or connect_sessions(settings, tokens)
            slots = QuerySlots(settings.query_max_concurrent, settings.query_max_concurrent_per_client)
            yield {"service": Service(settings, tokens, metrics, catalog, client_config(settings), slots, sessions)}
        finally:
            catalog.close()

    app = Starlette(routes=ROUTES, lifespan=lifespan, exception_handlers={HTTPException: not_found})
    app.state.metrics = metrics  # the counters, for whoever runs the server (tests read them)
    app.state.tokens = tokens  # what signs its tokens: a process serving the app may issue them too
    app.add_middleware(RawPath)
    return app
