"""The receiver's refusal: :class:`Rejected`, raised or returned wherever a batch or request is
turned away (authentication, limits, rates, backpressure, bodies that do not decode).

It carries the HTTP status, the protocol's nack reason, and the field or limit at fault, so the
transports (HTTP, WebSocket) answer alike (:func:`receiver.answer.refusal`).
"""

from __future__ import annotations

from typing import Any

from cdclake.contracts.protocol import NackReason


class Rejected(Exception):
    def __init__(
        self,
        status: int,
        reason: NackReason,
        message: str,
        field: str | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.message = message
        self.field = field
        self.extra = extra or {}

    def __str__(self) -> str:
        return f"{self.field}: {self.message}" if self.field else self.message
