"""Ack and nack bodies, shaped like the seed protocol's AckMessage / NackMessage."""

from __future__ import annotations

import time
from typing import Any


def ack(sequence_number: int, status: str, **details: Any) -> dict[str, Any]:
    return {
        "type": "ack",
        "timestamp": int(time.time() * 1000),
        "sequenceNumber": sequence_number,
        "status": status,
        "details": details,
    }


def nack(
    reason: str,
    message: str,
    *,
    sequence_number: int | None = None,
    should_retry: bool = False,
    **extra: Any,
) -> dict[str, Any]:
    return {
        "type": "nack",
        "timestamp": int(time.time() * 1000),
        "sequenceNumber": sequence_number,
        "reason": reason,
        "errorMessage": message,
        "shouldRetry": should_retry,
        **extra,
    }
