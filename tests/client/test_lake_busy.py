"""The lake client and the query API's caps (429 with Retry-After): it waits the server's hint out
a few times, then raises a retryable ``Busy`` carrying the hint. The server is faked with httpx's
MockTransport: what is checked is what the client sends and when."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import httpx
import pytest

from cdclake.client import lake, lake_async

OK = {"columns": [{"name": "n", "type": "int64"}], "rows": [[1]], "truncated": False, "snapshots": []}
BUSY = {"error": {"message": "2 queries running", "type": "TooManyRequestsException", "code": 429}}


def server(busy_first: int, retry_after: str = "0") -> tuple[httpx.MockTransport, list[float]]:
    import time

    asked: list[float] = []

    def handle(request: httpx.Request) -> httpx.Response:
        asked.append(time.monotonic())
        if len(asked) <= busy_first:
            return httpx.Response(429, json=BUSY, headers={"Retry-After": retry_after})
        return httpx.Response(200, json=OK)

    return httpx.MockTransport(handle), asked


def test_a_busy_server_is_asked_again_after_its_hint() -> None:
    transport, asked = server(busy_first=2)
    with lake.Lake("http://x", http=httpx.Client(transport=transport, base_url="http://x")) as db:
        assert db.query("SELECT 1").rows == [{"n": 1}]
    assert len(asked) == 3


def test_past_the_retries_busy_is_raised_retryable_with_the_hint() -> None:
    transport, asked = server(busy_first=10, retry_after="0.05")
    http = httpx.Client(transport=transport, base_url="http://x")
    with lake.Lake("http://x", http=http) as db, pytest.raises(lake.Busy) as busy:
        db.query("SELECT 1")
    assert busy.value.retryable and busy.value.status == 429 and busy.value.retry_after_s == pytest.approx(0.05)
    assert len(asked) == 1 + lake.BUSY_RETRIES
    assert all(b - a >= 0.04 for a, b in itertools.pairwise(asked)), asked  # it waited the hint out


def test_the_async_client_waits_the_same_way() -> None:
    transport, asked = server(busy_first=2)

    async def go() -> Any:
        client = httpx.AsyncClient(transport=transport, base_url="http://x")
        async with lake_async.AsyncLake("http://x", http=client) as db:
            return (await db.query("SELECT 1")).rows

    assert asyncio.run(go()) == [{"n": 1}] and len(asked) == 3
