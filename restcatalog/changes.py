"""The applied changes of tables, in commit order, from a resumable cursor
(:mod:`cdclake.lake.changes` reads them):

GET /v1/changes?tables=a,b&operations=INSERT,UPDATE&since=<cursor>&limit=1000
    one page: ``{"changes": [...], "cursor": "..."}``; ask again with ``cursor`` for what follows.
GET /v1/subscribe?tables=a,b&operations=...&since=<cursor>
    a Server-Sent Events stream: first a ``start`` event whose data is ``{"cursor": ...}``, the
    position it starts from, then the same changes as they are committed (``change`` events),
    each event's ``id`` the cursor after it (a client reconnecting sends it back as ``since`` or
    ``Last-Event-ID``); a comment line every 15 s keeps idle connections open. Open streams are
    capped per client and in all (:mod:`restcatalog.subscribers`: 429 with Retry-After).

Without ``since``, from each table's first change; ``since=now``, from after each table's last
visible change. A change is ``{table, operation, key, before, after, order, source, sequence,
metadata, transaction, committedAt, cursor}`` (``before`` and ``metadata`` as the producer sent
them; ``transaction`` the source transaction's id, or null: a reader groups a transaction's
changes by it).
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from cdclake.lake import changes
from restcatalog import auth, names
from restcatalog.errors import IcebergError, bad_request, forbidden, response
from restcatalog.query import jsonable
from restcatalog.service import Service, run
from restcatalog.subscribers import RETRY_AFTER_S, HeldStream, Subscribers, TooManySubscriptions

POLL_S = 0.5  # a commit reaches subscribers within this (plus a read of the history)
KEEPALIVE_S = 15.0
NOW = "now"
MAX_TABLES = 100


class Subscription:
    """What a request asks for, checked: tables (and the right to read them), operations, cursor."""

    def __init__(self, request: Request, svc: Service, client: auth.Client) -> None:
        q = request.query_params
        # Names fold to lower case, as the catalog's do; a name given twice is one table (each
        # distinct one costs a read of its history per page).
        tables = list(dict.fromkeys(t.strip().lower() for t in q.get("tables", "").split(",") if t.strip()))
        if not tables or len(tables) > MAX_TABLES:
            raise bad_request(f"tables: give 1 to {MAX_TABLES} distinct table names, comma-separated")
        for t in tables:
            try:
                names.table(t)  # the rule the catalog's table routes apply
            except IcebergError:
                raise bad_request(f"tables: {t[:80]!r} is not a table name") from None
            if not client.may_read(svc.settings.namespace, t):
                raise forbidden(f"this client may not read {svc.settings.namespace}.{t}")
        ops = [o.strip().upper() for o in q.get("operations", ",".join(changes.OPERATIONS)).split(",") if o.strip()]
        if not ops or set(ops) - set(changes.OPERATIONS):
            raise bad_request(f"operations: a comma-separated subset of {', '.join(changes.OPERATIONS)}")
        since = request.headers.get("last-event-id") or q.get("since")
        try:
            self.cursor = changes.decode(since) if since and since != NOW else {}
        except changes.BadCursor as exc:
            raise bad_request(f"since: {exc}") from None
        self.tables, self.operations, self.settings = tables, ops, svc.settings
        self.from_now = since == NOW

    def start(self) -> None:
        """``since=now``: the cursor at each table's last visible change (a pyiceberg read each)."""
        if self.from_now:
            self.from_now = False
            for t in self.tables:
                if (last := changes.last_position(self.settings, t)) is not None:
                    self.cursor[t] = last

    def page(self, limit: int) -> list[dict[str, Any]]:
        """The next changes of every table (up to ``limit`` each), the cursor moved past them."""
        self.start()
        out = []
        for t in self.tables:
            for c in changes.read_changes(self.settings, t, self.cursor.get(t), self.operations, limit):
                self.cursor[t] = c.position
                out.append(_json(c, changes.encode(self.cursor)))
        return out


def _json(c: changes.Change, cursor: str) -> dict[str, Any]:
    return {
        "table": c.table,
        "operation": c.operation,
        "key": c.key,
        "before": jsonable(c.before),
        "after": jsonable(c.after),
        "order": c.order,
        "source": c.source,
        "sequence": c.sequence,
        "metadata": jsonable(c.metadata),
        "transaction": c.transaction,
        "committedAt": jsonable(changes.when(c.committed_at_us)),
        "cursor": cursor,
    }


async def get_changes(request: Request, svc: Service) -> Response:
    sub = Subscription(request, svc, svc.authorize(request, auth.Access.READ))
    raw = request.query_params.get("limit", "1000")
    if not raw.isdigit() or not 1 <= int(raw) <= 10_000:
        raise bad_request("limit must be an integer 1..10000")
    got = await run(sub.page, int(raw))
    return JSONResponse({"changes": got, "cursor": changes.encode(sub.cursor)})


def _subscribers(request: Request, svc: Service) -> Subscribers:
    """The app's count of open streams (one per app, made by its first subscription)."""
    state = request.app.state
    if getattr(state, "subscribers", None) is None:
        state.subscribers = Subscribers(svc.settings)
    subs: Subscribers = state.subscribers
    return subs


async def subscribe(request: Request, svc: Service) -> Response:
    client = svc.authorize(request, auth.Access.READ)
    sub = Subscription(request, svc, client)
    try:
        release = _subscribers(request, svc).take(client.id)
    except TooManySubscriptions as exc:
        return response(exc, {"Retry-After": str(RETRY_AFTER_S)})

    async def events() -> AsyncIterator[str]:
        # The cursor the stream starts from, concrete even for since=now: a client that loses
        # the connection before the first change resumes from here, not from a later "now".
        await run(sub.start)
        start = json.dumps({"cursor": changes.encode(sub.cursor)})
        yield f"id: {changes.encode(sub.cursor)}\nevent: start\ndata: {start}\n\n"
        quiet_since = time.monotonic()
        while not await request.is_disconnected():
            got = await run(sub.page, 1000)
            for ev in got:
                yield f"id: {ev['cursor']}\nevent: change\ndata: {json.dumps(ev, separators=(',', ':'))}\n\n"
            if got:
                quiet_since = time.monotonic()
                continue
            if time.monotonic() - quiet_since > KEEPALIVE_S:
                quiet_since = time.monotonic()
                yield ": keep-alive\n\n"
            await anyio.sleep(POLL_S)

    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return HeldStream(release, events(), media_type="text/event-stream", headers=headers)
