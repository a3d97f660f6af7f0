"""The commit handlers: one table (``POST .../tables/{t}``) or several at once
(``POST /v1/transactions/commit``), each counted as committed or refused with a 409. A table the
client's ``tables`` patterns do not cover answers as a missing one (:mod:`restcatalog.rights`)."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Iterator

from pyiceberg.exceptions import CommitFailedException
from pyiceberg.table import CommitTableRequest
from starlette.requests import Request
from starlette.responses import Response

from restcatalog import auth, names, rights
from restcatalog.errors import bad_request
from restcatalog.inputs import ident_of, json_body, parse
from restcatalog.models import CommitTransactionRequest
from restcatalog.service import Service, run

log = logging.getLogger("restcatalog")


def _covered(changes: Iterable[CommitTableRequest], client: auth.Client) -> Iterator[CommitTableRequest]:
    """``changes``, refusing a table outside the patterns when the catalog reaches it: Catalog.commit
    stages the changes as it draws them, so the refusal comes exactly where a missing table's
    would (after the tables before it are staged, which may fail first), in the same words."""
    for change in changes:
        ident = (*names.namespace(change.identifier.namespace.root), names.table(change.identifier.name))
        rights.check_table(client, ident)
        yield change


async def commit_table(request: Request, svc: Service) -> Response:
    ident = ident_of(request)
    body = await json_body(request, svc)
    path_id = {"namespace": list(ident[:-1]), "name": ident[-1]}
    given = body.get("identifier")
    if given is not None and given != path_id:
        raise bad_request(f"identifier {given!r} does not match the path")
    req = parse(CommitTableRequest, {**body, "identifier": path_id})
    try:
        (entry,) = await run(svc.catalog.commit, _covered([req], rights.client_of(request, svc)))
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
        await run(svc.catalog.commit, _covered(req.table_changes, rights.client_of(request, svc)))
    except CommitFailedException:
        svc.metrics.inc("cdclake_rest_commit_conflicts_total")
        raise
    svc.metrics.inc("cdclake_rest_commits_total", len(req.table_changes))
    return Response(status_code=204)
