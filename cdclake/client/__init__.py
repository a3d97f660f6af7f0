"""Synchronous CDC producer: buffers events, numbers them, sends them as batches to the receiver
over HTTP (``POST /v1/batches``) or WebSocket (``/v1/stream``) and retries until each is acked.

A retry resends the same batch under the same ``sequenceNumber``, so the receiver can recognise a
batch that already landed and ack it ``duplicate``: at-least-once on the wire, once in staging.
Given several receiver replicas (they share the staging store and so the receipts), a retry after a
replica failed goes to the next one, which recognises the batch just the same.
A Producer is not thread-safe; use one per thread.

Modules: :mod:`~cdclake.client.producer` (the :class:`Producer`), :mod:`~cdclake.client.retry`
(its retry loop and failover), :mod:`~cdclake.client.http_transport` and
:mod:`~cdclake.client.ws_transport`, :mod:`~cdclake.client.replies` (answers read back),
:mod:`~cdclake.client.errors`, :mod:`~cdclake.client.batch`, :mod:`~cdclake.client.replicas`,
:mod:`~cdclake.client.transport`. Import from ``cdclake.client``: the names below are the SDK.

The read side is :mod:`cdclake.client.lake` (``lake.connect(url).query(sql)``): SQL over the
lake's tables through the query API, with the same light dependencies.
"""

from __future__ import annotations

from cdclake.client.errors import Ack, ProducerError
from cdclake.client.producer import Producer
from cdclake.client.ws_transport import MAX_MESSAGE_BYTES, WsConnect, WsConnection, ws_url

__all__ = [
    "MAX_MESSAGE_BYTES",
    "Ack",
    "Producer",
    "ProducerError",
    "WsConnect",
    "WsConnection",
    "ws_url",
]
