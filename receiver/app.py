"""Starlette application factory: ``create_app(settings)``.

POST /v1/batches        a batch: protocol JSON, NDJSON events (batch fields in headers/query), or
                        Debezium change event(s); gzip/zstd bodies. Ack once durable.
POST /v1/debezium       Debezium Server's HTTP sink: one change event or an array.
WS   /ws, /v1/stream    the streaming protocol (docs/protocol.md) (connect, cdc_batch, heartbeat, flush_request):
                        one handler at both paths (/ws as existing producers use it).
GET  /v1/sources/{id}   where a producer stands (lastAckSequence), for resumption over HTTP.
GET  /health /ready /status /metrics /openapi.json, POST /flush (run cdc_apply now).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import re
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, TypedDict

import anyio
import anyio.to_thread
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, HTTPConnection, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route, WebSocketRoute

from cdclake.config.settings import Settings
from cdclake.config.tables import load_table_config
from cdclake.contracts import events, names
from cdclake.debezium import envelope as debezium
from cdclake.service.metrics import CONTENT_TYPE, Metrics
from cdclake.staging import stores
from receiver import auth, decode, openapi, stream
from receiver.answer import Answer, refusal
from receiver.backlog import Backlog
from receiver.landing import Lander
from receiver.notify import Notifier
from receiver.rejected import Rejected
from receiver.service import Service, describe_metrics
from receiver.spool import Spool

DRAIN_EVERY_S = 1.0
BACKLOG_EVERY_S = 5.0
SOURCE = re.compile(events.SOURCE_PATTERN)
log = logging.getLogger("cdclake.receiver")


def answer_response(a: Answer) -> Response:
    return Response(a.content(), status_code=a.status, headers=a.headers, media_type="application/json")


def batch_params(request: Request) -> dict[str, str]:
    """NDJSON batch fields: ``X-CDC-Source`` / ``X-CDC-Sequence-Number`` headers or the query."""
    q = request.query_params
    h = request.headers
    out = {}
    for name, header in (("source", "x-cdc-source"), ("sequenceNumber", "x-cdc-sequence-number")):
        value = h.get(header) or q.get(name)
        if value is not None:
            out[name] = value
    return out


class State(TypedDict):
    """What the lifespan yields; Starlette gives each request (and WebSocket) a copy as
    ``request.state`` (``ws.state``): the one service of the app and what the handlers decode
    with. Every handler, HTTP and WebSocket (:func:`receiver.stream.stream`), reads it."""

    service: Service
    notifier: Notifier
    started: float
    limits: names.Limits
    tables: debezium.TableRules


def service_of(conn: HTTPConnection) -> Service:
    svc: Service = conn.state.service
    return svc


def notifier_of(conn: HTTPConnection) -> Notifier:
    notifier: Notifier = conn.state.notifier
    return notifier


async def every(seconds: float, fn: Callable[[], Any]) -> None:
    while True:
        with contextlib.suppress(Exception):
            await anyio.to_thread.run_sync(fn)
        await anyio.sleep(seconds)


@contextlib.asynccontextmanager
async def lifespan(
    app: Starlette,
    settings: Settings,
    tokens: auth.Tokens | None,
    limits: names.Limits,
    tables: debezium.TableRules,
) -> AsyncIterator[State]:
    """The service and its loops (backlog refresh, spool drain, Airflow notifications) for as
    long as the app runs; :func:`create_app` binds everything but ``app``."""
    store = stores.open_store(settings)
    # A local store is its own durability; a spool on the same disk would add nothing.
    spool = Spool(settings.spool_dir) if settings.staging_url else None
    lander = Lander(store, spool)
    metrics = Metrics()
    describe_metrics(metrics)
    backlog = Backlog(settings, store)
    notifier = Notifier(settings, metrics)
    service = Service(settings, lander, backlog, metrics, tokens, notifier.landed)
    app.state.service = service  # for the server's shutdown hook (receiver.__main__)
    state: State = {
        "service": service,
        "notifier": notifier,
        "started": time.time(),
        "limits": limits,
        "tables": tables,
    }

    def drain() -> None:
        if spool is not None:
            lander.drain()
            metrics.set("cdclake_receiver_spool_batches", spool.count())

    def refresh() -> None:
        backlog.refresh()
        for table, n in backlog.per_table.items():
            metrics.set("cdclake_receiver_backlog_objects", n, table=table)

    async with anyio.create_task_group() as tg:
        tg.start_soon(every, BACKLOG_EVERY_S, refresh)
        if spool is not None:
            tg.start_soon(every, DRAIN_EVERY_S, drain)
        if notifier.enabled:
            tg.start_soon(notifier.run)
        try:
            yield state
        finally:
            # Stop taking batches, let the ones being landed finish, then stop the loops.
            service.shutting_down = True
            await anyio.to_thread.run_sync(service.idle.wait, 30.0)
            tg.cancel_scope.cancel()
            notifier.close()


async def ingest(
    request: Request,
    parse: Callable[[bytes, str | None], decode.Decoded],
    limit: tuple[int, str] | None = None,
) -> Response:
    svc = service_of(request)
    limit = limit or (svc.settings.max_body_bytes, "CDCLAKE_MAX_BODY_BYTES")
    who = svc.authenticate(request.headers.get("authorization"))
    if isinstance(who, Rejected):
        return answer_response(refusal(who))
    try:
        raw = await decode.read_limited(request.stream(), request.headers.get("content-length"), *limit)
    except Rejected as exc:
        return answer_response(refusal(exc))
    except ClientDisconnect:  # gone, or closed by a read deadline (cdclake.service.connections)
        return Response(status_code=408)
    encoding = request.headers.get("content-encoding")
    producer_id = who.id if who is not None else None

    def build() -> decode.Decoded:
        return parse(decode.decompress(raw, encoding, *limit), producer_id)

    return answer_response(await svc.submit(build, who, "http", len(raw)))


async def post_batch(request: Request) -> Response:
    ctype = request.headers.get("content-type", "")
    params = batch_params(request)
    max_event = service_of(request).settings.max_event_bytes
    limits: names.Limits = request.state.limits
    tables: debezium.TableRules = request.state.tables
    return await ingest(
        request, lambda body, pid: decode.decode_body(body, ctype, params, max_event, pid, limits, tables)
    )


async def post_debezium(request: Request) -> Response:
    settings = service_of(request).settings
    limits: names.Limits = request.state.limits
    tables: debezium.TableRules = request.state.tables
    # Its own limit: Debezium's sink batches by event count and cannot split a request.
    return await ingest(
        request,
        lambda body, pid: decode.decode_debezium(body, settings.max_event_bytes, pid, limits, tables),
        (settings.max_debezium_body_bytes, "CDCLAKE_MAX_DEBEZIUM_BODY_BYTES"),
    )


async def get_source(request: Request) -> Response:
    svc = service_of(request)
    source = request.path_params["source"]
    who = svc.authenticate(request.headers.get("authorization"))
    if isinstance(who, Rejected):
        return answer_response(refusal(who))
    if not SOURCE.fullmatch(source):
        return answer_response(
            refusal(Rejected(400, "invalid_format", f"must match {events.SOURCE_PATTERN}", "source"))
        )
    if who is not None and who.id != source:
        return answer_response(refusal(Rejected(403, "invalid_format", f"this token is {who.id!r}'s", "source")))
    try:
        last = await anyio.to_thread.run_sync(svc.lander.last_sequence, source, True)
    except Exception as exc:
        # The detail (paths, hosts) is for the log, not for whoever asked.
        log.warning("reading the sequence of %r failed: %s: %s", source, type(exc).__name__, exc)
        return JSONResponse(
            {"error": "storage_unavailable", "message": f"staging store unavailable ({type(exc).__name__})"},
            status_code=503,
        )
    return JSONResponse({"source": source, "lastAckSequence": last})


async def health(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


async def ready(request: Request) -> Response:
    svc = service_of(request)
    if svc.shutting_down:
        return JSONResponse({"status": "shutting_down"}, status_code=503)
    try:
        await anyio.to_thread.run_sync(svc.lander.check)  # the store, and its clock (staging names)
    except Exception as exc:
        log.warning("staging store check failed: %s: %s", type(exc).__name__, exc)
        fallback = svc.lander.spool is not None
        return JSONResponse(
            {"status": "degraded" if fallback else "unavailable", "storage": type(exc).__name__},
            status_code=200 if fallback else 503,
        )
    return JSONResponse({"status": "ready"})


async def status(request: Request) -> Response:
    svc = service_of(request)
    # Staging location and producer ids are not for anyone who can reach the port.
    who = svc.authenticate(request.headers.get("authorization"))
    if isinstance(who, Rejected):
        return answer_response(refusal(who))
    notifier = notifier_of(request)
    return JSONResponse(
        {
            "state": "shutting_down" if svc.shutting_down else ("receiving" if svc.in_flight else "idle"),
            "staging": svc.settings.staging_url or "local",
            "backlog": {
                "objects": svc.backlog.total,
                "perTable": svc.backlog.per_table,
                "error": svc.backlog.error,
            },
            "bufferUtilization": svc.backlog.utilization,
            "spool": svc.lander.spool.count() if svc.lander.spool else None,
            "circuitBreakerState": svc.lander.breaker,
            "connectedSources": sorted(stream.connected(svc)),
            "inFlight": svc.in_flight,
            "lastLandingTime": svc.lander.last_landing_ms,
            # The staging store's clock minus this host's: names use the store's (cdclake.staging.clock).
            "storeClockOffsetS": svc.lander.store_clock.offset_s,
            "airflowNotify": {"enabled": notifier.enabled, "sent": notifier.sent, "lastError": notifier.last_error},
            "uptimeS": round(time.time() - request.state.started, 1),
        }
    )


async def metrics(request: Request) -> Response:
    svc = service_of(request)
    svc.metrics.set("cdclake_receiver_connections", sum(stream.connected(svc).values()))
    now = time.time()
    for table, h in svc.backlog.health.items():
        m = svc.metrics
        if h["valid_through_ms"] is not None:
            m.set("cdclake_table_valid_through_seconds", h["valid_through_ms"] / 1000, table=table)
            m.set("cdclake_table_freshness_lag_seconds", now - h["valid_through_ms"] / 1000, table=table)
        if h["last_commit_ms"] is not None:
            m.set("cdclake_table_last_commit_seconds", h["last_commit_ms"] / 1000, table=table)
        for key in ("data_files", "small_files", "delete_files", "snapshots", "rows"):
            m.set(f"cdclake_table_{key}", h[key], table=table)
    return Response(svc.metrics.render(), media_type=CONTENT_TYPE)


async def flush(request: Request) -> Response:
    svc = service_of(request)
    who = svc.authenticate(request.headers.get("authorization"))
    if isinstance(who, Rejected):
        return answer_response(refusal(who))
    try:
        run_id = await notifier_of(request).flush()  # coalesced: see Notifier.flush
    except Exception as exc:
        return JSONResponse({"status": "failed", "message": f"could not trigger cdc_apply: {exc}"}, status_code=502)
    return JSONResponse({"status": "triggered", "dag_id": "cdc_apply", "dag_run_id": run_id}, status_code=202)


async def openapi_json(request: Request) -> Response:
    return JSONResponse(openapi.document(service_of(request).settings))


def routes() -> list[BaseRoute]:
    return [
        Route("/v1/batches", post_batch, methods=["POST"]),
        Route("/v1/debezium", post_debezium, methods=["POST"]),
        Route("/v1/sources/{source}", get_source, methods=["GET"]),
        WebSocketRoute("/v1/stream", stream.stream),
        WebSocketRoute("/ws", stream.stream),
        Route("/health", health, methods=["GET"]),
        Route("/ready", ready, methods=["GET"]),
        Route("/status", status, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/flush", flush, methods=["POST"]),
        Route("/openapi.json", openapi_json, methods=["GET"]),
    ]


def create_app(settings: Settings) -> Starlette:
    # Read now: a bad tokens file or table config fails here, before the server binds.
    tokens = auth.Tokens.load(settings.tokens_file) if settings.tokens_file else None
    limits = names.Limits.of(settings)
    table_config = load_table_config(settings)
    tables = debezium.TableRules(table_config.key_columns(), table_config.column_types())
    bound = functools.partial(lifespan, settings=settings, tokens=tokens, limits=limits, tables=tables)
    return Starlette(routes=routes(), lifespan=bound)
