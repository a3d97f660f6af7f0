"""WebSocket ``/ws`` and ``/v1/stream`` (one handler): the streaming protocol (docs/protocol.md).

Client: ``connect`` (resumption via the server's ``lastAckSequence`` in the ``status`` reply),
``cdc_batch``, ``heartbeat``, ``flush_request``. Server: ``ack`` / ``nack`` per batch (same
answers as HTTP, see :mod:`receiver.service`) and ``status``. Frames are handled in order, one
at a time per connection, so acks come back in the order batches were sent.

Identity: the protocol's ``sourceDoId`` is the producer's source id (the ``source`` of HTTP batches,
the staging objects' producer, the key of sequence numbers and per-producer limits). The protocol's
producer also names itself in the upgrade's ``X-Client-ID`` (its sourceDoId) and ``X-Shard-Name``
(its ``sourceShardName``) headers; a connection speaks for one source, so a header that
contradicts the ``connect`` message is refused, and so is a batch for another ``sourceDoId``.
With tokens the token's id is the source: ``sourceDoId`` (and so ``X-Client-ID``) must be it.

:func:`stream` is a module-level handler over the app's lifespan state (``ws.state``), like the
HTTP handlers of :mod:`receiver.app`; one connection goes handshake, receive loop (connect, batch,
heartbeat, flush), close.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.to_thread
from starlette.types import Message
from starlette.websockets import WebSocket, WebSocketDisconnect

from cdclake.contracts import names
from cdclake.contracts.events import Batch, InvalidBatch
from cdclake.contracts.protocol import Ack, Nack
from receiver import auth, decode
from receiver.answer import refusal
from receiver.notify import Notifier
from receiver.protocol import (
    PROTOCOL_VERSION,
    CDCBatchMessage,
    ClientMessage,
    Connect,
    FlushRequest,
    Heartbeat,
    decode_client_message,
    encode,
    nack,
    now_ms,
    peek_ids,
)
from receiver.rejected import Rejected
from receiver.service import Service

log = logging.getLogger("cdclake.receiver")

POLICY_VIOLATION = 1008
TRY_AGAIN_LATER = 1013
BIG_FRAME = 65536
"""Frames larger than this are decoded off the event loop."""


def connected(svc: Service) -> dict[str, int]:
    return {k: v for k, v in svc.ws_connections.items() if v}


def status_message(svc: Service, source: str | None, **extra: Any) -> dict[str, Any]:
    """The protocol's StatusMessage. ``buffer.batchCount`` / ``utilization`` are the staging objects
    waiting for ``cdc_apply`` (what backpressure is measured on); ``eventCount`` /
    ``totalSizeBytes`` are the batches this receiver holds that are not durable yet."""
    body: dict[str, Any] = {
        "type": "status",
        "timestamp": now_ms(),
        "state": "receiving" if svc.in_flight else "idle",
        "buffer": {
            "batchCount": svc.backlog.total,
            "eventCount": svc.in_flight_events,
            "totalSizeBytes": svc.in_flight_bytes,
            "utilization": round(svc.backlog.utilization, 4),
        },
        "connectedSources": len(connected(svc)),
        **extra,
    }
    # Optional in the protocol: absent, not null, until something has landed.
    if svc.lander.last_landing_ms is not None:
        body["lastFlushTime"] = svc.lander.last_landing_ms
    return body


def contradiction(header: str, sent: str | None, name: str, value: str | None) -> str | None:
    """Why the upgrade header ``header`` (value ``sent``) contradicts the connect's ``name``."""
    if sent is None or value is None or sent == value:
        return None
    return f"{header} {sent!r} is not the connect message's {name} {value!r}: a connection speaks for one source"


async def receive_by(ws: WebSocket, deadline: float | None) -> Message | None:
    """The next frame, or None when ``deadline`` (anyio time) passes first."""
    if deadline is None:
        return await ws.receive()
    with anyio.move_on_after(deadline - anyio.current_time()):
        return await ws.receive()
    return None


def decode_guarded(data: bytes, limits: names.Limits) -> ClientMessage:
    with decode.depth_guard():
        return decode_client_message(data, limits)


@dataclass
class Connection:
    """One WebSocket and what it has said so far: its producer (with tokens), its upgrade
    headers, and the source and shard its ``connect`` named."""

    ws: WebSocket
    svc: Service
    notifier: Notifier
    limits: names.Limits
    who: auth.Producer | None
    client_id: str | None
    shard_header: str | None
    source: str | None = None
    shard: str | None = None

    async def send(self, body: Ack | Nack | dict[str, Any]) -> None:
        await self.ws.send_text(encode(body).decode())

    async def refuse(self, body: Ack | Nack, code: int, reason: str) -> None:
        """Say why, then close the connection."""
        await self.send(body)
        await self.ws.close(code, reason)


async def stream(ws: WebSocket) -> None:
    """The handler at ``/ws`` and ``/v1/stream``."""
    conn = await handshake(ws)
    if conn is None:
        return
    try:
        await receive_loop(conn)
    except WebSocketDisconnect:
        return
    finally:
        close(conn)


async def handshake(ws: WebSocket) -> Connection | None:
    """Accept and authenticate; None when the token is refused (and the connection closed)."""
    svc: Service = ws.state.service
    await ws.accept()
    who = svc.authenticate(ws.headers.get("authorization"))
    if isinstance(who, Rejected):
        await ws.send_text(encode(refusal(who).body).decode())
        await ws.close(POLICY_VIOLATION, who.message[:120])
        return None
    client_id, shard_header = ws.headers.get("x-client-id"), ws.headers.get("x-shard-name")
    return Connection(ws, svc, ws.state.notifier, ws.state.limits, who, client_id, shard_header)


def close(c: Connection) -> None:
    """The connection no longer speaks for its source (gone, or switched by a new connect)."""
    if c.source is not None:
        c.svc.ws_closed(c.source)


async def receive_loop(c: Connection) -> None:
    """Frames in order, one at a time, until the client leaves or a frame ends the connection."""
    settings = c.svc.settings
    connect_by = anyio.current_time() + settings.ws_connect_timeout_s
    while True:
        frame = await receive_by(c.ws, None if c.source else connect_by)
        if frame is None:
            t = settings.ws_connect_timeout_s
            why = f"no connect message within {t:g} s of opening (CDCLAKE_WS_CONNECT_TIMEOUT_S)"
            await c.refuse(nack("invalid_format", why, field="$.type"), POLICY_VIOLATION, "connect not sent in time")
            return
        if frame["type"] == "websocket.disconnect":
            return
        data: bytes = frame.get("bytes") or (frame.get("text") or "").encode()
        msg = await read(c, data)
        if isinstance(msg, Connect):
            if not await on_connect(c, msg):
                return
        elif isinstance(msg, CDCBatchMessage):
            box = [msg]
            del msg  # the batch must be freed by the worker, not on the loop
            await on_batch(c, box, len(data))
        elif isinstance(msg, Heartbeat):
            await c.send(status_message(c.svc, c.source))
        elif isinstance(msg, FlushRequest):
            await on_flush(c)


async def read(c: Connection, data: bytes) -> ClientMessage | None:
    """The frame's message, or None once it is refused (too big, or not a valid message)."""
    limit = c.svc.settings.max_body_bytes
    if len(data) > limit:
        seq, cid = peek_ids(data[:4096])
        await c.send(refusal(decode.too_large(limit, "message"), seq, cid).body)
        return None
    try:
        if len(data) > BIG_FRAME:
            return await anyio.to_thread.run_sync(decode_guarded, data, c.limits)
        return decode_guarded(data, c.limits)
    except InvalidBatch as exc:
        seq, cid = peek_ids(data)
        await c.send(nack("invalid_format", exc.message, sequence_number=seq, correlation_id=cid, field=exc.field))
    except Rejected as exc:  # too deep to decode, so too deep to peek at
        await c.send(refusal(exc).body)
    return None


async def on_connect(c: Connection, msg: Connect) -> bool:
    """Take the source the connect names and say where it stands; False once closed."""
    if msg.protocolVersion != PROTOCOL_VERSION:
        why = f"protocolVersion {msg.protocolVersion} is not supported (use {PROTOCOL_VERSION})"
        await c.send(nack("invalid_format", why, field="$.protocolVersion", correlation_id=msg.correlationId))
        return True
    c.shard = msg.sourceShardName or c.shard_header
    if not await identity_holds(c, msg):
        return False
    if c.source != msg.sourceDoId:
        unknown = c.svc.admit(msg.sourceDoId, authenticated=c.who is not None)
        if unknown is not None:  # without tokens, too many source ids this hour
            await c.send(refusal(unknown, None, msg.correlationId).body)
            return True
        full = c.svc.ws_opened(msg.sourceDoId)
        if full is not None:
            await c.refuse(refusal(full).body, TRY_AGAIN_LATER, "connection limit")
            return False
        close(c)
        c.source = msg.sourceDoId
    await c.send(await resumption(c, msg.correlationId))
    return True


async def identity_holds(c: Connection, msg: Connect) -> bool:
    """Whether the connect agrees with the upgrade headers and the token; else closed."""
    for header, wrong in (
        ("X-Client-ID", contradiction("X-Client-ID", c.client_id, "sourceDoId", msg.sourceDoId)),
        ("X-Shard-Name", contradiction("X-Shard-Name", c.shard_header, "sourceShardName", c.shard)),
    ):
        if wrong is not None:
            body = nack("invalid_format", wrong, field=header, correlation_id=msg.correlationId)
            await c.refuse(body, POLICY_VIOLATION, f"{header} contradicts connect")
            return False
    if c.who is not None and c.who.id != msg.sourceDoId:
        body = nack("invalid_format", f"this token sends as {c.who.id!r}", field="$.sourceDoId")
        await c.refuse(body, POLICY_VIOLATION, "wrong source for token")
        return False
    return True


async def resumption(c: Connection, cid: str | None) -> dict[str, Any]:
    """The status that answers a connect: the source's last landed batch to resume after."""
    assert c.source is not None
    try:
        last = await anyio.to_thread.run_sync(c.svc.lander.last_sequence, c.source, True)
    except Exception:  # store down: what this process knows (the spool counts)
        last = c.svc.lander.cached_sequence(c.source)
    extra: dict[str, Any] = {"lastAckSequence": last, "correlationId": cid}
    if c.shard is not None:
        extra["sourceShardName"] = c.shard
    return status_message(c.svc, c.source, **extra)


async def on_batch(c: Connection, box: list[CDCBatchMessage], size: int) -> None:
    """Submit the batch in ``box`` (emptied here) as HTTP batches are, and send its answer."""
    msg = box.pop()
    seq, cid = msg.sequenceNumber, msg.correlationId
    if c.source is not None and msg.sourceDoId != c.source:
        why = f"this connection is {c.source!r}'s (its connect), not {msg.sourceDoId!r}'s"
        await c.send(nack("invalid_format", why, sequence_number=seq, correlation_id=cid, field="$.sourceDoId"))
        return
    batches = [Batch(msg.sourceDoId, seq, msg.events, msg.transactions)]
    del msg  # the batch must be freed by the worker, not on the loop

    def build(batches: list[Batch] = batches) -> decode.Decoded:
        return decode.Decoded(batches.pop(), False)

    answer = await c.svc.submit(build, c.who, "ws", size, cid, seq)
    await c.send(answer.body)


async def on_flush(c: Connection) -> None:
    try:  # coalesced: repeated requests share one cdc_apply run
        run_id = await c.notifier.flush()
        await c.send(status_message(c.svc, c.source, flush={"dag_run_id": run_id}))
    except Exception as exc:
        await c.send(status_message(c.svc, c.source, flush={"error": str(exc)}))
