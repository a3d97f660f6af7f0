"""How many statements the query API runs at once: in all, and per client. A statement past
either cap is answered 429 with Retry-After at once, not queued: a queue would hold the client's
connection and a server thread, and a dashboard retries anyway. Both ``POST /v1/query`` and
``/v1/query/plan`` take a slot: planning runs Spark too."""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from collections.abc import Iterator

from restcatalog.errors import IcebergError

RETRY_AFTER_S = 1


def busy(message: str) -> IcebergError:
    return IcebergError(429, "TooManyRequestsException", message, {"Retry-After": str(RETRY_AFTER_S)})


class QuerySlots:
    def __init__(self, total: int, per_client: int) -> None:
        self.total, self.per_client = total, per_client
        self._running: Counter[str | None] = Counter()
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def slot(self, client_id: str | None) -> Iterator[None]:
        """A slot for one statement of ``client_id`` (None: clients are not told apart, as
        without a tokens file), or 429."""
        with self._lock:
            if self._running.total() >= self.total:
                raise busy(f"{self.total} queries are running on this server (CDCLAKE_QUERY_MAX_CONCURRENT): try again")
            if client_id is not None and self._running[client_id] >= self.per_client:
                raise busy(
                    f"client {client_id!r} has {self.per_client} queries running "
                    "(CDCLAKE_QUERY_MAX_CONCURRENT_PER_CLIENT): try again when one ends"
                )
            self._running[client_id] += 1
        try:
            yield
        finally:
            with self._lock:
                self._running[client_id] -= 1
                if not self._running[client_id]:
                    del self._running[client_id]
