"""Batches over HTTP: ``POST /v1/batches`` (optionally gzip or zstd), ``GET /v1/sources/<source>``
to resume, ``POST /flush``."""

from __future__ import annotations

import gzip
from typing import Any
from urllib.parse import quote

import httpx
import msgspec

from cdclake.client.batch import Batch
from cdclake.client.errors import Ack, ProducerError, Retry
from cdclake.client.replies import ack_of, failure, int_or_none, json_object


class HttpTransport:
    def __init__(
        self,
        url: str,
        source: str,
        token: str | None,
        compress: str | None,
        timeout_s: float,
        client: httpx.Client | None,
    ) -> None:
        self._url, self._source, self._compress = url, source, compress
        self._client = client or httpx.Client(timeout=timeout_s)
        self._owns_client = client is None
        self._auth = {"Authorization": f"Bearer {token}"} if token else {}

    def use(self, url: str) -> None:
        # Nothing to re-establish: every request carries source and sequenceNumber, and any
        # replica reads the shared receipts (a batch the old one landed is acked duplicate).
        self._url = url

    def _request(self, method: str, path: str, content: bytes | None = None, **headers: str) -> httpx.Response:
        try:
            return self._client.request(method, self._url + path, content=content, headers=self._auth | headers)
        except httpx.TransportError as exc:
            # Covers refused connections (receiver restarting), resets and timeouts.
            raise Retry("connection_error", f"{type(exc).__name__}: {exc}", switch=True) from None

    def _fail(self, r: httpx.Response) -> ProducerError | Retry:
        return failure(json_object(r.content), r.status_code, r.headers.get("retry-after"))

    def resume(self, last_ack: int | None) -> int | None:
        r = self._request("GET", f"/v1/sources/{quote(self._source, safe='')}")
        value = (json_object(r.content) or {}).get("lastAckSequence", "absent")
        if r.status_code == 200 and (value is None or int_or_none(value) is not None):
            return int_or_none(value)
        err = self._fail(r)
        if isinstance(err, Retry) or r.status_code not in (200, 404):
            raise err
        # Guessing 1 here would be unsafe: the receiver acks batches it already has as duplicates,
        # so a producer renumbering from 1 would see its new events silently dropped.
        raise ProducerError(
            "resume_failed",
            f"GET /v1/sources/{self._source} gave HTTP {r.status_code} without lastAckSequence; "
            "pass start_sequence to say where this producer stands",
            status_code=r.status_code,
        )

    def send(self, batch: Batch, last_ack: int | None) -> Ack:
        body = msgspec.json.encode({"source": self._source, **batch.fields()})
        headers = {"Content-Type": "application/json"}
        if self._compress == "gzip":
            # mtime=0: a retry must be byte-identical to the first attempt.
            body = gzip.compress(body, mtime=0)
            headers["Content-Encoding"] = "gzip"
        elif self._compress == "zstd":
            import zstandard

            body = zstandard.ZstdCompressor().compress(body)
            headers["Content-Encoding"] = "zstd"
        r = self._request("POST", "/v1/batches", body, **headers)
        data = json_object(r.content)
        if r.is_success and data is not None and data.get("type") == "ack":
            return ack_of(data, batch)
        if r.is_success:
            raise ProducerError("protocol_error", f"HTTP {r.status_code} without an ack: {r.text[:200]}")
        raise self._fail(r)

    def request_flush(self, last_ack: int | None) -> dict[str, Any]:
        r = self._request("POST", "/flush")
        if not r.is_success:
            # Advisory, and a 502 means the receiver could not reach Airflow: report, do not retry.
            err = self._fail(r)
            if isinstance(err, Retry):
                err = ProducerError(err.reason, err.message, status_code=r.status_code)
            raise err
        return json_object(r.content) or {}

    def close(self) -> None:
        if self._owns_client:
            self._client.close()
