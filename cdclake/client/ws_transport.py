"""Batches over one WebSocket (``/v1/stream``): ``connect``/``status`` to resume, then
``cdc_batch`` frames answered by ``ack``/``nack``; a dropped connection is reopened on next use."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

import msgspec

from cdclake.client.batch import Batch
from cdclake.client.errors import Ack, ProducerError, Retry
from cdclake.client.replies import ack_of, failure, int_or_none, json_object
from cdclake.contracts.protocol import DEFAULT_MAX_BODY_BYTES, PROTOCOL_VERSION

# The SDK logs under one name, as it did when it was one module.
log = logging.getLogger("cdclake.client")
MAX_MESSAGE_BYTES = DEFAULT_MAX_BODY_BYTES


class WsConnection(Protocol):
    def send(self, message: str) -> None: ...
    def recv(self, timeout: float | None = None) -> str | bytes: ...
    def close(self) -> None: ...


WsConnect = Callable[[str, dict[str, str], float], WsConnection]


def _websockets_connect(url: str, headers: dict[str, str], timeout_s: float) -> WsConnection:
    from websockets.sync.client import connect

    # No per-message deflate: it cost more CPU on both ends than it saved (bench_receiver).
    conn: WsConnection = connect(
        url, additional_headers=headers, open_timeout=timeout_s, max_size=MAX_MESSAGE_BYTES, compression=None
    )
    return conn


def ws_url(url: str) -> str:
    """``http(s)://host/base`` -> ``ws(s)://host/base/v1/stream``."""
    for http, ws in (("https://", "wss://"), ("http://", "ws://")):
        if url.startswith(http):
            url = ws + url[len(http) :]
    return url.rstrip("/") + "/v1/stream"


class WsTransport:
    def __init__(
        self, url: str, source: str, token: str | None, batch_size: int, timeout_s: float, connect: WsConnect | None
    ) -> None:
        self._url, self._source, self._batch_size, self._timeout = ws_url(url), source, batch_size, timeout_s
        self._connect = connect or _websockets_connect
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._conn: WsConnection | None = None
        self.server_last_ack: int | None = None

    def use(self, url: str) -> None:
        # The next call connects there and resumes with ``connect``/``status`` as after a drop.
        self.close()
        self._url = ws_url(url)

    def _io(self, action: Callable[[], Any]) -> Any:
        from websockets.exceptions import InvalidStatus, WebSocketException

        try:
            return action()
        except InvalidStatus as exc:
            # The upgrade was refused with an HTTP status (401, 403, 429, 503 ...).
            resp = exc.response
            self.close()
            raise failure(
                json_object(bytes(resp.body or b"")), resp.status_code, resp.headers.get("Retry-After")
            ) from None
        except (OSError, TimeoutError, WebSocketException) as exc:
            self.close()
            raise Retry("connection_lost", f"{type(exc).__name__}: {exc}", switch=True) from None

    def _recv(self, conn: WsConnection) -> dict[str, Any]:
        deadline = time.monotonic() + self._timeout
        while True:
            msg = json_object(self._io(lambda: conn.recv(timeout=max(0.0, deadline - time.monotonic()))))
            if msg is not None:
                return msg

    def _open(self, last_ack: int | None) -> WsConnection:
        from websockets.exceptions import WebSocketException

        if self._conn is not None:
            return self._conn
        conn: WsConnection = self._io(lambda: self._connect(self._url, self._headers, self._timeout))
        self._conn = conn
        hello = {
            "type": "connect",
            "timestamp": int(time.time() * 1000),
            "sourceDoId": self._source,
            "lastAckSequence": last_ack,
            "protocolVersion": PROTOCOL_VERSION,
            "capabilities": {
                "binaryProtocol": False,
                "compression": False,
                "batching": True,
                "maxBatchSize": self._batch_size,
                "maxMessageSize": MAX_MESSAGE_BYTES,
            },
        }
        # A refusal (bad token) may already be waiting: the recv below reports it, or the loss.
        with contextlib.suppress(OSError, WebSocketException):
            conn.send(msgspec.json.encode(hello).decode())
        reply = self._recv(conn)
        if reply.get("type") == "nack":
            self.close()
            raise failure(reply)
        if reply.get("type") != "status" or "lastAckSequence" not in reply:
            self.close()
            raise ProducerError("protocol_error", f"expected a status reply to connect, got {reply!r:.200}")
        self.server_last_ack = int_or_none(reply["lastAckSequence"])
        return conn

    def resume(self, last_ack: int | None) -> int | None:
        self._open(last_ack)
        return self.server_last_ack

    def send(self, batch: Batch, last_ack: int | None) -> Ack:
        conn = self._open(last_ack)
        events_json = msgspec.json.encode(batch.events)
        msg = {
            "type": "cdc_batch",
            "timestamp": int(time.time() * 1000),
            "sourceDoId": self._source,
            **batch.fields(),
            "sizeBytes": len(events_json),
            "correlationId": f"{self._source}:{batch.sequence_number}:{batch.retry_count}",
        }
        self._io(lambda: conn.send(msgspec.json.encode(msg).decode()))
        while True:
            reply = self._recv(conn)
            kind, seq = reply.get("type"), reply.get("sequenceNumber")
            # A nack without sequenceNumber is about the frame we just sent (it could not be parsed).
            if kind == "ack" and seq == batch.sequence_number:
                return ack_of(reply, batch)
            if kind == "nack" and seq in (batch.sequence_number, None):
                raise failure(reply)

    def request_flush(self, last_ack: int | None) -> dict[str, Any]:
        conn = self._open(last_ack)
        msg = {"type": "flush_request", "timestamp": int(time.time() * 1000), "sourceDoId": self._source}
        self._io(lambda: conn.send(msgspec.json.encode(msg | {"reason": "manual"}).decode()))
        while True:  # the receiver answers with a status message carrying "flush"
            reply = self._recv(conn)
            if reply.get("type") == "nack":
                raise failure(reply)
            if reply.get("type") == "status" and isinstance(reply.get("flush"), dict):
                flush: dict[str, Any] = reply["flush"]
                if "error" in flush:
                    raise ProducerError("flush_failed", str(flush["error"]))
                return flush

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # the connection is being discarded anyway
                log.debug("closing the WebSocket failed", exc_info=True)
