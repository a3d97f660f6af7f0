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
from typing import Any

import anyio
import anyio.to_thread

from cdclake import events
from cdclake.settings import Settings
from receiver import auth, decode, landing
from receiver.backlog import Backlog
from receiver.metrics import Metrics
from receiver.protocol import ack, nack
from receiver.ratelimit import RateLimiter

log = logging.getLogger("cdclake.receiver")
LANDING_SLOTS = 4


@dataclass
class Answer:
    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)
    landed_tables: list[str] = field(default_factory=list)


def refusal(exc: decode.Rejected, seq: int | None = None, cid: str | None = None) -> Answer:
    retry = exc.reason in ("rate_limited", "buffer_full", "shutting_down", "load_shedding", "internal_error")
    body = nack(
        exc.reason,
        str(exc),
        sequence_number=seq,
        should_retry=retry or exc.reason == "connection_limit",
        correlation_id=cid,
        field=exc.field,
        **exc.extra,
    )
    headers = {}
    if "retryDelayMs" in exc.extra:
        headers["Retry-After"] = str(max(1, -(-int(exc.extra["retryDelayMs"]) // 1000)))
    return Answer(exc.status, body, headers)


def describe_metrics(m: Metrics) -> None:
    m.describe("cdclake_receiver_batches_total", "counter", "Batches answered, by transport and outcome.")
    m.describe("cdclake_receiver_events_total", "counter", "Events landed (persisted or fallback).")
    m.describe("cdclake_receiver_bytes_total", "counter", "Request bytes received, by transport.")
    m.describe("cdclake_receiver_acks_total", "counter", "Acks sent, by status.")
    m.describe("cdclake_receiver_nacks_total", "counter", "Nacks sent, by reason.")
    m.describe("cdclake_receiver_landing_seconds", "histogram", "Time from body read to durable landing.")
    m.describe("cdclake_receiver_backlog_objects", "gauge", "Staging objects not yet applied, by table.")
    m.describe("cdclake_receiver_spool_batches", "gauge", "Batches waiting in the fallback spool.")
    m.describe("cdclake_receiver_connections", "gauge", "Open WebSocket connections.")
    m.describe("cdclake_receiver_notify_total", "counter", "Airflow Asset events sent, by result.")
    m.describe("cdclake_table_valid_through_seconds", "gauge", "Newest applied event time per table (unix s).")
    m.describe("cdclake_table_freshness_lag_seconds", "gauge", "Now minus valid-through: how stale a table is.")
    m.describe("cdclake_table_last_commit_seconds", "gauge", "Time of the table's current snapshot (unix s).")
    m.describe("cdclake_table_data_files", "gauge", "Live data files per table.")
    m.describe("cdclake_table_small_files", "gauge", "Data files under 75% of the target size.")
    m.describe("cdclake_table_delete_files", "gauge", "Live delete files (merge-on-read) per table.")
    m.describe("cdclake_table_snapshots", "gauge", "Snapshots in the table's metadata.")
    m.describe("cdclake_table_rows", "gauge", "Rows in live data files (before deletes).")


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
        self.on_landed = on_landed
        self.shutting_down = False
        self.in_flight = 0
        self.idle = threading.Event()
        self.idle.set()
        self._per_source: dict[str, int] = {}
        self.ws_connections: dict[str, int] = {}
        # Decoded batches are ~10x their body in memory: bound how many exist at once. More
        # landings in parallel would not be faster (one GIL), only bigger.
        self.landing_slots = anyio.CapacityLimiter(LANDING_SLOTS)

    # ------------------------------------------------------------------ checks

    def authenticate(self, authorization: str | None) -> auth.Producer | decode.Rejected | None:
        """The producer, None when auth is off, or a 401 refusal."""
        if self.tokens is None:
            return None
        producer = self.tokens.producer(authorization)
        if producer is None:
            why = "missing bearer token" if not authorization else "unknown bearer token"
            return decode.Rejected(401, "invalid_format", f"{why} (Authorization: Bearer <token>)", "Authorization")
        return producer

    def rate(self, key: str) -> tuple[dict[str, str], decode.Rejected | None]:
        d = self.limiter.take(key)
        if d.allowed:
            return d.headers(), None
        ms = int(d.retry_after_s * 1000) + 1
        return d.headers(), decode.Rejected(
            429,
            "rate_limited",
            f"producer {key!r} is over {self.settings.rate_limit_per_s:g} batches/s "
            f"(burst {self.settings.rate_limit_burst}; CDCLAKE_RATE_LIMIT_PER_S)",
            None,
            {"retryDelayMs": ms},
        )

    def gate(self) -> decode.Rejected | None:
        if self.shutting_down:
            return decode.Rejected(503, "shutting_down", "receiver is shutting down", None, {"retryDelayMs": 1000})
        if self.backlog.total >= self.settings.backlog_hard:
            return decode.Rejected(
                503,
                "buffer_full",
                f"{self.backlog.total} staging objects wait to be applied, at the limit "
                f"{self.settings.backlog_hard} (CDCLAKE_BACKLOG_HARD)",
                None,
                {"retryDelayMs": 5000},
            )
        return None

    def authorise(self, producer: auth.Producer | None, batch: events.Batch) -> decode.Rejected | None:
        if producer is None:
            return None
        if batch.source != producer.id:
            return decode.Rejected(
                403, "invalid_format", f"this token sends as {producer.id!r}, not {batch.source!r}", "$.source"
            )
        for i, ev in enumerate(batch.events):
            if not producer.may_write(ev.table):
                return decode.Rejected(
                    403,
                    "invalid_format",
                    f"producer {producer.id!r} may not write table {ev.table!r}",
                    f"$.events[{i}].table",
                )
        return None

    # ------------------------------------------------------------------ submit

    async def submit(
        self,
        build: Callable[[], decode.Decoded],
        producer: auth.Producer | None,
        transport: str,
        size: int,
        correlation_id: str | None = None,
    ) -> Answer:
        """Decode (``build``), check and land one batch. Runs the blocking part in a worker thread."""
        self.metrics.inc("cdclake_receiver_bytes_total", size, transport=transport)
        started = time.perf_counter()
        self.in_flight += 1
        self.idle.clear()
        try:
            answer = await self._submit(build, producer, transport, correlation_id, started)
        finally:
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
        started: float,
    ) -> Answer:
        headers: dict[str, str] = {}
        gate = self.gate()
        if gate is not None:
            return refusal(gate, None, cid)
        if producer is not None:
            headers, limited = self.rate(producer.id)
            if limited is not None:
                a = refusal(limited, None, cid)
                a.headers.update(headers)
                return a
        try:
            decoded = await anyio.to_thread.run_sync(build)
        except decode.Rejected as exc:
            return refusal(exc, None, cid)
        batch = decoded.batch
        if batch is None:
            return Answer(200, ack(0, "ok", cid, eventsProcessed=0), headers)
        seq = batch.sequenceNumber
        denied = self.authorise(producer, batch)
        if denied is not None:
            return refusal(denied, seq, cid)
        if producer is None:
            headers, limited = self.rate(batch.source)
            if limited is not None:
                a = refusal(limited, seq, cid)
                a.headers.update(headers)
                return a
        n = self._per_source.get(batch.source, 0)
        if n >= self.settings.max_connections_per_source:
            return refusal(
                decode.Rejected(
                    429,
                    "connection_limit",
                    f"{n} requests of {batch.source!r} are in flight, the limit "
                    f"(CDCLAKE_MAX_CONNECTIONS_PER_SOURCE={self.settings.max_connections_per_source})",
                    None,
                    {"retryDelayMs": 100},
                ),
                seq,
                cid,
            )
        self._per_source[batch.source] = n + 1
        source, n_events = batch.source, len(batch.events)
        box = [decoded]
        # The worker thread drops the last reference: a big batch is freed off the event loop.
        del decoded, batch
        try:
            async with self.landing_slots:
                landed, tables = await anyio.to_thread.run_sync(self._land_box, box)
        except landing.SequenceError as exc:
            body = nack(
                "invalid_sequence",
                str(exc),
                sequence_number=seq,
                correlation_id=cid,
                field="$.sequenceNumber",
                expectedSequence=exc.expected,
            )
            return Answer(409, body, headers)
        except landing.InFlight as exc:
            body = nack(
                "internal_error",
                str(exc),
                sequence_number=seq,
                should_retry=True,
                correlation_id=cid,
                retryDelayMs=1000,
            )
            return Answer(503, body, headers | {"Retry-After": "1"})
        except Exception as exc:
            log.exception("landing batch %s of %r failed", seq, source)
            body = nack(
                "internal_error",
                f"could not land the batch: {type(exc).__name__}: {exc}",
                sequence_number=seq,
                should_retry=True,
                correlation_id=cid,
                retryDelayMs=1000,
            )
            return Answer(503, body, headers | {"Retry-After": "1"})
        finally:
            self._per_source[source] -= 1
        elapsed = time.perf_counter() - started
        self.metrics.observe("cdclake_receiver_landing_seconds", elapsed, transport=transport)
        if landed.status != "duplicate":
            self.metrics.inc("cdclake_receiver_events_total", n_events)
            self.backlog.add(tables)
            self.on_landed(tables)
        log.info(
            "batch landed",
            extra={
                "source": source,
                "sequenceNumber": seq,
                "status": landed.status,
                "events": n_events,
                "tables": tables,
                "ms": round(elapsed * 1000, 2),
                "transport": transport,
            },
        )
        body = ack(
            seq,
            landed.status,
            cid,
            eventsProcessed=n_events,
            bufferUtilization=round(self.backlog.utilization, 4),
            suggestedDelayMs=self.backlog.suggested_delay_ms() or None,
            persistedPath=landed.paths,
            circuitBreakerState=self.lander.breaker,
        )
        return Answer(200, body, headers, tables)

    def _land_box(self, box: list[decode.Decoded]) -> tuple[landing.Landed, list[str]]:
        decoded = box.pop()
        assert decoded.batch is not None
        p = landing.Prepared.from_batch(decoded.batch)
        return self.lander.land(p, check_sequence=not decoded.debezium), sorted(p.objects)
