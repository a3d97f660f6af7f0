"""Starlette application factory: ``create_app(settings)``.

POST /v1/batches  one seed-format batch (JSON) -> one durable staging object per (batch, table),
                  then the ack. Invalid input -> 400 naming the field; nothing lands.
GET  /health      liveness plus where batches land.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio.to_thread
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from cdclake import events, staging
from cdclake.settings import Settings
from receiver.protocol import ack, nack


class BodyTooLarge(Exception):
    pass


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refusing early (before reading it all) once it passes ``limit``."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge
        chunks.append(chunk)
    return b"".join(chunks)


def create_app(settings: Settings) -> Starlette:
    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[dict[str, Any]]:
        settings.staging_dir.mkdir(parents=True, exist_ok=True)
        yield {"store": staging.LocalStaging(settings.staging_dir)}

    async def post_batch(request: Request) -> JSONResponse:
        store: staging.LocalStaging = request.state.store
        try:
            body = await read_body(request, settings.max_body_bytes)
        except BodyTooLarge:
            return JSONResponse(
                nack(
                    "payload_too_large",
                    f"request body exceeds {settings.max_body_bytes} bytes (CDCLAKE_MAX_BODY_BYTES)",
                    maxSize=settings.max_body_bytes,
                ),
                status_code=413,
            )
        try:
            batch = events.decode_batch(body)
        except events.InvalidBatch as exc:
            return JSONResponse(
                {**nack("invalid_format", str(exc)), "field": exc.field, "message": exc.message},
                status_code=400,
            )
        landed_ms = int(time.time() * 1000)
        objects = events.stage_lines(batch)
        keys = [staging.make_key(t, batch.source, batch.sequenceNumber, landed_ms) for t in objects]
        # fsync blocks: keep it off the event loop. The ack is sent only after every put returned.
        for key in keys:
            await anyio.to_thread.run_sync(store.put, key, objects[key.table])
        return JSONResponse(
            ack(
                batch.sequenceNumber,
                "persisted",
                eventsProcessed=len(batch.events),
                persistedPath=[store.uri(k) for k in keys],
            )
        )

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok", "staging": str(settings.staging_dir)})

    return Starlette(
        routes=[
            Route("/v1/batches", post_batch, methods=["POST"]),
            Route("/health", health, methods=["GET"]),
        ],
        lifespan=lifespan,
    )
