"""The wire protocol, written once: its vocabulary and the receiver's answers to a batch
(:class:`Ack`, :class:`Nack`). The receiver builds and encodes its bodies from these Structs,
its OpenAPI document is generated from them, and the producer SDK (:mod:`cdclake.client`) can
decode with them.

Only msgspec beside the standard library, so the client install carries it. The WebSocket
client messages are in :mod:`receiver.protocol`.
"""

from __future__ import annotations

from typing import Annotated, Literal, get_args

import msgspec

PROTOCOL_VERSION = 1
"""The ``protocolVersion`` a WebSocket ``connect`` must carry."""

NackReason = Literal[
    "buffer_full",
    "rate_limited",
    "invalid_sequence",
    "invalid_format",
    "internal_error",
    "shutting_down",
    "payload_too_large",
    "event_too_large",
    "load_shedding",
    "connection_limit",
]
AckStatus = Literal["ok", "persisted", "duplicate", "fallback"]
NACK_REASONS: tuple[NackReason, ...] = get_args(NackReason)
ACK_STATUSES: tuple[AckStatus, ...] = get_args(AckStatus)

RETRYABLE_REASONS: frozenset[NackReason] = frozenset(
    {"buffer_full", "rate_limited", "internal_error", "shutting_down", "load_shedding", "connection_limit"}
)
"""Nack reasons that describe the receiver's state rather than the batch: the same batch may
pass later (the nack's ``shouldRetry``)."""

LEAVING_REASONS: frozenset[NackReason] = frozenset({"shutting_down"})
"""Nack reasons by which a replica says it is going away: another replica should take the batch."""

DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024
"""CDCLAKE_MAX_BODY_BYTES's default: the largest batch body (and WebSocket message) accepted."""

assert set(NACK_REASONS) >= RETRYABLE_REASONS and LEAVING_REASONS <= RETRYABLE_REASONS


def _about(description: str) -> msgspec.Meta:
    return msgspec.Meta(description=description)


# The bodies below are the protocol's AckMessage / NackMessage (docs/protocol.md). Their field names are the wire's
# (camelCase); an optional field is absent, never null (omit_defaults), as the protocol's optional fields.


class RateLimit(msgspec.Struct):
    """The protocol's ``rateLimit`` block: this producer's token bucket after the batch."""

    limit: int
    remaining: int
    resetAt: Annotated[int, _about("Unix ms when the bucket is full again")]


class AckDetails(msgspec.Struct, omit_defaults=True):
    eventsProcessed: int
    bufferUtilization: Annotated[float, msgspec.Meta(ge=0, le=1)] | None = None
    suggestedDelayMs: int | None = None
    persistedPath: Annotated[str, _about("the first of persistedPaths (the protocol's)")] | None = None
    persistedPaths: Annotated[list[str], _about("every staging object of the batch, one per table, sorted")] | None = (
        None
    )
    circuitBreakerState: Literal["closed", "open"] | None = None
    remainingTokens: Annotated[int, _about("this producer's token bucket, after")] | None = None
    bucketCapacity: Annotated[int, _about("its burst (CDCLAKE_RATE_LIMIT_BURST)")] | None = None


class Ack(msgspec.Struct, tag="ack", tag_field="type", omit_defaults=True):
    """A batch landed durably (``persisted``, ``duplicate``, ``fallback``) or had no events (``ok``)."""

    timestamp: int
    sequenceNumber: int
    status: AckStatus
    details: AckDetails
    rateLimit: RateLimit | None = None
    correlationId: str | None = None


class Nack(msgspec.Struct, tag="nack", tag_field="type", omit_defaults=True):
    """A batch (or frame, or request) refused: ``shouldRetry`` says whether the same may pass later."""

    timestamp: int
    sequenceNumber: int | None
    reason: NackReason
    errorMessage: str
    shouldRetry: bool
    field: Annotated[str, _about("JSON path of the field at fault, or the header")] | None = None
    retryDelayMs: int | None = None
    maxSize: int | None = None
    expectedSequence: int | None = None
    correlationId: str | None = None


Reply = Ack | Nack
"""What a batch gets back (tagged by ``type``): ``msgspec.json.decode(data, type=Reply)``."""
