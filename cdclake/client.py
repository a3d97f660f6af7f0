"""Synchronous CDC producer: buffers events, numbers them, sends them as batches to the receiver
over HTTP (``POST /v1/batches``) or WebSocket (``/v1/stream``) and retries until each is acked.

A retry resends the same batch under the same ``sequenceNumber``, so the receiver can recognise a
batch that already landed and ack it ``duplicate``: at-least-once on the wire, once in staging.
Given several receiver replicas (they share the staging store and so the receipts), a retry after a
replica failed goes to the next one, which recognises the batch just the same.
A Producer is not thread-safe; use one per thread.
"""

from __future__ import annotations

import contextlib
import email.utils
import gzip
import logging
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal, Protocol, TypeVar
from urllib.parse import quote, urlsplit

import httpx
import msgspec

from cdclake.contracts.protocol import DEFAULT_MAX_BODY_BYTES, LEAVING_REASONS, PROTOCOL_VERSION, RETRYABLE_REASONS

log = logging.getLogger(__name__)
T = TypeVar("T")

_RETRYABLE_STATUS = frozenset({408, 425, 429})
# A gateway status without the receiver's own JSON answer: a proxy found no healthy replica behind it.
_GATEWAY_STATUS = frozenset({502, 503, 504})
MAX_MESSAGE_BYTES = DEFAULT_MAX_BODY_BYTES


@dataclass(frozen=True)
class Ack:
    sequence_number: int
    status: str
    """``persisted``, ``duplicate`` (landed before), ``fallback`` ... every status is a success."""
    events: int
    details: dict[str, Any] = field(default_factory=dict)
    suggested_delay_ms: int = 0


class ProducerError(Exception):
    """A batch was rejected for good, or could not be delivered within ``max_attempts``."""

    def __init__(
        self,
        reason: str,
        message: str,
        field: str | None = None,
        *,
        expected_sequence: int | None = None,
        status_code: int | None = None,
        max_size: int | None = None,
        retryable: bool = False,
        events: list[dict[str, Any]] | None = None,
    ) -> None:
        text = f"{reason}: {message}"
        if field:
            text += f" (field {field})"
        if expected_sequence is not None:
            text += f" (receiver expects sequenceNumber {expected_sequence})"
        super().__init__(text)
        self.reason, self.message, self.field = reason, message, field
        self.expected_sequence, self.status_code, self.max_size = expected_sequence, status_code, max_size
        self.retryable = retryable
        """True: gave up on a transient failure; the batch stays pending and the next flush resends it."""
        self.events = events
        """The rejected batch's events when it was dropped (nothing of it landed)."""


class _Retry(Exception):
    def __init__(self, reason: str, message: str, delay_s: float | None = None, *, switch: bool = False) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason, self.message, self.delay_s = reason, message, delay_s
        self.switch = switch
        """The replica failed (unreachable, gone, leaving): retry on the next one, if there is one."""


@dataclass
class _Batch:
    sequence_number: int
    events: list[dict[str, Any]]
    retry_count: int = 0

    def fields(self) -> dict[str, Any]:
        return {
            "sequenceNumber": self.sequence_number,
            "firstEventSequence": self.events[0]["sequence"],
            "lastEventSequence": self.events[-1]["sequence"],
            "events": self.events,
            "isRetry": self.retry_count > 0,
            "retryCount": self.retry_count,
        }


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _ms_to_s(value: Any) -> float | None:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and value >= 0
    return value / 1000 if ok else None


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:  # the HTTP-date form
        return max(0.0, email.utils.parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


def _json_object(data: bytes | str) -> dict[str, Any] | None:
    try:
        obj = msgspec.json.decode(data)
    except msgspec.DecodeError:
        return None
    return obj if isinstance(obj, dict) else None


def _failure(
    body: Mapping[str, Any] | None, status: int | None = None, retry_after: str | None = None
) -> ProducerError | _Retry:
    """The error for a nack (WebSocket: ``status`` None) or a failed HTTP response."""
    b = body or {}
    answered = bool(b.get("reason") or b.get("error"))  # the receiver's own answer, not a proxy's
    reason = str(b.get("reason") or b.get("error") or (f"http_{status}" if status else "unknown"))
    message = str(b.get("errorMessage") or b.get("message") or reason)
    if status is not None:
        # Over HTTP the status decides: a proxy's 502 has no nack body, a 400 never passes on retry.
        retry = status >= 500 or status in _RETRYABLE_STATUS
        message = f"HTTP {status}: {message}"
    else:
        should = b.get("shouldRetry")
        retry = should if isinstance(should, bool) else reason in RETRYABLE_REASONS
    if retry:
        hints = [h for h in (_retry_after(retry_after), _ms_to_s(b.get("retryDelayMs"))) if h is not None]
        # Backpressure (buffer_full, rate_limited, ...) comes from a healthy replica and is about
        # the shared store or this producer: another replica would say the same, so stay and wait.
        switch = reason in LEAVING_REASONS or (status in _GATEWAY_STATUS and not answered)
        return _Retry(reason, message, max(hints) if hints else None, switch=switch)
    return ProducerError(
        reason,
        message,
        b.get("field") if isinstance(b.get("field"), str) else None,
        expected_sequence=_int_or_none(b.get("expectedSequence")),
        status_code=status,
        max_size=_int_or_none(b.get("maxSize")),
    )


def _ack(body: Mapping[str, Any], batch: _Batch) -> Ack:
    if body.get("sequenceNumber") != batch.sequence_number:
        raise ProducerError(
            "protocol_error", f"ack for {body.get('sequenceNumber')!r}, sent batch {batch.sequence_number}"
        )
    details = body.get("details")
    details = details if isinstance(details, dict) else {}
    delay = _int_or_none(details.get("suggestedDelayMs")) or 0
    return Ack(batch.sequence_number, str(body.get("status")), len(batch.events), details, max(0, delay))


def _receiver_urls(url: str | Sequence[str], transport: str) -> tuple[str, ...]:
    """``url`` (one URL, comma-separated URLs, or a sequence of them) as a tuple of base URLs."""
    items = url.split(",") if isinstance(url, str) else list(url)
    schemes = ("http", "https", "ws", "wss") if transport == "ws" else ("http", "https")
    out = []
    for item in items:
        if not isinstance(item, str):
            raise ValueError(f"receiver URL {item!r} is not a string (url={url!r})")
        u = item.strip().rstrip("/")
        try:
            parts = urlsplit(u)
            # .port raises ValueError for a port that is not a number below 65536.
            ok = parts.scheme in schemes and bool(parts.hostname) and parts.port != 0
            ok = ok and not parts.query and not parts.fragment
        except ValueError:
            ok = False
        if not ok:
            raise ValueError(
                f"receiver URL {item!r} is not a {'/'.join(schemes)} URL like http://host:8090 (url={url!r})"
            )
        out.append(u)
    if not out:
        raise ValueError(f"no receiver URL given (url={url!r})")
    return tuple(out)


class _Transport(Protocol):
    def use(self, url: str) -> None: ...
    def resume(self, last_ack: int | None) -> int | None: ...
    def send(self, batch: _Batch, last_ack: int | None) -> Ack: ...
    def request_flush(self, last_ack: int | None) -> dict[str, Any]: ...
    def close(self) -> None: ...


class _HttpTransport:
    def __init__(
        self,
        url: str,
        source: str,
        token: str | None,
        compress: str | None,
        timeout_s: float,
        client: httpx.Client | None,
    ) -> None:
        self._url, self._source, self._compress = url, source, compress
        self._client = client or httpx.Client(timeout=timeout_s)
        self._owns_client = client is None
        self._auth = {"Authorization": f"Bearer {token}"} if token else {}

    def use(self, url: str) -> None:
        # Nothing to re-establish: every request carries source and sequenceNumber, and any
        # replica reads the shared receipts (a batch the old one landed is acked duplicate).
        self._url = url

    def _request(self, method: str, path: str, content: bytes | None = None, **headers: str) -> httpx.Response:
        try:
            return self._client.request(method, self._url + path, content=content, headers=self._auth | headers)
        except httpx.TransportError as exc:
            # Covers refused connections (receiver restarting), resets and timeouts.
            raise _Retry("connection_error", f"{type(exc).__name__}: {exc}", switch=True) from None

    def _fail(self, r: httpx.Response) -> ProducerError | _Retry:
        return _failure(_json_object(r.content), r.status_code, r.headers.get("retry-after"))

    def resume(self, last_ack: int | None) -> int | None:
        r = self._request("GET", f"/v1/sources/{quote(self._source, safe='')}")
        value = (_json_object(r.content) or {}).get("lastAckSequence", "absent")
        if r.status_code == 200 and (value is None or _int_or_none(value) is not None):
            return _int_or_none(value)
        err = self._fail(r)
        if isinstance(err, _Retry) or r.status_code not in (200, 404):
            raise err
        # Guessing 1 here would be unsafe: the receiver acks batches it already has as duplicates,
        # so a producer renumbering from 1 would see its new events silently dropped.
        raise ProducerError(
            "resume_failed",
            f"GET /v1/sources/{self._source} gave HTTP {r.status_code} without lastAckSequence; "
            "pass start_sequence to say where this producer stands",
            status_code=r.status_code,
        )

    def send(self, batch: _Batch, last_ack: int | None) -> Ack:
        body = msgspec.json.encode({"source": self._source, **batch.fields()})
        headers = {"Content-Type": "application/json"}
        if self._compress == "gzip":
            # mtime=0: a retry must be byte-identical to the first attempt.
            body = gzip.compress(body, mtime=0)
            headers["Content-Encoding"] = "gzip"
        elif self._compress == "zstd":
            import zstandard

            body = zstandard.ZstdCompressor().compress(body)
            headers["Content-Encoding"] = "zstd"
        r = self._request("POST", "/v1/batches", body, **headers)
        data = _json_object(r.content)
        if r.is_success and data is not None and data.get("type") == "ack":
            return _ack(data, batch)
        if r.is_success:
            raise ProducerError("protocol_error", f"HTTP {r.status_code} without an ack: {r.text[:200]}")
        raise self._fail(r)

    def request_flush(self, last_ack: int | None) -> dict[str, Any]:
        r = self._request("POST", "/flush")
        if not r.is_success:
            # Advisory, and a 502 means the receiver could not reach Airflow: report, do not retry.
            err = self._fail(r)
            if isinstance(err, _Retry):
                err = ProducerError(err.reason, err.message, status_code=r.status_code)
            raise err
        return _json_object(r.content) or {}

    def close(self) -> None:
        if self._owns_client:
            self._client.close()


class WsConnection(Protocol):
    def send(self, message: str) -> None: ...
    def recv(self, timeout: float | None = None) -> str | bytes: ...
    def close(self) -> None: ...


WsConnect = Callable[[str, dict[str, str], float], WsConnection]


def _websockets_connect(url: str, headers: dict[str, str], timeout_s: float) -> WsConnection:
    from websockets.sync.client import connect

    # No per-message deflate: it cost more CPU on both ends than it saved (bench_receiver).
    conn: WsConnection = connect(
        url, additional_headers=headers, open_timeout=timeout_s, max_size=MAX_MESSAGE_BYTES, compression=None
    )
    return conn


def ws_url(url: str) -> str:
    """``http(s)://host/base`` -> ``ws(s)://host/base/v1/stream``."""
    for http, ws in (("https://", "wss://"), ("http://", "ws://")):
        if url.startswith(http):
            url = ws + url[len(http) :]
    return url.rstrip("/") + "/v1/stream"


class _WsTransport:
    def __init__(
        self, url: str, source: str, token: str | None, batch_size: int, timeout_s: float, connect: WsConnect | None
    ) -> None:
        self._url, self._source, self._batch_size, self._timeout = ws_url(url), source, batch_size, timeout_s
        self._connect = connect or _websockets_connect
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._conn: WsConnection | None = None
        self.server_last_ack: int | None = None

    def use(self, url: str) -> None:
        # The next call connects there and resumes with ``connect``/``status`` as after a drop.
        self.close()
        self._url = ws_url(url)

    def _io(self, action: Callable[[], Any]) -> Any:
        from websockets.exceptions import InvalidStatus, WebSocketException

        try:
            return action()
        except InvalidStatus as exc:
            # The upgrade was refused with an HTTP status (401, 403, 429, 503 ...).
            resp = exc.response
            self.close()
            raise _failure(
                _json_object(bytes(resp.body or b"")), resp.status_code, resp.headers.get("Retry-After")
            ) from None
        except (OSError, TimeoutError, WebSocketException) as exc:
            self.close()
            raise _Retry("connection_lost", f"{type(exc).__name__}: {exc}", switch=True) from None

    def _recv(self, conn: WsConnection) -> dict[str, Any]:
        deadline = time.monotonic() + self._timeout
        while True:
            msg = _json_object(self._io(lambda: conn.recv(timeout=max(0.0, deadline - time.monotonic()))))
            if msg is not None:
                return msg

    def _open(self, last_ack: int | None) -> WsConnection:
        from websockets.exceptions import WebSocketException

        if self._conn is not None:
            return self._conn
        conn: WsConnection = self._io(lambda: self._connect(self._url, self._headers, self._timeout))
        self._conn = conn
        hello = {
            "type": "connect",
            "timestamp": int(time.time() * 1000),
            "sourceDoId": self._source,
            "lastAckSequence": last_ack,
            "protocolVersion": PROTOCOL_VERSION,
            "capabilities": {
                "binaryProtocol": False,
                "compression": False,
                "batching": True,
                "maxBatchSize": self._batch_size,
                "maxMessageSize": MAX_MESSAGE_BYTES,
            },
        }
        # A refusal (bad token) may already be waiting: the recv below reports it, or the loss.
        with contextlib.suppress(OSError, WebSocketException):
            conn.send(msgspec.json.encode(hello).decode())
        reply = self._recv(conn)
        if reply.get("type") == "nack":
            self.close()
            raise _failure(reply)
        if reply.get("type") != "status" or "lastAckSequence" not in reply:
            self.close()
            raise ProducerError("protocol_error", f"expected a status reply to connect, got {reply!r:.200}")
        self.server_last_ack = _int_or_none(reply["lastAckSequence"])
        return conn

    def resume(self, last_ack: int | None) -> int | None:
        self._open(last_ack)
        return self.server_last_ack

    def send(self, batch: _Batch, last_ack: int | None) -> Ack:
        conn = self._open(last_ack)
        events_json = msgspec.json.encode(batch.events)
        msg = {
            "type": "cdc_batch",
            "timestamp": int(time.time() * 1000),
            "sourceDoId": self._source,
            **batch.fields(),
            "sizeBytes": len(events_json),
            "correlationId": f"{self._source}:{batch.sequence_number}:{batch.retry_count}",
        }
        self._io(lambda: conn.send(msgspec.json.encode(msg).decode()))
        while True:
            reply = self._recv(conn)
            kind, seq = reply.get("type"), reply.get("sequenceNumber")
            # A nack without sequenceNumber is about the frame we just sent (it could not be parsed).
            if kind == "ack" and seq == batch.sequence_number:
                return _ack(reply, batch)
            if kind == "nack" and seq in (batch.sequence_number, None):
                raise _failure(reply)

    def request_flush(self, last_ack: int | None) -> dict[str, Any]:
        conn = self._open(last_ack)
        msg = {"type": "flush_request", "timestamp": int(time.time() * 1000), "sourceDoId": self._source}
        self._io(lambda: conn.send(msgspec.json.encode(msg | {"reason": "manual"}).decode()))
        while True:  # the receiver answers with a status message carrying "flush"
            reply = self._recv(conn)
            if reply.get("type") == "nack":
                raise _failure(reply)
            if reply.get("type") == "status" and isinstance(reply.get("flush"), dict):
                flush: dict[str, Any] = reply["flush"]
                if "error" in flush:
                    raise ProducerError("flush_failed", str(flush["error"]))
                return flush

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # the connection is being discarded anyway
                log.debug("closing the WebSocket failed", exc_info=True)


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
        self._urls = _receiver_urls(url, transport)
        self._url_index = 0
        self._failovers = 0
        self.source = source
        self._transport: _Transport
        if transport == "http":
            self._transport = _HttpTransport(self._urls[0], source, token, compress, timeout_s, http_client)
        else:
            self._transport = _WsTransport(self._urls[0], source, token, batch_size, timeout_s, ws_connect)
        self._batch_size, self._max_attempts = batch_size, max_attempts
        self._base_delay, self._max_delay = base_delay_s, max_delay_s
        self._on_ack, self._sleep, self._clock = on_ack, sleep, clock
        self._rng = rng or random.Random()
        self._next_seq = start_sequence
        self._last_ack: int | None = None
        self._start_event = start_event_sequence
        self._last_event: int | None = None
        self._buffer: list[dict[str, Any]] = []
        self._pending: _Batch | None = None
        self._not_before = 0.0
        self._closed = False

    @property
    def url(self) -> str:
        """The receiver replica the producer sends to now."""
        return self._urls[self._url_index]

    @property
    def urls(self) -> tuple[str, ...]:
        """Every receiver replica, in failover order."""
        return self._urls

    @property
    def failovers(self) -> int:
        """How many times the producer moved to another replica after one failed."""
        return self._failovers

    @property
    def last_ack_sequence(self) -> int | None:
        """The highest batch sequenceNumber the receiver acked (or reported at resumption)."""
        return self._last_ack

    @property
    def pending_events(self) -> int:
        """Events buffered or in an unacked batch."""
        return len(self._buffer) + (len(self._pending.events) if self._pending else 0)

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
    ) -> None:
        event: dict[str, Any] = {"sequence": sequence, "timestamp": timestamp_ms, "operation": operation}
        event |= {"table": table, "rowId": row_id, "before": before, "after": after, "metadata": metadata}
        self._check_open()
        self._buffer.append(self._prepare(event))
        if len(self._buffer) >= self._batch_size:
            self.flush()

    def send_events(self, events: list[dict[str, Any]]) -> Ack:
        """Send ``events`` (wire-format dicts) as one batch now, after anything buffered."""
        if not events:
            raise ValueError("a batch needs at least one event")
        self.flush()
        return self._send_new([self._prepare(e) for e in events])

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
        return self._with_retries(lambda: self._transport.request_flush(self._last_ack))

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
        seq = _int_or_none(out["sequence"])  # anything else is the receiver's to reject, naming it
        if seq is not None:
            self._last_event = seq if self._last_event is None else max(self._last_event, seq)
        out.setdefault("timestamp", time.time_ns() // 1_000_000)
        return out

    def _start(self) -> None:
        if self._next_seq is None:
            self._last_ack = self._with_retries(lambda: self._transport.resume(None))
            self._next_seq = (self._last_ack or 0) + 1

    def _send_new(self, events: list[dict[str, Any]]) -> Ack:
        self._start()
        assert self._next_seq is not None
        self._pending = _Batch(self._next_seq, events)
        return self._deliver()

    def _deliver(self) -> Ack:
        batch = self._pending
        assert batch is not None
        wait = self._not_before - self._clock()
        if wait > 0:
            self._sleep(wait)
        connect_ack = self._last_ack if self._last_ack is not None else batch.sequence_number - 1
        try:
            ack = self._with_retries(lambda: self._transport.send(batch, connect_ack), batch)
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

    def _fail_over(self, exc: _Retry) -> bool:
        """Move to the next replica (round robin); False when there is no other."""
        if len(self._urls) < 2:
            return False
        left = self.url
        self._url_index = (self._url_index + 1) % len(self._urls)
        self._failovers += 1
        self._transport.use(self.url)
        log.warning("%s: receiver %s failed (%s); failing over to %s", self.source, left, exc, self.url)
        return True

    def _with_retries(self, op: Callable[[], T], batch: _Batch | None = None) -> T:
        for attempt in range(1, self._max_attempts + 1):
            try:
                return op()
            except _Retry as exc:
                if batch is not None:
                    batch.retry_count += 1
                # Also after the last attempt: the next flush then starts on a replica that may be up.
                switched = exc.switch and self._fail_over(exc)
                if attempt == self._max_attempts:
                    raise ProducerError(
                        exc.reason, f"gave up after {attempt} attempts: {exc.message}", retryable=True
                    ) from None
                cap = min(self._max_delay, self._base_delay * 2 ** (attempt - 1))
                # Full jitter spreads producers that failed together; a server hint wins over it,
                # unless it came from the replica just left.
                hint = None if switched else exc.delay_s
                delay = hint if hint is not None else self._rng.uniform(0, cap)
                log.info("%s: %s; attempt %d, retrying in %.3fs", self.source, exc, attempt, delay)
                self._sleep(delay)
        raise AssertionError("unreachable")
