"""The receiver's answers read back: an ack body to :class:`Ack`, a nack body or failed HTTP
response to :class:`ProducerError` (for good) or :class:`Retry` (with its hinted delay and
whether to move to another replica)."""

from __future__ import annotations

import email.utils
import time
from collections.abc import Mapping
from typing import Any

import msgspec

from cdclake.client.batch import Batch
from cdclake.client.errors import Ack, ProducerError, Retry
from cdclake.contracts.protocol import LEAVING_REASONS, RETRYABLE_REASONS

_RETRYABLE_STATUS = frozenset({408, 425, 429})
# A gateway status without the receiver's own JSON answer: a proxy found no healthy replica behind it.
_GATEWAY_STATUS = frozenset({502, 503, 504})


def int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _ms_to_s(value: Any) -> float | None:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and value >= 0
    return value / 1000 if ok else None


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:  # the HTTP-date form
        return max(0.0, email.utils.parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


def json_object(data: bytes | str) -> dict[str, Any] | None:
    try:
        obj = msgspec.json.decode(data)
    except msgspec.DecodeError:
        return None
    return obj if isinstance(obj, dict) else None


def failure(
    body: Mapping[str, Any] | None, status: int | None = None, retry_after: str | None = None
) -> ProducerError | Retry:
    """The error for a nack (WebSocket: ``status`` None) or a failed HTTP response."""
    b = body or {}
    answered = bool(b.get("reason") or b.get("error"))  # the receiver's own answer, not a proxy's
    reason = str(b.get("reason") or b.get("error") or (f"http_{status}" if status else "unknown"))
    message = str(b.get("errorMessage") or b.get("message") or reason)
    if status is not None:
        # Over HTTP the status decides: a proxy's 502 has no nack body, a 400 never passes on retry.
        retry = status >= 500 or status in _RETRYABLE_STATUS
        message = f"HTTP {status}: {message}"
    else:
        should = b.get("shouldRetry")
        retry = should if isinstance(should, bool) else reason in RETRYABLE_REASONS
    if retry:
        hints = [h for h in (_retry_after(retry_after), _ms_to_s(b.get("retryDelayMs"))) if h is not None]
        # Backpressure (buffer_full, rate_limited, ...) comes from a healthy replica and is about
        # the shared store or this producer: another replica would say the same, so stay and wait.
        switch = reason in LEAVING_REASONS or (status in _GATEWAY_STATUS and not answered)
        return Retry(reason, message, max(hints) if hints else None, switch=switch)
    return ProducerError(
        reason,
        message,
        b.get("field") if isinstance(b.get("field"), str) else None,
        expected_sequence=int_or_none(b.get("expectedSequence")),
        status_code=status,
        max_size=int_or_none(b.get("maxSize")),
    )


def ack_of(body: Mapping[str, Any], batch: Batch) -> Ack:
    if body.get("sequenceNumber") != batch.sequence_number:
        raise ProducerError(
            "protocol_error", f"ack for {body.get('sequenceNumber')!r}, sent batch {batch.sequence_number}"
        )
    details = body.get("details")
    details = details if isinstance(details, dict) else {}
    delay = int_or_none(details.get("suggestedDelayMs")) or 0
    return Ack(batch.sequence_number, str(body.get("status")), len(batch.events), details, max(0, delay))
