"""The wire protocol (docs/protocol.md) on the receiver's side: ack and nack bodies built from the contract's
Structs (:mod:`cdclake.contracts.protocol`), their encoding, and the WebSocket client messages.

Client messages are decoded typed (msgspec), so a bad one is refused with the JSON path of the
field at fault, like HTTP batches.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

import msgspec

from cdclake.contracts import names
from cdclake.contracts.events import (
    Batch,
    CDCEvent,
    InvalidBatch,
    NonNegative,
    SourceId,
    TransactionId,
    TransactionMarker,
    check_batch,
    typed_decode,
)
from cdclake.contracts.protocol import (
    ACK_STATUSES,
    NACK_REASONS,
    PROTOCOL_VERSION,
    Ack,
    AckDetails,
    AckStatus,
    Nack,
    NackReason,
)
from receiver.ratelimit import Decision


def now_ms() -> int:
    return int(time.time() * 1000)


def ack(
    sequence_number: int,
    status: AckStatus,
    details: AckDetails,
    correlation_id: str | None = None,
    rate_limit: Decision | None = None,
) -> Ack:
    """With the token bucket's ``rate_limit`` decision for this batch, the ack carries the protocol's
    ``rateLimit`` block and ``details.remainingTokens`` / ``bucketCapacity``."""
    if rate_limit is not None:
        details.remainingTokens, details.bucketCapacity = rate_limit.remaining, rate_limit.limit
    block = rate_limit.block() if rate_limit is not None else None
    return Ack(now_ms(), sequence_number, status, details, block, correlation_id)


def nack(
    reason: NackReason,
    message: str,
    *,
    sequence_number: int | None = None,
    should_retry: bool = False,
    correlation_id: str | None = None,
    field: str | None = None,
    **extra: Any,
) -> Nack:
    """``extra``: the Nack's other optional fields by their wire names (``retryDelayMs``, ...)."""
    return Nack(
        now_ms(), sequence_number, reason, message, should_retry, field=field, correlationId=correlation_id, **extra
    )


encode = msgspec.json.Encoder().encode
"""A body (Ack, Nack, a status message) as JSON, the same bytes json.dumps(ensure_ascii=False) gives."""


# --------------------------------------------------------------------------- client messages

Capped = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]


class Capabilities(msgspec.Struct):
    binaryProtocol: bool = False
    compression: bool = False
    batching: bool = True
    maxBatchSize: Capped = 1000
    maxMessageSize: Capped = 4 * 1024 * 1024


class Connect(msgspec.Struct, tag="connect", tag_field="type"):
    sourceDoId: SourceId
    protocolVersion: Annotated[int, msgspec.Meta(ge=1)] = PROTOCOL_VERSION
    lastAckSequence: NonNegative | None = None
    timestamp: Capped | None = None
    correlationId: str | None = None
    sourceShardName: str | None = None
    capabilities: Capabilities = msgspec.field(default_factory=Capabilities)


class CDCBatchMessage(msgspec.Struct, tag="cdc_batch", tag_field="type"):
    sourceDoId: SourceId
    sequenceNumber: NonNegative
    events: Annotated[list[CDCEvent], msgspec.Meta(min_length=1, max_length=100_000)]
    timestamp: Capped | None = None
    correlationId: str | None = None
    sourceShardName: str | None = None
    firstEventSequence: Capped | None = None
    lastEventSequence: Capped | None = None
    sizeBytes: Capped | None = None
    isRetry: bool = False
    retryCount: Capped = 0
    transactions: Annotated[list[TransactionMarker], msgspec.Meta(max_length=100_000)] | None = None
    """As :attr:`cdclake.contracts.events.Batch.transactions`."""
    transaction: TransactionId | None = None
    """As :attr:`cdclake.contracts.events.Batch.transaction`; expanded when the frame is decoded."""


class Heartbeat(msgspec.Struct, tag="heartbeat", tag_field="type"):
    sourceDoId: SourceId | None = None
    timestamp: Capped | None = None
    lastAckSequence: NonNegative | None = None
    pendingEvents: Capped | None = None


class FlushRequest(msgspec.Struct, tag="flush_request", tag_field="type"):
    sourceDoId: SourceId | None = None
    timestamp: Capped | None = None
    reason: Literal["manual", "shutdown", "buffer_full", "time_threshold"] = "manual"


ClientMessage = Connect | CDCBatchMessage | Heartbeat | FlushRequest
_client: msgspec.json.Decoder[ClientMessage] = msgspec.json.Decoder(ClientMessage)


def decode_client_message(data: bytes, limits: names.Limits = names.DEFAULT) -> ClientMessage:
    """One client frame; :class:`InvalidBatch` names the bad field (``$.type`` for unknown types)."""
    msg = typed_decode(_client, data)
    if isinstance(msg, CDCBatchMessage):
        parts = Batch(msg.sourceDoId, msg.sequenceNumber, msg.events, msg.transactions, msg.transaction)
        batch = check_batch(parts, limits)
        msg.transactions, msg.transaction = batch.transactions, None  # the shorthand, expanded
    return msg


class _Peek(msgspec.Struct):
    sequenceNumber: Any = None
    correlationId: Any = None


_peek = msgspec.json.Decoder(_Peek)


def peek_ids(data: bytes) -> tuple[int | None, str | None]:
    """Best-effort sequenceNumber / correlationId of a frame that failed validation, for the nack."""
    try:
        p = _peek.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None, None
    seq = p.sequenceNumber if isinstance(p.sequenceNumber, int) and not isinstance(p.sequenceNumber, bool) else None
    cid = p.correlationId if isinstance(p.correlationId, str) else None
    return seq, cid


__all__ = [
    "ACK_STATUSES",
    "NACK_REASONS",
    "PROTOCOL_VERSION",
    "CDCBatchMessage",
    "ClientMessage",
    "Connect",
    "FlushRequest",
    "Heartbeat",
    "InvalidBatch",
    "ack",
    "decode_client_message",
    "encode",
    "nack",
    "now_ms",
    "peek_ids",
]
