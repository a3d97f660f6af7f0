"""A numbered batch of events, as it goes on the wire (over HTTP and WebSocket alike)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class Batch:
    """A retry resends it whole under the same ``sequence_number``; only ``retry_count`` grows."""

    sequence_number: int
    events: list[dict[str, Any]]
    retry_count: int = 0
    transaction: str | None = None
    """The whole batch is this one source transaction (the wire's ``transaction`` shorthand)."""

    def fields(self) -> dict[str, Any]:
        whole = {} if self.transaction is None else {"transaction": self.transaction}
        return whole | {
            "sequenceNumber": self.sequence_number,
            "firstEventSequence": self.events[0]["sequence"],
            "lastEventSequence": self.events[-1]["sequence"],
            "events": self.events,
            "isRetry": self.retry_count > 0,
            "retryCount": self.retry_count,
        }
