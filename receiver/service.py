"""What both transports do with a batch: authorise, limit, land, count, answer.

:meth:`Service.submit` returns an :class:`Answer` (HTTP status, ack or nack body, headers), so
HTTP and WebSocket cannot drift apart in what they accept or how they refuse it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import anyio
import anyio.to_thread

from cdclake.config.settings import Settings
from cdclake.contracts import events
from cdclake.contracts.protocol import RETRYABLE_REASONS
from cdclake.service.metrics import Metrics
from cdclake.staging.clock import StoreClockError
from receiver import auth, decode, landing
from receiver.backlog import Backlog
from receiver.fanout import NewTables, batch_tables
from receiver.protocol import ack, nack
from receiver.ratelimit import Decision, RateLimiter
from receiver.rejected import Rejected
from receiver.sources import IDLE_S, Sources

log = logging.getLogger("cdclake.receiver")
LANDING_SLOTS = 4


@dataclass
class Answer:
    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)
    landed_tables: list[str] = field(default_factory=list)


def shown_paths(paths: list[str], settings: Settings) -> list[str]:
    """Where an ack says the events are, without the receiver's own folders: a producer needs the
    object's key (``staging/<table>/<day>/<hour>/<name>``, ``spool/...``), not the host's layout.
    Object-store URIs (``s3://bucket/...``) say nothing about the host and are kept."""
    out = []
    for p in paths:
        local = Path(unquote(urlsplit(p).path)) if p.startswith("file:") else Path(p) if p.startswith("/") else None
        if local is None:
            out.append(p)
            continue
        for label, root in (("staging", settings.staging_dir), ("spool", settings.spool_dir)):
            if local.is_relative_to(root):
                out.append(f"{label}/{local.relative_to(root).as_posix()}")
                break
        else:
            out.append(local.name)
    return out


def refusal(
    exc: Rejected, seq: int | None = None, cid: str | None = None, headers: dict[str, str] | None = None
) -> Answer:
    body = nack(
        exc.reason,
        str(exc),
        sequence_number=seq,
        should_retry=exc.reason in RETRYABLE_REASONS,
        correlation_id=cid,
        field=exc.field,
        **exc.extra,
    )
    headers = dict(headers or {})
    if "retryDelayMs" in exc.extra:
        headers["Retry-After"] = str(max(1, -(-int(exc.extra["retryDelayMs"]) // 1000)))
    return Answer(exc.status, body, headers)


def describe_metrics(m: Metrics) -> None:
    m.describe(
        "cdclake_receiver_batches_total",
        "counter",
        "Batches answered, by transport and outcome.",
        ("transport", "outcome"),
    )
    m.describe("cdclake_receiver_events_total", "counter", "Events landed (persisted or fallback).")
    m.describe("cdclake_receiver_bytes_total", "counter", "Request bytes received, by transport.", ("transport",))
    m.describe("cdclake_receiver_acks_total", "counter", "Acks sent, by status.", ("status",))
    m.describe("cdclake_receiver_nacks_total", "counter", "Nacks sent, by reason.", ("reason",))
    m.describe(
        "cdclake_receiver_landing_seconds", "histogram", "Time from body read to durable landing.", ("transport",)
    )
    m.describe("cdclake_receiver_backlog_objects", "gauge", "Staging objects not yet applied, by table.", ("table",))
    m.describe("cdclake_receiver_spool_batches", "gauge", "Batches waiting in the fallback spool.")
    m.describe("cdclake_receiver_connections", "gauge", "Open WebSocket connections.")
    m.describe("cdclake_receiver_notify_total", "counter", "Airflow Asset events sent, by result.", ("result",))
    m.describe(
        "cdclake_table_valid_through_seconds", "gauge", "Newest applied event time per table (unix s).", ("table",)
    )
    m.describe(
        "cdclake_table_freshness_lag_seconds", "gauge", "Now minus valid-through: how stale a table is.", ("table",)
    )
    m.describe(
        "cdclake_table_last_commit_seconds", "gauge", "Time of the table's current snapshot (unix s).", ("table",)
    )
    m.describe("cdclake_table_data_files", "gauge", "Live data files per table.", ("table",))
    m.describe("cdclake_table_small_files", "gauge", "Data files under 75% of the target size.", ("table",))
    m.describe("cdclake_table_delete_files", "gauge", "Live delete files (merge-on-read) per table.", ("table",))
    m.describe("cdclake_table_snapshots", "gauge", "Snapshots in the table's metadata.", ("table",))
    m.describe("cdclake_table_rows", "gauge", "Rows in live data files (before deletes).", ("table",))


class Service:
    def __init__(
        self,
        settings: Settings,
        lander: landing.Lander,
        backlog: Backlog,
        metrics: Metrics,
        tokens: auth.Tokens | None,
        on_landed: Callable[[list[str]], None],
    ) -> None:
        self.settings = settings
        self.lander = lander
        self.backlog = backlog
        self.metrics = metrics
        self.tokens = tokens
        self.limiter = RateLimiter(settings.rate_limit_burst, settings.rate_limit_per_s)
        self.new_tables = NewTables(settings, backlog)
        self.on_landed = on_landed
        self.shutting_down = False
        self.in_flight = 0
        # What the receiver holds that is not durable yet: the seed's status `buffer` (it keeps
        # no other buffer: a batch is in memory only until it has landed).
        self.in_flight_bytes = 0
        self.in_flight_events = 0
        self.idle = threading.Event()
        self.idle.set()
        # Per-source state lives only while its source is known to self.sources (bounded).
        self._per_source: dict[str, int] = {}
        self.ws_connections: dict[str, int] = {}
        self.sources = Sources(settings.max_sources, self._busy, self._forget, max(IDLE_S, self.limiter.refill_s))
        # Decoded batches are ~10x their body in memory: bound how many exist at once. More
        # landings in parallel would not be faster (one GIL), only bigger.
        self.landing_slots = anyio.CapacityLimiter(LANDING_SLOTS)

    # ------------------------------------------------------------------ per-source state

    def _busy(self, source: str) -> bool:
        return self._per_source.get(source, 0) > 0 or self.ws_connections.get(source, 0) > 0

    def _forget(self, source: str) -> None:
        self.limiter.forget(source)
        self.new_tables.forget(source)
        self._per_source.pop(source, None)
        self.ws_connections.pop(source, None)
        self.lander.forget(source)

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
        return None

    def _checks(
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

    # ------------------------------------------------------------------ submit

    async def submit(
        self,
        build: Callable[[], decode.Decoded],
        producer: auth.Producer | None,
        transport: str,
        size: int,
        correlation_id: str | None = None,
        sequence_number: int | None = None,
    ) -> Answer:
        """Decode (``build``), check and land one batch. Runs the blocking part in a worker thread.

        ``sequence_number``: the batch's number when the caller knows it before decoding (a
        WebSocket frame), so a refusal made before decoding still names the batch."""
        self.metrics.inc("cdclake_receiver_bytes_total", size, transport=transport)
        started = time.perf_counter()
        self.in_flight += 1
        self.in_flight_bytes += size
        self.idle.clear()
        try:
            answer = await self._submit(build, producer, transport, correlation_id, sequence_number, started)
        finally:
            self.in_flight_bytes -= size
            self.in_flight -= 1
            if self.in_flight == 0:
                self.idle.set()
        body = answer.body
        if body["type"] == "ack":
            self.metrics.inc("cdclake_receiver_acks_total", status=body["status"])
        else:
            self.metrics.inc("cdclake_receiver_nacks_total", reason=body["reason"])
        self.metrics.inc(
            "cdclake_receiver_batches_total",
            transport=transport,
            outcome=body["status"] if body["type"] == "ack" else body["reason"],
        )
        return answer

    async def _submit(
        self,
        build: Callable[[], decode.Decoded],
        producer: auth.Producer | None,
        transport: str,
        cid: str | None,
        seq_hint: int | None,
        started: float,
    ) -> Answer:
        decision: Decision | None = None
        gate = self.gate(producer.id if producer is not None else None)
        if gate is not None:
            return refusal(gate, seq_hint, cid)
        if producer is not None:
            self.admit(producer.id, authenticated=True)
            decision, limited = self.rate(producer.id)
            if limited is not None:
                return refusal(limited, seq_hint, cid, decision.headers())
        try:
            decoded, tables = await anyio.to_thread.run_sync(self._decode, build)
        except Rejected as exc:
            return refusal(exc, seq_hint, cid)
        batch = decoded.batch
        if batch is None:
            body = ack(0, "ok", cid, rate_limit=decision, eventsProcessed=0)
            return Answer(200, body, decision.headers() if decision else {})
        seq, source, n_events = batch.sequenceNumber, batch.source, len(batch.events)
        denied, decision = self._checks(producer, batch, tables, decision)
        headers = decision.headers() if decision is not None else {}
        new: list[str] = []
        if denied is None and not isinstance(tables, Rejected):
            new, denied = self.new_tables.claim(source, tables)
        if denied is not None:
            return refusal(denied, seq, cid, headers)
        self._per_source[source] = self._per_source.get(source, 0) + 1
        self.in_flight_events += n_events
        box = [decoded]
        # The worker thread drops the last reference: a big batch is freed off the event loop.
        del decoded, batch
        try:
            async with self.landing_slots:
                landed, staged = await anyio.to_thread.run_sync(self._land_box, box)
        except Exception as exc:
            self.new_tables.give_back(source, new)
            return self._not_landed(exc, source, seq, cid, headers)
        finally:
            self.in_flight_events -= n_events
            self._per_source[source] -= 1
            if not self._per_source[source]:
                del self._per_source[source]
        elapsed = time.perf_counter() - started
        self.metrics.observe("cdclake_receiver_landing_seconds", elapsed, transport=transport)
        if landed.status == "duplicate":
            self.new_tables.give_back(source, new)
        else:
            self.metrics.inc("cdclake_receiver_events_total", n_events)
            self.backlog.add(staged, source)
            self.on_landed(staged)
        log.info(
            "batch landed",
            extra={
                "source": source,
                "sequenceNumber": seq,
                "status": landed.status,
                "events": n_events,
                "tables": staged,
                "ms": round(elapsed * 1000, 2),
                "transport": transport,
            },
        )
        paths = shown_paths(landed.paths, self.settings)
        body = ack(
            seq,
            landed.status,
            cid,
            rate_limit=decision,
            eventsProcessed=n_events,
            bufferUtilization=round(self.backlog.utilization, 4),
            suggestedDelayMs=self.backlog.suggested_delay_ms() or None,
            # The seed's persistedPath is one path; a batch of several tables lands one object
            # per table, so all of them are in persistedPaths (sorted; the first is persistedPath).
            persistedPath=min(paths, default=None),
            persistedPaths=sorted(paths),
            circuitBreakerState=self.lander.breaker,
        )
        return Answer(200, body, headers, staged)

    def _not_landed(self, exc: Exception, source: str, seq: int, cid: str | None, headers: dict[str, str]) -> Answer:
        if isinstance(exc, landing.SequenceError):
            body = nack(
                "invalid_sequence",
                str(exc),
                sequence_number=seq,
                correlation_id=cid,
                field="$.sequenceNumber",
                expectedSequence=exc.expected,
            )
            return Answer(409, body, headers)
        if isinstance(exc, landing.InFlight):
            message = str(exc)
        else:
            log.error("landing batch %s of %r failed", seq, source, exc_info=exc)
            # The exception's text can name the host's folders or the store's endpoint: it goes
            # to the log, the producer learns only its kind (and, for the clock, what is wrong).
            clock = isinstance(exc, StoreClockError)
            what = "cannot read the staging store's clock" if clock else "could not land the batch"
            message = f"{what} ({type(exc).__name__}; the receiver's log has the detail)"
        body = nack(
            "internal_error", message, sequence_number=seq, should_retry=True, correlation_id=cid, retryDelayMs=1000
        )
        return Answer(503, body, headers | {"Retry-After": "1"})

    def _decode(self, build: Callable[[], decode.Decoded]) -> tuple[decode.Decoded, dict[str, int] | Rejected]:
        """Decode, and the batch's distinct tables (or why there are too many)."""
        decoded = build()
        if decoded.batch is None:
            return decoded, {}
        self.backlog.ensure_known()
        try:
            return decoded, batch_tables(decoded.batch, self.settings.max_tables_per_batch)
        except Rejected as exc:
            return decoded, exc

    def _land_box(self, box: list[decode.Decoded]) -> tuple[landing.Landed, list[str]]:
        decoded = box.pop()
        assert decoded.batch is not None
        p = landing.Prepared.from_batch(decoded.batch, by_identity=decoded.debezium)
        return self.lander.land(p, check_sequence=not decoded.debezium), sorted(p.objects)
