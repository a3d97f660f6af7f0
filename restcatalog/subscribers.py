"""How many ``/v1/subscribe`` streams are open, per client and in all.

Each stream reads the change history every 0.5 s in a worker thread for as long as it stays open,
so streams are the server's most lasting cost: past ``CDCLAKE_MAX_SUBSCRIPTIONS_PER_CLIENT`` for
one client (the tokens file's client id; ``anyone`` without a tokens file, every local process
alike) or ``CDCLAKE_MAX_SUBSCRIPTIONS`` for the server process, a new one is refused with 429 and
``Retry-After`` until one closes. A slot is taken before the answer starts and given back when the
response ends, however it ends (:class:`HeldStream`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from cdclake.config.settings import Settings
from restcatalog.errors import IcebergError

RETRY_AFTER_S = 5


class TooManySubscriptions(IcebergError):
    def __init__(self, message: str) -> None:
        super().__init__(429, "TooManyRequestsException", message)


class Subscribers:
    def __init__(self, settings: Settings) -> None:
        self.per_client = settings.max_subscriptions_per_client
        self.total = settings.max_subscriptions
        self.open: Counter[str] = Counter()

    def take(self, client_id: str) -> Callable[[], None]:
        """A slot for ``client_id``'s new stream and the call that gives it back (once); or
        :class:`TooManySubscriptions` naming the limit."""
        if self.open[client_id] >= self.per_client:
            raise TooManySubscriptions(
                f"client {client_id!r} has {self.open[client_id]} subscriptions open, the limit "
                f"(CDCLAKE_MAX_SUBSCRIPTIONS_PER_CLIENT={self.per_client}): close one, or subscribe to "
                "several tables in one stream (tables=a,b)"
            )
        if sum(self.open.values()) >= self.total:
            raise TooManySubscriptions(
                f"{sum(self.open.values())} subscriptions are open, the server's limit "
                f"(CDCLAKE_MAX_SUBSCRIPTIONS={self.total})"
            )
        self.open[client_id] += 1
        given_back = False

        def give_back() -> None:
            nonlocal given_back
            if not given_back:
                given_back = True
                self.open[client_id] -= 1
                if not self.open[client_id]:
                    del self.open[client_id]

        return give_back


class HeldStream(StreamingResponse):
    """A streaming response that gives its subscription slot back when it ends: streamed to the
    end, the client gone, or the stream never started."""

    def __init__(self, release: Callable[[], None], *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.release = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.release()
