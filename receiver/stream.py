"""WebSocket ``/ws`` and ``/v1/stream`` (one handler): the seed's streaming protocol.

Client: ``connect`` (resumption via the server's ``lastAckSequence`` in the ``status`` reply),
``cdc_batch``, ``heartbeat``, ``flush_request``. Server: ``ack`` / ``nack`` per batch (same
answers as HTTP, see :mod:`receiver.service`) and ``status``. Frames are handled in order, one
at a time per connection, so acks come back in the order batches were sent.

Identity: the seed's ``sourceDoId`` is the producer's source id (the ``source`` of HTTP batches,
the staging objects' producer, the key of sequence numbers and per-producer limits). The seed's
producer also names itself in the upgrade's ``X-Client-ID`` (its sourceDoId) and ``X-Shard-Name``
(its ``sourceShardName``) headers; a connection speaks for one source, so a header that
contradicts the ``connect`` message is refused, and so is a batch for another ``sourceDoId``.
With tokens the token's id is the source: ``sourceDoId`` (and so ``X-Client-ID``) must be it.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.to_thread
from starlette.types import Message
from starlette.websockets import WebSocket, WebSocketDisconnect

from cdclake.config.settings import Settings
from cdclake.contracts import names
from cdclake.contracts.events import Batch, InvalidBatch
from receiver import decode
from receiver.notify import Notifier
from receiver.protocol import (
    PROTOCOL_VERSION,
    CDCBatchMessage,
    ClientMessage,
    Connect,
    FlushRequest,
    Heartbeat,
    decode_client_message,
    nack,
    now_ms,
    peek_ids,
)
from receiver.rejected import Rejected
from receiver.service import Service, refusal

log = logging.getLogger("cdclake.receiver")

POLICY_VIOLATION = 1008
TRY_AGAIN_LATER = 1013


def connected(svc: Service) -> dict[str, int]:
    return {k: v for k, v in svc.ws_connections.items() if v}


def status_message(svc: Service, source: str | None, **extra: Any) -> dict[str, Any]:
    """The seed's StatusMessage. ``buffer.batchCount`` / ``utilization`` are the staging objects
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
    # Optional in the seed: absent, not null, until something has landed.
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


def endpoint(settings: Settings) -> Callable[[WebSocket], Awaitable[None]]:
    limits = names.Limits.of(settings)

    async def stream(ws: WebSocket) -> None:
        svc: Service = ws.state.service
        notifier: Notifier = ws.state.notifier
        await ws.accept()
        who = svc.authenticate(ws.headers.get("authorization"))
        if isinstance(who, Rejected):
            await ws.send_json(refusal(who).body)
            await ws.close(POLICY_VIOLATION, who.message[:120])
            return
        client_id, shard_header = ws.headers.get("x-client-id"), ws.headers.get("x-shard-name")
        source: str | None = None
        shard: str | None = None
        connect_by = anyio.current_time() + settings.ws_connect_timeout_s
        try:
            while True:
                frame = await receive_by(ws, None if source else connect_by)
                if frame is None:
                    t = settings.ws_connect_timeout_s
                    why = f"no connect message within {t:g} s of opening (CDCLAKE_WS_CONNECT_TIMEOUT_S)"
                    await ws.send_json(nack("invalid_format", why, field="$.type"))
                    await ws.close(POLICY_VIOLATION, "connect not sent in time")
                    return
                if frame["type"] == "websocket.disconnect":
                    return
                data: bytes = frame.get("bytes") or (frame.get("text") or "").encode()
                if len(data) > settings.max_body_bytes:
                    seq, cid = peek_ids(data[:4096])
                    await ws.send_json(refusal(decode.too_large(settings.max_body_bytes, "message"), seq, cid).body)
                    continue
                try:
                    if len(data) > 65536:  # big frames: decode off the event loop
                        msg = await anyio.to_thread.run_sync(decode_guarded, data, limits)
                    else:
                        msg = decode_guarded(data, limits)
                except InvalidBatch as exc:
                    seq, cid = peek_ids(data)
                    await ws.send_json(
                        nack("invalid_format", exc.message, sequence_number=seq, correlation_id=cid, field=exc.field)
                    )
                    continue
                except Rejected as exc:  # too deep to decode, so too deep to peek at
                    await ws.send_json(refusal(exc).body)
                    continue
                if isinstance(msg, Connect):
                    if msg.protocolVersion != PROTOCOL_VERSION:
                        await ws.send_json(
                            nack(
                                "invalid_format",
                                f"protocolVersion {msg.protocolVersion} is not supported (use {PROTOCOL_VERSION})",
                                field="$.protocolVersion",
                                correlation_id=msg.correlationId,
                            )
                        )
                        continue
                    shard = msg.sourceShardName or shard_header
                    for header, wrong in (
                        ("X-Client-ID", contradiction("X-Client-ID", client_id, "sourceDoId", msg.sourceDoId)),
                        ("X-Shard-Name", contradiction("X-Shard-Name", shard_header, "sourceShardName", shard)),
                    ):
                        if wrong is not None:
                            cid = msg.correlationId
                            await ws.send_json(nack("invalid_format", wrong, field=header, correlation_id=cid))
                            await ws.close(POLICY_VIOLATION, f"{header} contradicts connect")
                            return
                    if who is not None and who.id != msg.sourceDoId:
                        await ws.send_json(
                            nack("invalid_format", f"this token sends as {who.id!r}", field="$.sourceDoId")
                        )
                        await ws.close(POLICY_VIOLATION, "wrong source for token")
                        return
                    if source != msg.sourceDoId:
                        unknown = svc.admit(msg.sourceDoId, authenticated=who is not None)
                        if unknown is not None:  # without tokens, too many source ids this hour
                            await ws.send_json(refusal(unknown, None, msg.correlationId).body)
                            continue
                        full = svc.ws_opened(msg.sourceDoId)
                        if full is not None:
                            await ws.send_json(refusal(full).body)
                            await ws.close(TRY_AGAIN_LATER, "connection limit")
                            return
                        if source is not None:
                            svc.ws_closed(source)
                        source = msg.sourceDoId
                    try:
                        last = await anyio.to_thread.run_sync(svc.lander.last_sequence, source, True)
                    except Exception:  # store down: what this process knows (the spool counts)
                        last = svc.lander.cached_sequence(source)
                    extra: dict[str, Any] = {"lastAckSequence": last, "correlationId": msg.correlationId}
                    if shard is not None:
                        extra["sourceShardName"] = shard
                    await ws.send_json(status_message(svc, source, **extra))
                elif isinstance(msg, CDCBatchMessage):
                    seq, cid = msg.sequenceNumber, msg.correlationId
                    if source is not None and msg.sourceDoId != source:
                        why = f"this connection is {source!r}'s (its connect), not {msg.sourceDoId!r}'s"
                        await ws.send_json(
                            nack("invalid_format", why, sequence_number=seq, correlation_id=cid, field="$.sourceDoId")
                        )
                        continue
                    box = [Batch(msg.sourceDoId, seq, msg.events)]
                    del msg  # the batch must be freed by the worker, not on the loop

                    def build(box: list[Batch] = box) -> decode.Decoded:
                        return decode.Decoded(box.pop(), False)

                    answer = await svc.submit(build, who, "ws", len(data), cid, seq)
                    await ws.send_json(answer.body)
                elif isinstance(msg, Heartbeat):
                    await ws.send_json(status_message(svc, source))
                elif isinstance(msg, FlushRequest):
                    try:  # coalesced: repeated requests share one cdc_apply run
                        run_id = await notifier.flush()
                        await ws.send_json(status_message(svc, source, flush={"dag_run_id": run_id}))
                    except Exception as exc:
                        await ws.send_json(status_message(svc, source, flush={"error": str(exc)}))
        except WebSocketDisconnect:
            return
        finally:
            if source is not None:
                svc.ws_closed(source)

    return stream
