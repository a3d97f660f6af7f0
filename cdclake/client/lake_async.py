"""The lake client for asyncio (httpx's async client; the reconnect pause is ``asyncio.sleep``):
:class:`AsyncLake` does what :class:`cdclake.client.lake.Lake`
does (same requests, results and errors) on an ``httpx.AsyncClient``::

    async with lake_async.connect("http://127.0.0.1:8181") as db:
        rows = (await db.query("SELECT count(*) AS n FROM orders")).rows
        async for change in db.subscribe(["orders"]):      # resumes a dropped stream by itself
            ...
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import httpx

from cdclake.client.lake import (
    BUSY_RETRIES,
    LakeConnectionError,
    Result,
    Scalar,
    body,
    error_of,
    plan_body,
    result,
    retry_after,
    sse_data,
    subscription,
    token_form,
)


class AsyncLake:
    def __init__(
        self,
        url: str,
        token: str | None = None,
        credential: str | None = None,
        timeout: float = 300.0,
        http: httpx.AsyncClient | None = None,
    ) -> None:
        self._http = http or httpx.AsyncClient(base_url=url.rstrip("/"), timeout=timeout)
        self._token, self._credential = token, credential

    async def __aenter__(self) -> AsyncLake:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def query(
        self,
        sql: str,
        params: Mapping[str, Scalar] | Sequence[Scalar] | None = None,
        as_of: str | int | None = None,
        max_rows: int = 1000,
        timeout_s: float | None = None,
        consistent: bool = False,
        as_of_position: tuple[str, str] | None = None,
    ) -> Result:
        request = body(sql, params, as_of, max_rows, timeout_s, "json", consistent, as_of_position)
        r = await self._call("POST", "/v1/query", json=request)
        return result(r.json())

    async def plan(
        self,
        sql: str,
        params: Mapping[str, Scalar] | Sequence[Scalar] | None = None,
        as_of: str | int | None = None,
        timeout_s: float | None = None,
        consistent: bool = False,
        as_of_position: tuple[str, str] | None = None,
    ) -> dict[str, Any]:
        """As :meth:`cdclake.client.lake.Lake.plan`."""
        sent = plan_body(sql, params, as_of, timeout_s, consistent, as_of_position)
        r = await self._call("POST", "/v1/query/plan", json=sent)
        got: dict[str, Any] = r.json()
        return got

    async def subscribe(
        self,
        tables: Sequence[str],
        operations: Sequence[str] | None = None,
        since: str | None = None,
        reconnect_s: float = 1.0,
    ) -> AsyncIterator[dict[str, Any]]:
        """As :meth:`cdclake.client.lake.Lake.subscribe`, an async iterator."""
        params = subscription(tables, operations)
        cursor = since
        while True:
            headers = {**await self._headers(), **({"Last-Event-ID": cursor} if cursor else {})}
            timeout = httpx.Timeout(None, connect=10.0)
            try:
                async with self._http.stream(
                    "GET", "/v1/subscribe", params=params, headers=headers, timeout=timeout
                ) as r:
                    if r.status_code == 401 and self._credential:
                        self._token = None
                        continue
                    if r.status_code >= 400:
                        await r.aread()
                        raise error_of(r)
                    kind = ""
                    async for line in r.aiter_lines():
                        if line.startswith("event: "):
                            kind = line[7:]
                        elif (data := sse_data(line)) is not None:
                            cursor = data["cursor"]  # the start event's, then each change's
                            if kind == "change":
                                yield data
            except httpx.TransportError:
                pass  # resumed below from the last change delivered
            await asyncio.sleep(reconnect_s)

    async def _call(self, method: str, path: str, **kw: Any) -> httpx.Response:
        try:
            r = await self._http.request(method, path, headers=await self._headers(), **kw)
            if r.status_code == 401 and self._credential:
                self._token = None  # an issued token expires, or the server restarted: fetch another
                r = await self._http.request(method, path, headers=await self._headers(), **kw)
            for _ in range(BUSY_RETRIES):
                wait = retry_after(r)
                if wait is None:
                    break
                await asyncio.sleep(wait)
                r = await self._http.request(method, path, headers=await self._headers(), **kw)
        except httpx.TransportError as exc:
            raise LakeConnectionError(f"{self._http.base_url}: {exc}") from None
        if r.status_code >= 400:
            raise error_of(r)
        return r

    async def _headers(self) -> dict[str, str]:
        if self._token is None and self._credential:
            try:
                r = await self._http.post("/v1/oauth/tokens", data=token_form(self._credential))
            except httpx.TransportError as exc:
                raise LakeConnectionError(f"{self._http.base_url}: {exc}") from None
            if r.status_code != 200:
                raise error_of(r)
            self._token = str(r.json()["access_token"])
        return {"Authorization": f"Bearer {self._token}"} if self._token else {}


def connect(url: str, token: str | None = None, credential: str | None = None, timeout: float = 300.0) -> AsyncLake:
    """An :class:`AsyncLake` (see :func:`cdclake.client.lake.connect`)."""
    return AsyncLake(url, token, credential, timeout)
