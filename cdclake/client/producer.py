"""The producer: buffers events, numbers them and their batches, and delivers each batch through
a transport (:mod:`~cdclake.client.http_transport`, :mod:`~cdclake.client.ws_transport`) under
the retry loop (:mod:`~cdclake.client.retry`) until it is acked."""

from __future__ import annotations

import contextlib
import logging
import random
import time
from collections.abc import Callable, Iterator, Sequence
from types import TracebackType
from typing import Any, Literal

import httpx

from cdclake.client.batch import Batch
from cdclake.client.errors import Ack, ProducerError
from cdclake.client.http_transport import HttpTransport
from cdclake.client.replicas import receiver_urls
from cdclake.client.replies import int_or_none
from cdclake.client.retry import Retrier
from cdclake.client.transport import Transport
from cdclake.client.ws_transport import WsConnect, WsTransport
from cdclake.contracts.events import MAX_EVENTS_PER_BATCH, MAX_TRANSACTION_ID_CHARS

# The SDK logs under one name, as it did when it was one module.
log = logging.getLogger("cdclake.client")


class Producer:
    """Sends CDC events of one ``source`` to the receiver; use as a context manager.

    ``send`` buffers and sends a batch every ``batch_size`` events; ``flush`` sends the rest.
    Batches are numbered consecutively from where the receiver says this source stands (or from
    ``start_sequence``). Events without ``sequence`` are numbered by the producer: from
    ``start_event_sequence`` if given, else from the wall clock in microseconds, so a restarted
    producer never numbers below what it sent before (the sequence orders changes of a row).

    ``url`` is one receiver URL, several comma-separated (``"http://a:8090,http://b:8090"``) or a
    sequence of them: replicas sharing one staging store. The producer sends to one (``url``) and
    moves to the next, round robin, when it fails: a connection that is refused, reset or times
    out, a 502/503/504 without the receiver's own answer (a proxy's), or a ``shutting_down`` nack.
    The batch is then resent to the next replica under the same ``sequenceNumber``: the receipts
    are in the shared store, so one the old replica landed is acked ``duplicate`` (WebSocket
    reconnects and resumes with ``connect`` first). Backpressure a replica answers itself
    (``buffer_full``, ``rate_limited``, ``load_shedding``, ``connection_limit``, ``internal_error``)
    is honoured there with its delay: it is about the shared store or this producer, not that
    replica. A switch is one of the ``max_attempts`` and waits the usual backoff (not the left
    replica's hint); ``failovers`` counts switches.

    Source transactions: ``send(..., transaction=id)`` tags one event; ``send_events(events,
    transaction=id)`` and ``with producer.transaction(id):`` send a whole transaction as ONE
    batch (the wire's ``transaction`` shorthand: the receiver stamps its events and lands its
    END). A transaction is never split over two batches: past ``MAX_EVENTS_PER_BATCH`` events
    it raises instead (``batch_size`` does not cut it).
    """

    def __init__(
        self,
        url: str | Sequence[str],
        source: str,
        *,
        token: str | None = None,
        transport: Literal["http", "ws"] = "http",
        batch_size: int = 1000,
        max_attempts: int = 10,
        base_delay_s: float = 0.1,
        max_delay_s: float = 30.0,
        start_sequence: int | None = None,
        compress: Literal[None, "gzip", "zstd"] = None,
        timeout_s: float = 30.0,
        on_ack: Callable[[Ack], None] | None = None,
        start_event_sequence: int | None = None,
        http_client: httpx.Client | None = None,
        ws_connect: WsConnect | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        if batch_size < 1 or max_attempts < 1:
            raise ValueError("batch_size and max_attempts must be >= 1")
        if compress not in (None, "gzip", "zstd"):
            raise ValueError(f"compress must be None, 'gzip' or 'zstd', got {compress!r}")
        if transport not in ("http", "ws"):
            raise ValueError(f"transport must be 'http' or 'ws', got {transport!r}")
        urls = receiver_urls(url, transport)
        self.source = source
        self._transport: Transport
        if transport == "http":
            self._transport = HttpTransport(urls[0], source, token, compress, timeout_s, http_client)
        else:
            self._transport = WsTransport(urls[0], source, token, batch_size, timeout_s, ws_connect)
        self._retry = Retrier(
            source,
            urls,
            self._transport.use,
            max_attempts=max_attempts,
            base_delay_s=base_delay_s,
            max_delay_s=max_delay_s,
            sleep=sleep,
            rng=rng or random.Random(),
        )
        self._batch_size = batch_size
        self._on_ack, self._sleep, self._clock = on_ack, sleep, clock
        self._next_seq = start_sequence
        self._last_ack: int | None = None
        self._start_event = start_event_sequence
        self._last_event: int | None = None
        self._buffer: list[dict[str, Any]] = []
        self._pending: Batch | None = None
        self._tx: tuple[str, list[dict[str, Any]]] | None = None
        """The open ``transaction()`` block: its id and the events sent in it so far."""
        self._not_before = 0.0
        self._closed = False

    @property
    def url(self) -> str:
        """The receiver replica the producer sends to now."""
        return self._retry.url

    @property
    def urls(self) -> tuple[str, ...]:
        """Every receiver replica, in failover order."""
        return self._retry.urls

    @property
    def failovers(self) -> int:
        """How many times the producer moved to another replica after one failed."""
        return self._retry.failovers

    @property
    def last_ack_sequence(self) -> int | None:
        """The highest batch sequenceNumber the receiver acked (or reported at resumption)."""
        return self._last_ack

    @property
    def pending_events(self) -> int:
        """Events buffered (also in an open ``transaction()`` block) or in an unacked batch."""
        in_tx = len(self._tx[1]) if self._tx else 0
        return len(self._buffer) + in_tx + (len(self._pending.events) if self._pending else 0)

    def send(
        self,
        table: str,
        operation: str,
        row_id: str,
        *,
        after: dict[str, Any] | None = None,
        before: dict[str, Any] | None = None,
        sequence: int | None = None,
        timestamp_ms: int | None = None,
        metadata: dict[str, Any] | None = None,
        transaction: str | None = None,
    ) -> None:
        """Buffer one event; ``transaction``: the id of the source transaction it belongs to
        (inside a ``transaction()`` block, that block's id or nothing)."""
        event: dict[str, Any] = {"sequence": sequence, "timestamp": timestamp_ms, "operation": operation}
        event |= {"table": table, "rowId": row_id, "before": before, "after": after, "metadata": metadata}
        self._check_open()
        if transaction is not None:
            _check_id(transaction)
            event["transaction"] = {"id": transaction}
        if self._tx is not None:
            tx_id, tx_events = self._tx
            if transaction not in (None, tx_id):
                raise ValueError(f"event of transaction {transaction!r} inside transaction {tx_id!r}")
            if len(tx_events) >= MAX_EVENTS_PER_BATCH:
                raise ValueError(
                    f"transaction {tx_id!r} has more than MAX_EVENTS_PER_BATCH ({MAX_EVENTS_PER_BATCH}) events: "
                    "it must go in one batch, and a batch holds no more"
                )
            tx_events.append(self._prepare(event))
            return
        self._buffer.append(self._prepare(event))
        if len(self._buffer) >= self._batch_size:
            self.flush()

    def send_events(self, events: list[dict[str, Any]], *, transaction: str | None = None) -> Ack:
        """Send ``events`` (wire-format dicts) as one batch now, after anything buffered;
        ``transaction``: the batch is that whole source transaction."""
        if not events:
            raise ValueError("a batch needs at least one event")
        if transaction is not None:
            _check_id(transaction)
        if len(events) > MAX_EVENTS_PER_BATCH:
            raise ValueError(
                f"{len(events)} events in one batch, over MAX_EVENTS_PER_BATCH ({MAX_EVENTS_PER_BATCH})"
                + (f": transaction {transaction!r} cannot be split" if transaction is not None else "")
            )
        self.flush()
        return self._send_new([self._prepare(e) for e in events], transaction)

    @contextlib.contextmanager
    def transaction(self, transaction_id: str) -> Iterator[None]:
        """``send()`` within the block collects one source transaction, sent as ONE batch when
        the block ends (what was buffered before goes first, in its own batch). An exception in
        the block sends none of it. Not nested."""
        _check_id(transaction_id)
        self._check_open()
        if self._tx is not None:
            raise RuntimeError(f"transaction {self._tx[0]!r} is still open: transactions do not nest")
        self.flush()
        self._tx = (transaction_id, [])
        try:
            yield
        except BaseException:
            self._tx = None
            raise
        events, self._tx = self._tx[1], None
        if events:
            self._send_new(events, transaction_id)

    def flush(self) -> Ack | None:
        """Send the buffered events (and first any batch left unacked by an earlier failure)."""
        self._check_open()
        ack = self._deliver() if self._pending else None
        if not self._buffer:
            return ack
        self._start()  # before taking the events: a failed resumption must leave them buffered
        events, self._buffer = self._buffer, []
        return self._send_new(events)

    def request_flush(self) -> dict[str, Any]:
        """Send what is buffered, then ask the receiver to flush now; returns its answer."""
        self.flush()
        self._start()
        return self._retry.run(lambda: self._transport.request_flush(self._last_ack))

    def close(self) -> None:
        if self._closed:
            return
        try:
            self.flush()
        finally:
            self._closed = True
            self._transport.close()

    def __enter__(self) -> Producer:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is None:
            self.close()
        else:
            # Do not send a batch the failing caller may have left half-built.
            self._closed = True
            self._transport.close()

    # ------------------------------------------------------------------ internals

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("producer is closed")

    def _prepare(self, event: dict[str, Any]) -> dict[str, Any]:
        out = {k: v for k, v in event.items() if v is not None}
        if "sequence" not in out:
            if self._last_event is None and self._start_event is not None:
                out["sequence"] = self._start_event
            else:
                n = 0 if self._last_event is None else self._last_event + 1
                # The clock floor keeps a restarted producer above what it numbered before.
                out["sequence"] = n if self._start_event is not None else max(n, time.time_ns() // 1000)
        seq = int_or_none(out["sequence"])  # anything else is the receiver's to reject, naming it
        if seq is not None:
            self._last_event = seq if self._last_event is None else max(self._last_event, seq)
        out.setdefault("timestamp", time.time_ns() // 1_000_000)
        return out

    def _start(self) -> None:
        if self._next_seq is None:
            self._last_ack = self._retry.run(lambda: self._transport.resume(None))
            self._next_seq = (self._last_ack or 0) + 1

    def _send_new(self, events: list[dict[str, Any]], transaction: str | None = None) -> Ack:
        self._start()
        assert self._next_seq is not None
        self._pending = Batch(self._next_seq, events, transaction=transaction)
        return self._deliver()

    def _deliver(self) -> Ack:
        batch = self._pending
        assert batch is not None
        wait = self._not_before - self._clock()
        if wait > 0:
            self._sleep(wait)
        connect_ack = self._last_ack if self._last_ack is not None else batch.sequence_number - 1
        try:
            ack = self._retry.run(lambda: self._transport.send(batch, connect_ack), batch)
        except ProducerError as exc:
            if not exc.retryable:
                # Rejected: nothing landed, so its sequenceNumber stays free for the next batch.
                self._pending = None
                exc.events = batch.events
            raise
        self._pending = None
        self._next_seq = batch.sequence_number + 1
        self._last_ack = batch.sequence_number
        if ack.status == "duplicate" and batch.retry_count == 0:
            # A first attempt acked duplicate: the numbering overlaps batches landed earlier.
            log.warning(
                "%s: batch %d was new but acked duplicate; check start_sequence", self.source, ack.sequence_number
            )
        if ack.suggested_delay_ms > 0:
            self._not_before = self._clock() + ack.suggested_delay_ms / 1000
        if self._on_ack:
            self._on_ack(ack)
        return ack


def _check_id(transaction: str) -> None:
    # Refused here rather than by the receiver: a whole transaction's batch would be lost to a 400.
    if not isinstance(transaction, str) or not 1 <= len(transaction) <= MAX_TRANSACTION_ID_CHARS:
        raise ValueError(f"a transaction id is a string of 1..{MAX_TRANSACTION_ID_CHARS} characters")
