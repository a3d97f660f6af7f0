"""The commit handlers: one table (``POST .../tables/{t}``) or several at once
(``POST /v1/transactions/commit``), each counted as committed or refused with a 409."""

from __future__ import annotations

import json
import logging

from pyiceberg.exceptions import CommitFailedException
from pyiceberg.table import CommitTableRequest
from starlette.requests import Request
from starlette.responses import Response

from restcatalog.errors import bad_request
from restcatalog.inputs import ident_of, json_body, parse
from restcatalog.models import CommitTransactionRequest
from restcatalog.service import Service, run

log = logging.getLogger("restcatalog")


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
