"""What the producer needs of a transport (:mod:`cdclake.client.http_transport`,
:mod:`cdclake.client.ws_transport`): raise :class:`~cdclake.client.errors.Retry` for what may pass."""

from __future__ import annotations

from typing import Any, Protocol

from cdclake.client.batch import Batch
from cdclake.client.errors import Ack


class Transport(Protocol):
    def use(self, url: str) -> None: ...
    def resume(self, last_ack: int | None) -> int | None: ...
    def send(self, batch: Batch, last_ack: int | None) -> Ack: ...
    def request_flush(self, last_ack: int | None) -> dict[str, Any]: ...
    def close(self) -> None: ...
