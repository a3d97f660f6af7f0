"""A request's inputs, checked before a handler uses them: the body (bounded in size, JSON, then
a pydantic model), the names in the path, paging and the snapshot in the query. Bad input is a
400 (or a 413), never a 500."""

from __future__ import annotations

import json
from typing import Any, TypeVar

from pydantic import BaseModel
from starlette.requests import Request

from restcatalog import names
from restcatalog.errors import IcebergError, bad_request
from restcatalog.service import Service

M = TypeVar("M", bound="BaseModel")


def parse(model: type[M], data: dict[str, Any]) -> M:
    """A client's request body as ``model``. pyiceberg's own validators raise TypeError for some
    bad input (a default value of a type that does not exist), which pydantic passes through:
    that is still the client's input, so a 400, never a 500."""
    try:
        return model.model_validate(data)
    except TypeError as exc:
        raise bad_request(f"invalid request: {str(exc)[:500]}") from None


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


def snapshot_param(request: Request) -> int | None:
    raw = request.query_params.get("snapshot-id")
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        raise bad_request("snapshot-id must be an integer") from None
