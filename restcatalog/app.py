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
GET  /health /metrics /openapi.json
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypedDict, TypeVar
from urllib.parse import parse_qs

import anyio.to_thread
from pydantic import BaseModel
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.table import CommitTableRequest
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from cdclake.config.settings import Settings
from cdclake.service.metrics import Metrics
from restcatalog import auth, errors, locations, names, openapi, partitions
from restcatalog.catalog import Catalog, Loaded, client_config
from restcatalog.errors import IcebergError, bad_request
from restcatalog.models import (
    CommitTransactionRequest,
    CreateNamespaceRequest,
    CreateTableRequest,
    RegisterTableRequest,
    RenameTableRequest,
    UpdateNamespacePropertiesRequest,
)

log = logging.getLogger("restcatalog")

T = TypeVar("T")
M = TypeVar("M", bound="BaseModel")


def parse(model: type[M], data: dict[str, Any]) -> M:
    """A client's request body as ``model``. pyiceberg's own validators raise TypeError for some
    bad input (a default value of a type that does not exist), which pydantic passes through:
    that is still the client's input, so a 400, never a 500."""
    try:
        return model.model_validate(data)
    except TypeError as exc:
        raise bad_request(f"invalid request: {str(exc)[:500]}") from None


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

OAUTH_MAX_BODY = 64 * 1024


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


async def run(fn: Callable[..., T], *args: Any) -> T:
    """Catalog calls block (SQL, file reads): off the event loop."""
    return await anyio.to_thread.run_sync(functools.partial(fn, *args))


async def read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise IcebergError(413, "BadRequestException", f"request body larger than {limit} bytes")
    chunks: list[bytes] = []
    total = 0
    async for chunk in request.stream():
        total += len(chunk)
        if total > limit:
            raise IcebergError(413, "BadRequestException", f"request body larger than {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def ns_of(request: Request) -> tuple[str, ...]:
    return names.namespace_segment(request.path_params["namespace"])


def ident_of(request: Request) -> tuple[str, ...]:
    return (*ns_of(request), names.table_segment(request.path_params["table"]))


def page(items: list[Any], request: Request) -> tuple[list[Any], str | None]:
    """Offset tokens: the listing is sorted, so an offset names the same place between calls
    unless names are added or dropped meanwhile (the spec allows that)."""
    q = request.query_params
    try:
        start = int(q.get("pageToken") or 0)
        size = int(q["pageSize"]) if q.get("pageSize") else None
    except ValueError:
        raise bad_request("pageToken and pageSize must be integers") from None
    if start < 0 or (size is not None and size < 1):
        raise bad_request("pageToken must be >= 0 and pageSize >= 1")
    end = len(items) if size is None else start + size
    return items[start:end], (str(end) if end < len(items) else None)


def load_result(entry: Loaded, config: dict[str, str], metadata: bytes | None = None) -> Response:
    # The metadata file's own bytes: no re-serialization, and fields pyiceberg does not model
    # (written by a newer Java) reach the client intact.
    loc = json.dumps(entry.location).encode()
    body = b'{"metadata-location":%s,"metadata":%s,"config":%s}' % (
        loc,
        metadata if metadata is not None else entry.raw,
        json.dumps(config).encode(),
    )
    return Response(body, media_type="application/json")


def etag(entry: Loaded) -> str:
    return '"' + hashlib.sha256((entry.location or "").encode()).hexdigest()[:32] + '"'


def refs_only(raw: bytes) -> bytes:
    """``?snapshots=refs``: keep the snapshots that a branch or tag points at."""
    doc = json.loads(raw)
    keep = {r.get("snapshot-id") for r in (doc.get("refs") or {}).values()}
    doc["snapshots"] = [s for s in doc.get("snapshots") or [] if s.get("snapshot-id") in keep]
    return json.dumps(doc).encode()


def describe_metrics(m: Metrics) -> None:
    m.describe("cdclake_rest_requests_total", "counter", "REST catalog requests by route and status")
    m.describe("cdclake_rest_request_seconds", "histogram", "REST catalog request latency by route")
    m.describe("cdclake_rest_commits_total", "counter", "Committed table changes")
    m.describe("cdclake_rest_commit_conflicts_total", "counter", "Commits refused with 409 (stale or lost race)")
    m.describe("cdclake_rest_metric_reports_total", "counter", "Scan/commit reports received from clients")


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

    @property
    def known_warehouses(self) -> set[str]:
        s = self.settings
        return {"", s.catalog_name, s.warehouse, s.warehouse.rstrip("/")}

    def authorize(self, request: Request, need: auth.Access) -> None:
        if self.tokens.open_access:
            return
        client = self.tokens.bearer(request.headers.get("authorization"))
        if client is None:
            raise errors.not_authorized("a valid bearer token is required (see POST /v1/oauth/tokens)")
        if client.access < need:
            raise errors.forbidden(f"client {client.id!r} has {client.access.name.lower()} access only")


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


async def json_body(request: Request, svc: Service) -> dict[str, Any]:
    raw = await read_body(request, svc.settings.rest_max_body_bytes)
    try:
        data = json.loads(raw)
    except RecursionError:
        raise bad_request("request body nested too deeply") from None
    except ValueError as exc:  # also UnicodeDecodeError
        raise bad_request(f"malformed JSON: {exc}") from None
    if not isinstance(data, dict):
        raise bad_request("request body must be a JSON object")
    return data


# -- config and auth


async def get_config(request: Request, svc: Service) -> Response:
    wh = request.query_params.get("warehouse")
    if wh is not None and wh not in svc.known_warehouses:
        raise bad_request(f"unknown warehouse {wh!r}: this catalog serves {svc.settings.catalog_name!r}")
    return JSONResponse({"defaults": svc.config, "overrides": {}, "endpoints": ENDPOINTS})


def oauth_error(status: int, code: str, text: str) -> Response:
    return JSONResponse({"error": code, "error_description": text}, status_code=status)


async def oauth_tokens(request: Request) -> Response:
    tokens = service_of(request).tokens
    try:
        raw = await read_body(request, OAUTH_MAX_BODY)
        form = {k: v[0] for k, v in parse_qs(raw.decode(), keep_blank_values=True).items()}
    except (IcebergError, UnicodeDecodeError, ValueError):
        return oauth_error(400, "invalid_request", "expected a small application/x-www-form-urlencoded body")
    grant = form.get("grant_type")
    client: auth.Client | None
    if grant == "client_credentials":
        creds = auth.basic_credentials(request.headers.get("authorization"))
        cid, secret = creds or (form.get("client_id") or "", form.get("client_secret") or "")
        if tokens.open_access:
            client = auth.Client(cid or "anonymous", auth.Access.WRITE)
        else:
            client = tokens.credentials(cid, secret)
        if client is None:
            return oauth_error(401, "invalid_client", "unknown client_id or wrong client_secret")
    elif grant == "urn:ietf:params:oauth:grant-type:token-exchange":
        # Java's refresh before expiry: the current token buys a fresh one.
        client = tokens.bearer("Bearer " + form.get("subject_token", ""))
        if client is None and tokens.open_access:
            client = auth.Client("anonymous", auth.Access.WRITE)
        if client is None:
            return oauth_error(401, "invalid_grant", "subject_token is not a valid token")
    else:
        return oauth_error(400, "unsupported_grant_type", f"unsupported grant_type {grant!r}")
    body = {
        "access_token": tokens.issue(client),
        "token_type": "bearer",
        "expires_in": tokens.ttl_s,
        "issued_token_type": "urn:ietf:params:oauth:token-type:access_token",
    }
    return JSONResponse(body, headers={"Cache-Control": "no-store"})


# -- namespaces


async def list_namespaces(request: Request, svc: Service) -> Response:
    parent = request.query_params.get("parent")
    ns = names.namespace_param(parent) if parent else ()
    found = sorted(await run(svc.catalog.sql.list_namespaces, ns))
    items, token = page(found, request)
    return JSONResponse({"namespaces": [list(n) for n in items], "next-page-token": token})


async def create_namespace(request: Request, svc: Service) -> Response:
    cat = svc.catalog
    req = parse(CreateNamespaceRequest, await json_body(request, svc))
    ns = names.namespace(req.namespace)
    # A namespace's "location" is where its tables go by default.
    locations.require_properties(req.properties, svc.settings.warehouse)
    await run(cat.sql.create_namespace, ns, req.properties)
    props = await run(cat.sql.load_namespace_properties, ns)
    return JSONResponse({"namespace": list(ns), "properties": props})


async def load_namespace(request: Request, svc: Service) -> Response:
    ns = ns_of(request)
    props = await run(svc.catalog.sql.load_namespace_properties, ns)
    return JSONResponse({"namespace": list(ns), "properties": props})


async def namespace_exists(request: Request, svc: Service) -> Response:
    found = await run(svc.catalog.sql.namespace_exists, ns_of(request))
    return Response(status_code=204 if found else 404)


async def drop_namespace(request: Request, svc: Service) -> Response:
    cat = svc.catalog
    ns = ns_of(request)

    def drop() -> None:
        # SqlCatalog counts tables only; a child namespace would survive its parent's drop
        # and keep the parent "existing" (existence is a prefix match).
        if cat.sql.namespace_exists(ns) and cat.sql.list_namespaces(ns):
            raise IcebergError(409, "NamespaceNotEmptyException", f"Namespace {'.'.join(ns)} has child namespaces")
        cat.sql.drop_namespace(ns)

    await run(drop)
    return Response(status_code=204)


async def update_properties(request: Request, svc: Service) -> Response:
    cat = svc.catalog
    ns = ns_of(request)
    req = parse(UpdateNamespacePropertiesRequest, await json_body(request, svc))
    overlap = set(req.removals) & set(req.updates)
    if overlap:
        raise IcebergError(422, "UnprocessableEntityException", f"keys both removed and updated: {sorted(overlap)}")
    locations.require_properties(req.updates, svc.settings.warehouse)

    def apply() -> dict[str, list[str]]:
        current = cat.sql.load_namespace_properties(ns)
        updates = dict(req.updates)
        if not updates and set(current) <= set(req.removals):
            # SqlCatalog's namespace exists by its property rows: keep one.
            updates = {"exists": "true"}
        summary = cat.sql.update_namespace_properties(ns, set(req.removals), updates)
        return {
            "removed": sorted(summary.removed),
            "updated": sorted(set(summary.updated) & set(req.updates)),
            "missing": sorted(summary.missing or []),
        }

    return JSONResponse(await run(apply))


# -- tables


async def list_tables(request: Request, svc: Service) -> Response:
    ns = ns_of(request)
    found = sorted(await run(svc.catalog.sql.list_tables, ns))
    items, token = page(found, request)
    ids = [{"namespace": list(i[:-1]), "name": i[-1]} for i in items]
    return JSONResponse({"identifiers": ids, "next-page-token": token})


async def create_table(request: Request, svc: Service) -> Response:
    ns = ns_of(request)
    req = parse(CreateTableRequest, await json_body(request, svc))
    entry = await run(svc.catalog.create, ns, req)
    return load_result(entry, svc.config)


async def load_table(request: Request, svc: Service) -> Response:
    ident = ident_of(request)
    mode = request.query_params.get("snapshots", "all")
    if mode not in ("all", "refs"):
        raise bad_request("snapshots must be 'all' or 'refs'")
    entry = await run(svc.catalog.load, ident)
    tag = etag(entry) + (";refs" if mode == "refs" else "")
    if request.headers.get("if-none-match") == tag:
        return Response(status_code=304, headers={"ETag": tag})
    resp = load_result(entry, svc.config, refs_only(entry.raw) if mode == "refs" else None)
    resp.headers["ETag"] = tag
    return resp


async def table_exists(request: Request, svc: Service) -> Response:
    found = await run(svc.catalog.sql.table_exists, ident_of(request))
    return Response(status_code=204 if found else 404)


async def drop_table(request: Request, svc: Service) -> Response:
    ident = ident_of(request)
    purge = request.query_params.get("purgeRequested", "false").lower()
    if purge not in ("true", "false"):
        raise bad_request("purgeRequested must be true or false")
    await run(svc.catalog.drop, ident, purge == "true")
    return Response(status_code=204)


async def commit_table(request: Request, svc: Service) -> Response:
    ident = ident_of(request)
    body = await json_body(request, svc)
    path_id = {"namespace": list(ident[:-1]), "name": ident[-1]}
    given = body.get("identifier")
    if given is not None and given != path_id:
        raise bad_request(f"identifier {given!r} does not match the path")
    req = parse(CommitTableRequest, {**body, "identifier": path_id})
    try:
        (entry,) = await run(svc.catalog.commit, [req])
    except CommitFailedException as exc:
        svc.metrics.inc("cdclake_rest_commit_conflicts_total")
        log.info("commit conflict", extra={"table": ".".join(ident), "reason": str(exc)})
        raise
    svc.metrics.inc("cdclake_rest_commits_total")
    body_out = b'{"metadata-location":%s,"metadata":%s}' % (json.dumps(entry.location).encode(), entry.raw)
    return Response(body_out, media_type="application/json")


async def register_table(request: Request, svc: Service) -> Response:
    ns = ns_of(request)
    req = parse(RegisterTableRequest, await json_body(request, svc))
    entry = await run(svc.catalog.register, (*ns, names.table(req.name)), req.metadata_location, req.overwrite)
    return load_result(entry, svc.config)


async def rename_table(request: Request, svc: Service) -> Response:
    req = parse(RenameTableRequest, await json_body(request, svc))
    src = (*names.namespace(req.source.namespace.root), names.table(req.source.name))
    dst = (*names.namespace(req.destination.namespace.root), names.table(req.destination.name))
    await run(svc.catalog.sql.rename_table, src, dst)
    return Response(status_code=204)


async def commit_transaction(request: Request, svc: Service) -> Response:
    req = parse(CommitTransactionRequest, await json_body(request, svc))
    if not req.table_changes:
        raise bad_request("table-changes is empty")
    try:
        await run(svc.catalog.commit, req.table_changes)
    except CommitFailedException:
        svc.metrics.inc("cdclake_rest_commit_conflicts_total")
        raise
    svc.metrics.inc("cdclake_rest_commits_total", len(req.table_changes))
    return Response(status_code=204)


async def report_metrics(request: Request, svc: Service) -> Response:
    ident_of(request)
    await read_body(request, svc.settings.rest_max_body_bytes)
    svc.metrics.inc("cdclake_rest_metric_reports_total")
    return Response(status_code=204)


def snapshot_param(request: Request) -> int | None:
    raw = request.query_params.get("snapshot-id")
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        raise bad_request("snapshot-id must be an integer") from None


async def list_partitions(request: Request, svc: Service) -> Response:
    snap, rows = await run(svc.catalog.partitions, ident_of(request), snapshot_param(request))
    return JSONResponse(partitions.listing(snap, rows))


async def partition_stats(request: Request, svc: Service) -> Response:
    snap, rows = await run(svc.catalog.partitions, ident_of(request), snapshot_param(request))
    return JSONResponse(partitions.stats(snap, rows))


# -- operations


async def health(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


async def prometheus(request: Request) -> Response:
    return PlainTextResponse(service_of(request).metrics.render(), media_type="text/plain; version=0.0.4")


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
    Route("/health", health, methods=["GET"]),
    Route("/metrics", prometheus, methods=["GET"]),
    Route("/openapi.json", openapi_json, methods=["GET"]),
]


def create_app(settings: Settings) -> Starlette:
    # A bad tokens file fails here, before the server binds.
    tokens = (
        auth.Tokens.load(settings.rest_tokens_file, settings.rest_token_ttl_s)
        if settings.rest_tokens_file
        else auth.Tokens.open(settings.rest_token_ttl_s)
    )
    metrics = Metrics()
    describe_metrics(metrics)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[State]:
        catalog = await run(Catalog, settings)
        try:
            yield {"service": Service(settings, tokens, metrics, catalog, client_config(settings))}
        finally:
            catalog.close()

    app = Starlette(routes=ROUTES, lifespan=lifespan, exception_handlers={HTTPException: not_found})
    app.state.metrics = metrics  # the counters, for whoever runs the server (tests read them)
    app.add_middleware(RawPath)
    return app
