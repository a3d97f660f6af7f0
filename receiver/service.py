"""What both transports do with a batch: authorise, limit, land, count, answer.

:meth:`Service.submit` returns an :class:`~receiver.answer.Answer` (HTTP status, ack or nack
body, headers), so HTTP and WebSocket cannot drift apart in what they accept or how they refuse
it. What a batch must pass is :class:`~receiver.admission.Admission`'s; the landing is
:mod:`receiver.landing`'s.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import anyio
import anyio.to_thread

from cdclake import staging
from cdclake.config.settings import Settings
from cdclake.contracts import events
from cdclake.contracts.protocol import Ack, AckDetails
from cdclake.service.metrics import Metrics
from receiver import auth, decode
from receiver.admission import Admission
from receiver.answer import Answer, not_landed, refusal, shown_paths
from receiver.backlog import Backlog
from receiver.fanout import batch_tables
from receiver.landing import Lander
from receiver.prepared import Landed, Prepared
from receiver.protocol import ack
from receiver.ratelimit import Decision
from receiver.rejected import Rejected

log = logging.getLogger("cdclake.receiver")
LANDING_SLOTS = 4


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
        "cdclake_table_freshness_lag_seconds", "gauge", "Freshness by event time: now minus valid-through.", ("table",)
    )
    m.describe(
        "cdclake_table_last_commit_seconds", "gauge", "Time of the table's current snapshot (unix s).", ("table",)
    )
    m.describe("cdclake_table_data_files", "gauge", "Live data files per table.", ("table",))
    m.describe("cdclake_table_small_files", "gauge", "Data files under 75% of the target size.", ("table",))
    m.describe("cdclake_table_delete_files", "gauge", "Live delete files (merge-on-read) per table.", ("table",))
    m.describe("cdclake_table_snapshots", "gauge", "Snapshots in the table's metadata.", ("table",))
    m.describe("cdclake_table_rows", "gauge", "Rows in live data files (before deletes).", ("table",))


@dataclass(frozen=True)
class Admitted:
    """A decoded batch that passed every check, by what its answer needs (not its events)."""

    source: str
    seq: int
    events: int
    cid: str | None
    decision: Decision | None
    headers: dict[str, str]
    """The token bucket's headers, as of the checks."""
    new_tables: list[str]


class Service(Admission):
    def __init__(
        self,
        settings: Settings,
        lander: Lander,
        backlog: Backlog,
        metrics: Metrics,
        tokens: auth.Tokens | None,
        on_landed: Callable[[list[str]], None],
    ) -> None:
        super().__init__(settings, backlog, tokens, lander.forget)
        self.lander = lander
        self.metrics = metrics
        self.on_landed = on_landed
        self.in_flight = 0
        # What the receiver holds that is not durable yet: the protocol's status `buffer` (it keeps
        # no other buffer: a batch is in memory only until it has landed).
        self.in_flight_bytes = 0
        self.in_flight_events = 0
        self.idle = threading.Event()
        self.idle.set()
        # Decoded batches are many times their body in memory: bound how many exist at once. More
        # landings in parallel would not be faster (one GIL), only bigger.
        self.landing_slots = anyio.CapacityLimiter(LANDING_SLOTS)

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
        self._count(answer, transport)
        return answer

    def _count(self, answer: Answer, transport: str) -> None:
        body = answer.body
        if isinstance(body, Ack):
            self.metrics.inc("cdclake_receiver_acks_total", status=body.status)
        else:
            self.metrics.inc("cdclake_receiver_nacks_total", reason=body.reason)
        outcome = body.status if isinstance(body, Ack) else body.reason
        self.metrics.inc("cdclake_receiver_batches_total", transport=transport, outcome=outcome)

    async def _submit(
        self,
        build: Callable[[], decode.Decoded],
        producer: auth.Producer | None,
        transport: str,
        cid: str | None,
        seq_hint: int | None,
        started: float,
    ) -> Answer:
        decision, early = self.before_decoding(producer)
        if early is not None:
            return refusal(early, seq_hint, cid, decision.headers() if decision is not None else {})
        try:
            decoded, tables = await anyio.to_thread.run_sync(self._decode, build)
        except Rejected as exc:
            return refusal(exc, seq_hint, cid)
        batch = decoded.batch
        if batch is None:
            body = ack(0, "ok", AckDetails(eventsProcessed=0), cid, rate_limit=decision)
            return Answer(200, body, decision.headers() if decision else {})
        denied, decision = self.checks(producer, batch, tables, decision)
        new: list[str] = []
        if denied is None and not isinstance(tables, Rejected):
            new, denied = self.new_tables.claim(batch.source, tables)
        headers = decision.headers() if decision is not None else {}
        admitted = Admitted(batch.source, batch.sequenceNumber, len(batch.events), cid, decision, headers, new)
        if denied is not None:
            return refusal(denied, admitted.seq, cid, admitted.headers)
        box = [decoded]
        # The worker thread drops the last reference: a big batch is freed off the event loop.
        del decoded, batch
        return await self._land(box, admitted, transport, started)

    def _decode(self, build: Callable[[], decode.Decoded]) -> tuple[decode.Decoded, dict[str, int] | Rejected]:
        """Decode, and the batch's distinct tables (or why there are too many)."""
        decoded = build()
        if decoded.batch is None:
            return decoded, {}
        self.backlog.slots.ensure()
        try:
            return decoded, batch_tables(decoded.batch, self.settings.max_tables_per_batch)
        except Rejected as exc:
            return decoded, exc

    async def _land(self, box: list[decode.Decoded], a: Admitted, transport: str, started: float) -> Answer:
        """Land the batch in ``box`` (emptied by the worker) within a landing slot, and answer."""
        self.request_started(a.source)
        self.in_flight_events += a.events
        try:
            async with self.landing_slots:
                landed, staged = await anyio.to_thread.run_sync(self._land_box, box)
        except events.InvalidBatch as exc:  # found while staging it (a number Spark cannot read)
            self.new_tables.give_back(a.source, a.new_tables)
            return refusal(decode.invalid(exc), a.seq, a.cid, a.headers)
        except Exception as exc:
            self.new_tables.give_back(a.source, a.new_tables)
            return not_landed(exc, a.source, a.seq, a.cid, a.headers)
        except BaseException:  # cancelled (the connection went): the slots must not stay held
            self.new_tables.give_back(a.source, a.new_tables)
            raise
        finally:
            self.in_flight_events -= a.events
            self.request_ended(a.source)
        elapsed = time.perf_counter() - started
        self.metrics.observe("cdclake_receiver_landing_seconds", elapsed, transport=transport)
        if landed.status == "duplicate":
            self.new_tables.give_back(a.source, a.new_tables, existed=True)
        else:
            self.new_tables.landed(a.new_tables)
            self.metrics.inc("cdclake_receiver_events_total", a.events)
            self.backlog.add(staged, a.source)
            self.on_landed(staged)
        log.info(
            "batch landed",
            extra={
                "source": a.source,
                "sequenceNumber": a.seq,
                "status": landed.status,
                "events": a.events,
                "tables": staged,
                "ms": round(elapsed * 1000, 2),
                "transport": transport,
            },
        )
        return Answer(200, self._ack(landed, a), a.headers, staged)

    def _land_box(self, box: list[decode.Decoded]) -> tuple[Landed, list[str]]:
        decoded = box.pop()
        assert decoded.batch is not None
        p = Prepared.from_batch(decoded.batch, by_identity=decoded.debezium)
        return self.lander.land(p, check_sequence=not decoded.debezium), p.tables

    def _ack(self, landed: Landed, a: Admitted) -> Ack:
        paths = shown_paths(landed.paths, self.settings)
        tables = [x for x in paths if f"/{staging.TRANSACTIONS}/" not in x]
        details = AckDetails(
            eventsProcessed=a.events,
            bufferUtilization=round(self.backlog.utilization, 4),
            suggestedDelayMs=self.backlog.suggested_delay_ms() or None,
            # The protocol's persistedPath is one path; a batch of several tables lands one object
            # per table, so all of them are in persistedPaths (sorted; the first table's object is
            # persistedPath, the markers' object only when the batch has no events).
            persistedPath=min(tables or paths, default=None),
            persistedPaths=sorted(paths),
            circuitBreakerState=self.lander.breaker,
        )
        return ack(a.seq, landed.status, details, a.cid, rate_limit=a.decision)
