"""The wire protocol's vocabulary, written once: the receiver answers with it, the producer SDK
(:mod:`cdclake.client`) reads it, and the receiver's OpenAPI document enumerates it.

Pure Python with no third-party import, so the client install carries it. The message bodies
themselves are built in :mod:`receiver.protocol` (acks, nacks, the WebSocket client messages).
"""

from __future__ import annotations

PROTOCOL_VERSION = 1
"""The ``protocolVersion`` a WebSocket ``connect`` must carry."""

NACK_REASONS = (
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
)
ACK_STATUSES = ("ok", "persisted", "duplicate", "fallback")

RETRYABLE_REASONS = frozenset(
    {"buffer_full", "rate_limited", "internal_error", "shutting_down", "load_shedding", "connection_limit"}
)
"""Nack reasons that describe the receiver's state rather than the batch: the same batch may
pass later (the nack's ``shouldRetry``)."""

LEAVING_REASONS = frozenset({"shutting_down"})
"""Nack reasons by which a replica says it is going away: another replica should take the batch."""

DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024
"""CDCLAKE_MAX_BODY_BYTES's default: the largest batch body (and WebSocket message) accepted."""

assert set(NACK_REASONS) >= RETRYABLE_REASONS and LEAVING_REASONS <= RETRYABLE_REASONS
