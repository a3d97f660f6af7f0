"""The namespace handlers: list, create, load, exists, drop, and set or remove properties; what a
client sees of them and may change is :mod:`restcatalog.rights`'s."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from restcatalog import locations, names, rights
from restcatalog.errors import IcebergError
from restcatalog.inputs import json_body, ns_of, page, parse
from restcatalog.models import CreateNamespaceRequest, UpdateNamespacePropertiesRequest
from restcatalog.service import Service, run


async def list_namespaces(request: Request, svc: Service) -> Response:
    client = rights.client_of(request, svc)
    parent = request.query_params.get("parent")
    ns = names.namespace_param(parent) if parent else ()
    if ns:
        await run(rights.require_namespace, svc, client, ns)
    found = sorted(n for n in await run(svc.catalog.sql.list_namespaces, ns) if client.may_see_namespace(n))
    items, token = page(found, request)
    return JSONResponse({"namespaces": [list(n) for n in items], "next-page-token": token})


async def create_namespace(request: Request, svc: Service) -> Response:
    cat = svc.catalog
    req = parse(CreateNamespaceRequest, await json_body(request, svc))
    ns = names.namespace(req.namespace)
    rights.check_namespace_change(rights.client_of(request, svc), ns, creating=True)
    # A namespace's "location" is where its tables go by default.
    locations.require_properties(req.properties, svc.settings.warehouse)
    await run(cat.sql.create_namespace, ns, req.properties)
    props = await run(cat.sql.load_namespace_properties, ns)
    return JSONResponse({"namespace": list(ns), "properties": props})


async def load_namespace(request: Request, svc: Service) -> Response:
    ns = ns_of(request)
    await run(rights.require_namespace, svc, rights.client_of(request, svc), ns)
    props = await run(svc.catalog.sql.load_namespace_properties, ns)
    return JSONResponse({"namespace": list(ns), "properties": props})


async def namespace_exists(request: Request, svc: Service) -> Response:
    ns = ns_of(request)
    found = rights.client_of(request, svc).may_see_namespace(ns) and await run(svc.catalog.sql.namespace_exists, ns)
    return Response(status_code=204 if found else 404)


async def drop_namespace(request: Request, svc: Service) -> Response:
    cat = svc.catalog
    ns = ns_of(request)
    rights.check_namespace_change(rights.client_of(request, svc), ns)

    def drop() -> None:
        if not cat.sql.namespace_exists(ns):
            raise rights.missing_namespace(ns)
        # SqlCatalog counts tables only; a child namespace would survive its parent's drop
        # and keep the parent "existing" (existence is a prefix match).
        if cat.sql.list_namespaces(ns):
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
    rights.check_namespace_change(rights.client_of(request, svc), ns)

    def apply() -> dict[str, list[str]]:
        if not cat.sql.namespace_exists(ns):
            raise rights.missing_namespace(ns)
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
