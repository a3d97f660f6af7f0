"""The table handlers that change no table's contents: list, create (stage-create too), load,
exists, drop, register, rename; the partition listings; and the clients' scan/commit reports.
Commits are :mod:`restcatalog.commits`. A table the client's ``tables`` patterns do not cover
answers as a missing one (:mod:`restcatalog.rights`)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from restcatalog import names, partitions, rights
from restcatalog.catalog import Loaded
from restcatalog.errors import bad_request
from restcatalog.inputs import ident_of, json_body, ns_of, page, parse, read_body, snapshot_param
from restcatalog.models import CreateTableRequest, RegisterTableRequest, RenameTableRequest
from restcatalog.service import Service, run


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


async def list_tables(request: Request, svc: Service) -> Response:
    ns = ns_of(request)
    client = rights.client_of(request, svc)
    await run(rights.require_namespace, svc, client, ns)
    found = sorted(i for i in await run(svc.catalog.sql.list_tables, ns) if rights.readable(client, i))
    items, token = page(found, request)
    ids = [{"namespace": list(i[:-1]), "name": i[-1]} for i in items]
    return JSONResponse({"identifiers": ids, "next-page-token": token})


async def create_table(request: Request, svc: Service) -> Response:
    ns = ns_of(request)
    req = parse(CreateTableRequest, await json_body(request, svc))
    rights.check_new_table(rights.client_of(request, svc), (*ns, names.table(req.name)))
    entry = await run(svc.catalog.create, ns, req)
    return load_result(entry, svc.config)


async def load_table(request: Request, svc: Service) -> Response:
    ident = ident_of(request)
    mode = request.query_params.get("snapshots", "all")
    if mode not in ("all", "refs"):
        raise bad_request("snapshots must be 'all' or 'refs'")
    rights.check_table(rights.client_of(request, svc), ident)
    entry = await run(svc.catalog.load, ident)
    tag = etag(entry) + (";refs" if mode == "refs" else "")
    if request.headers.get("if-none-match") == tag:
        return Response(status_code=304, headers={"ETag": tag})
    resp = load_result(entry, svc.config, refs_only(entry.raw) if mode == "refs" else None)
    resp.headers["ETag"] = tag
    return resp


async def table_exists(request: Request, svc: Service) -> Response:
    ident = ident_of(request)
    found = rights.readable(rights.client_of(request, svc), ident) and await run(svc.catalog.sql.table_exists, ident)
    return Response(status_code=204 if found else 404)


async def drop_table(request: Request, svc: Service) -> Response:
    ident = ident_of(request)
    purge = request.query_params.get("purgeRequested", "false").lower()
    if purge not in ("true", "false"):
        raise bad_request("purgeRequested must be true or false")
    rights.check_table(rights.client_of(request, svc), ident)
    await run(svc.catalog.drop, ident, purge == "true")
    return Response(status_code=204)


async def register_table(request: Request, svc: Service) -> Response:
    ns = ns_of(request)
    req = parse(RegisterTableRequest, await json_body(request, svc))
    ident = (*ns, names.table(req.name))
    rights.check_new_table(rights.client_of(request, svc), ident)
    entry = await run(svc.catalog.register, ident, req.metadata_location, req.overwrite)
    return load_result(entry, svc.config)


async def rename_table(request: Request, svc: Service) -> Response:
    req = parse(RenameTableRequest, await json_body(request, svc))
    src = (*names.namespace(req.source.namespace.root), names.table(req.source.name))
    dst = (*names.namespace(req.destination.namespace.root), names.table(req.destination.name))
    client = rights.client_of(request, svc)
    rights.check_new_table(client, dst)

    def rename() -> None:
        if not rights.readable(client, src):
            # What SqlCatalog.rename_table answers for a missing source, checked in its order.
            if not svc.catalog.sql.namespace_exists(dst[:-1]):
                raise NoSuchNamespaceError(f"Namespace does not exist: {rights.dotted(dst[:-1])}")
            raise NoSuchTableError(f"Table does not exist: {src[-1]}")
        svc.catalog.sql.rename_table(src, dst)

    await run(rename)
    return Response(status_code=204)


async def report_metrics(request: Request, svc: Service) -> Response:
    ident = ident_of(request)
    await read_body(request, svc.settings.rest_max_body_bytes)
    # Reports name a table the client loaded: one it may not read, or none, is a 404 as the spec has it.
    if not rights.readable(rights.client_of(request, svc), ident) or not await run(svc.catalog.sql.table_exists, ident):
        raise rights.missing_table(ident)
    svc.metrics.inc("cdclake_rest_metric_reports_total")
    return Response(status_code=204)


async def _partitions(request: Request, svc: Service) -> tuple[int | None, list[dict[str, Any]]]:
    ident, snapshot = ident_of(request), snapshot_param(request)
    rights.check_table(rights.client_of(request, svc), ident)
    return await run(svc.catalog.partitions, ident, snapshot)


async def list_partitions(request: Request, svc: Service) -> Response:
    return JSONResponse(partitions.listing(*await _partitions(request, svc)))


async def partition_stats(request: Request, svc: Service) -> Response:
    return JSONResponse(partitions.stats(*await _partitions(request, svc)))
