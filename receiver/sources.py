"""Which producers the receiver keeps per-source state for: at most CDCLAKE_MAX_SOURCES at once,
each forgotten after an idle hour.

Per-source state (token buckets, new-table budgets, requests in flight, WebSocket connections,
the landing's cached batch number) is made when a source first shows up and dropped here when it
goes idle, so it is bounded however many source ids clients invent. Forgetting loses nothing: an
idle source's buckets are full again and its batch number is re-read from its receipts.

With tokens, the sources are the tokens file's producers (a token sends as one id). Without
tokens a source id is whatever the client says, so rotating ids would multiply every
per-producer limit: a new source is refused (429) while MAX_SOURCES others were active within the
idle window. Per client address would not do: a receiver without tokens listens on loopback only,
where every client has the same address, so that would be one bucket shared by all local
producers. The lake-wide limits (CDCLAKE_BACKLOG_HARD, CDCLAKE_MAX_TABLES) hold whatever the ids.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

IDLE_S = 3600.0
"""A source not seen for this long is forgotten (and frees its place). An hour: the window of
CDCLAKE_MAX_NEW_TABLES_PER_SOURCE, so forgetting a source never refills its budget early."""


class Sources:
    def __init__(
        self,
        cap: int,
        busy: Callable[[str], bool],
        forget: Callable[[str], None],
        idle_s: float = IDLE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cap = cap
        self.busy = busy
        self.forget = forget
        self.idle_s = idle_s
        self.clock = clock
        self._seen: OrderedDict[str, float] = OrderedDict()
        """Source -> when last seen, least recent first."""

    def __len__(self) -> int:
        return len(self._seen)

    def __contains__(self, source: object) -> bool:
        return source in self._seen

    def touch(self, source: str, enforce: bool) -> float:
        """Note that ``source`` is active. 0.0 when it may go on; with ``enforce`` and no room
        for a new source, the seconds until the least recent one goes idle."""
        now = self.clock()
        self.sweep(now)
        if source in self._seen:
            self._seen.move_to_end(source)
            self._seen[source] = now
            return 0.0
        if enforce and len(self._seen) >= self.cap:
            oldest = next(iter(self._seen.values()))
            return max(1.0, oldest + self.idle_s - now)
        self._seen[source] = now
        return 0.0

    def sweep(self, now: float | None = None) -> list[str]:
        """Forget the sources idle past the window; returns them."""
        now = self.clock() if now is None else now
        gone = []
        while self._seen:
            source, at = next(iter(self._seen.items()))
            if now - at < self.idle_s:
                break
            if self.busy(source):  # a connection open or a landing in flight: still active
                self._seen.move_to_end(source)
                self._seen[source] = now
                continue
            del self._seen[source]
            self.forget(source)
            gone.append(source)
        return gone
