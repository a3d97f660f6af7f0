"""What a producer is told about a batch: acked (:class:`Ack`), rejected or given up on
(:class:`ProducerError`), or worth another attempt (:class:`Retry`, internal to the SDK)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Ack:
    sequence_number: int
    status: str
    """``persisted``, ``duplicate`` (landed before), ``fallback`` ... every status is a success."""
    events: int
    details: dict[str, Any] = field(default_factory=dict)
    suggested_delay_ms: int = 0


class ProducerError(Exception):
    """A batch was rejected for good, or could not be delivered within ``max_attempts``."""

    def __init__(
        self,
        reason: str,
        message: str,
        field: str | None = None,
        *,
        expected_sequence: int | None = None,
        status_code: int | None = None,
        max_size: int | None = None,
        retryable: bool = False,
        events: list[dict[str, Any]] | None = None,
    ) -> None:
        text = f"{reason}: {message}"
        if field:
            text += f" (field {field})"
        if expected_sequence is not None:
            text += f" (receiver expects sequenceNumber {expected_sequence})"
        super().__init__(text)
        self.reason, self.message, self.field = reason, message, field
        self.expected_sequence, self.status_code, self.max_size = expected_sequence, status_code, max_size
        self.retryable = retryable
        """True: gave up on a transient failure; the batch stays pending and the next flush resends it."""
        self.events = events
        """The rejected batch's events when it was dropped (nothing of it landed)."""


class Retry(Exception):
    """A transient failure: the retry loop tries again, on the next replica when ``switch``."""

    def __init__(self, reason: str, message: str, delay_s: float | None = None, *, switch: bool = False) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason, self.message, self.delay_s = reason, message, delay_s
        self.switch = switch
        """The replica failed (unreachable, gone, leaving): retry on the next one, if there is one."""
