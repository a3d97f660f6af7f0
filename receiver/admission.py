"""Who may send what, now: the per-source state of the receiver (active sources, token buckets,
new-table quotas, connections and requests in flight) and the checks a batch passes before it
lands. Each check returns its :class:`Rejected` rather than raising, so the caller answers it.
"""

from __future__ import annotations

from collections.abc import Callable

from cdclake.config.settings import Settings
from cdclake.contracts import events
from receiver import auth
from receiver.backlog import Backlog
from receiver.fanout import NewTables
from receiver.ratelimit import Decision, RateLimiter
from receiver.rejected import Rejected
from receiver.sources import IDLE_S, Sources


class Admission:
    def __init__(
        self,
        settings: Settings,
        backlog: Backlog,
        tokens: auth.Tokens | None,
        forget_also: Callable[[str], None],
    ) -> None:
        """``forget_also``: what else to drop of a source once it goes idle (the lander's cache)."""
        self.settings = settings
        self.backlog = backlog
        self.tokens = tokens
        self.limiter = RateLimiter(settings.rate_limit_burst, settings.rate_limit_per_s)
        self.new_tables = NewTables(settings, backlog)
        self.shutting_down = False
        self._forget_also = forget_also
        # Per-source state lives only while its source is known to self.sources (bounded).
        self._per_source: dict[str, int] = {}
        self.ws_connections: dict[str, int] = {}
        self.sources = Sources(settings.max_sources, self._busy, self._forget, max(IDLE_S, self.limiter.refill_s))

    # ------------------------------------------------------------------ per-source state

    def _busy(self, source: str) -> bool:
        return self._per_source.get(source, 0) > 0 or self.ws_connections.get(source, 0) > 0

    def _forget(self, source: str) -> None:
        self.limiter.forget(source)
        self.new_tables.forget(source)
        self._per_source.pop(source, None)
        self.ws_connections.pop(source, None)
        self._forget_also(source)

    def admit(self, source: str, authenticated: bool) -> Rejected | None:
        """Note ``source`` as active; without tokens, a new one past CDCLAKE_MAX_SOURCES waits."""
        wait = self.sources.touch(source, enforce=not authenticated)
        if not wait:
            return None
        return Rejected(
            429,
            "rate_limited",
            f"{len(self.sources)} producers sent within the last hour, the limit without tokens "
            f"(CDCLAKE_MAX_SOURCES={self.settings.max_sources}): a new source id waits until one goes idle",
            "$.source",
            {"retryDelayMs": int(wait * 1000)},
        )

    def ws_opened(self, source: str) -> Rejected | None:
        n = self.ws_connections.get(source, 0)
        if n >= self.settings.max_connections_per_source:
            return Rejected(
                429,
                "connection_limit",
                f"{source!r} already has {self.settings.max_connections_per_source} "
                "connections (CDCLAKE_MAX_CONNECTIONS_PER_SOURCE)",
                None,
                {"retryDelayMs": 1000},
            )
        self.ws_connections[source] = n + 1
        return None

    def ws_closed(self, source: str) -> None:
        n = self.ws_connections.get(source, 0) - 1
        if n > 0:
            self.ws_connections[source] = n
        else:
            self.ws_connections.pop(source, None)

    def request_started(self, source: str) -> None:
        self._per_source[source] = self._per_source.get(source, 0) + 1

    def request_ended(self, source: str) -> None:
        self._per_source[source] -= 1
        if not self._per_source[source]:
            del self._per_source[source]

    # ------------------------------------------------------------------ checks

    def authenticate(self, authorization: str | None) -> auth.Producer | Rejected | None:
        """The producer, None when auth is off, or a 401 refusal."""
        if self.tokens is None:
            return None
        producer = self.tokens.producer(authorization)
        if producer is None:
            why = "missing bearer token" if not authorization else "unknown bearer token"
            return Rejected(401, "invalid_format", f"{why} (Authorization: Bearer <token>)", "Authorization")
        return producer

    def rate(self, key: str) -> tuple[Decision, Rejected | None]:
        d = self.limiter.take(key)
        if d.allowed:
            return d, None
        ms = int(d.retry_after_s * 1000) + 1
        return d, Rejected(
            429,
            "rate_limited",
            f"producer {key!r} is over {self.settings.rate_limit_per_s:g} batches/s "
            f"(burst {self.settings.rate_limit_burst}; CDCLAKE_RATE_LIMIT_PER_S)",
            None,
            {"retryDelayMs": ms},
        )

    def gate(self, source: str | None = None) -> Rejected | None:
        """Stopping, or the backlog (all of it, or ``source``'s share) at its limit."""
        if self.shutting_down:
            return Rejected(503, "shutting_down", "receiver is shutting down", None, {"retryDelayMs": 1000})
        return self.backlog.refusal(source)

    def before_decoding(self, producer: auth.Producer | None) -> tuple[Decision | None, Rejected | None]:
        """What is checked before the body is decoded: the gate, and an authenticated producer's
        token bucket (the decision to answer with)."""
        gate = self.gate(producer.id if producer is not None else None)
        if gate is not None or producer is None:
            return None, gate
        self.admit(producer.id, authenticated=True)
        return self.rate(producer.id)

    def authorise(self, producer: auth.Producer | None, batch: events.Batch) -> Rejected | None:
        if producer is None:
            return None
        if batch.source != producer.id:
            return Rejected(
                403, "invalid_format", f"this token sends as {producer.id!r}, not {batch.source!r}", "$.source"
            )
        for i, ev in enumerate(batch.events):
            if not producer.may_write(ev.table):
                return Rejected(
                    403,
                    "invalid_format",
                    f"producer {producer.id!r} may not write table {ev.table!r}",
                    f"$.events[{i}].table",
                )
        for i, m in enumerate(batch.transactions or []):
            # An END counts events of tables: naming one the token may not write is refused alike.
            for table in m.tables or {}:
                if not producer.may_write(table):
                    return Rejected(
                        403,
                        "invalid_format",
                        f"producer {producer.id!r} may not write table {table!r}",
                        f"$.transactions[{i}].tables.{table}",
                    )
        return None

    def checks(
        self,
        producer: auth.Producer | None,
        batch: events.Batch,
        tables: dict[str, int] | Rejected,
        decision: Decision | None,
    ) -> tuple[Rejected | None, Decision | None]:
        """What is checked once the batch is decoded; the token bucket's decision to answer with."""
        denied = self.authorise(producer, batch)
        if denied is None and isinstance(tables, Rejected):
            denied = tables
        if denied is None and producer is None:  # the source is known only now
            denied = self.admit(batch.source, authenticated=False)
            if denied is None:
                decision, denied = self.rate(batch.source)
            denied = denied or self.gate(batch.source)
        n = self._per_source.get(batch.source, 0)
        if denied is None and n >= self.settings.max_connections_per_source:
            denied = Rejected(
                429,
                "connection_limit",
                f"{n} requests of {batch.source!r} are in flight, the limit "
                f"(CDCLAKE_MAX_CONNECTIONS_PER_SOURCE={self.settings.max_connections_per_source})",
                None,
                {"retryDelayMs": 100},
            )
        return denied, decision
