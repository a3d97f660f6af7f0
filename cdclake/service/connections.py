"""How the servers (receiver, REST catalog) hold connections: read deadlines, a cap, h2c offers.

uvicorn reads a request's head and body for as long as the client cares to send them, and accepts
every connection, so a few hundred trickling or silent sockets hold the process's file descriptors
for ever. Its HTTP protocols are subclassed here, the same for both servers (:func:`server_config`):

- a request's head must be whole within ``CDCLAKE_HEADER_TIMEOUT_S`` of the connection opening or
  the previous response ending, and at most ``MAX_HEAD_BYTES`` long;
- its body must arrive within ``CDCLAKE_BODY_TIMEOUT_S`` plus one second per
  ``CDCLAKE_BODY_MIN_BYTES_PER_S`` bytes received (Apache's mod_reqtimeout rule: a slow link
  that keeps moving survives, a trickle does not);
- at most ``CDCLAKE_MAX_CONNECTIONS`` connections are open: past it, the one that has waited
  longest for a request head is closed to make room, and when every connection is busy the new
  one is answered 503 and closed.

An expired deadline is answered 408 (when no response has started) and the connection closed. A
request answered before its body was all in (a 401, a 413) ends its connection: the rest is read
and dropped for at most ``CDCLAKE_HEADER_TIMEOUT_S`` after the response (a lingering close, so the
client can read the answer rather than a reset), and no further request is parsed.

Java's HttpClient (Debezium Server's HTTP sink) offers ``Upgrade: h2c`` with the POST body on
http:// URLs. httptools treats such a request as bodiless and the body as the next request; h11
reads the body and lets the server decline the offer by answering over HTTP/1.1 (RFC 9110 §7.8).
h11 costs more CPU per request than httptools (docs/benchmarks.md, "h11 vs httptools"), so a
connection moves to h11 only when its first request carries an Upgrade other than websocket.
Java makes the offer with every request while it holds no h2c connection to the host (JDK
``Http2ClientImpl.getConnectionFor``), so with the first request of each connection.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from cdclake.config.settings import Settings
from cdclake.service.logs import log_config

if TYPE_CHECKING:
    from uvicorn.server import Protocols

log = logging.getLogger("cdclake.service.connections")

MAX_HEAD_BYTES = 64 * 1024
"""Request line and headers; httptools sets no limit of its own."""
HEAD, BODY, APP, DRAIN, GONE = "head", "body", "app", "drain", "gone"
"""What a connection waits for: a request head, the rest of a body, the application (no
deadline: a response is being made), the client to stop sending a body that was answered
already, nothing (closed, or handed to another protocol)."""


@dataclass(frozen=True)
class Limits:
    header_timeout_s: float
    body_timeout_s: float
    body_min_bytes_per_s: int
    max_connections: int

    @classmethod
    def of(cls, settings: Settings) -> Limits:
        return cls(
            settings.header_timeout_s,
            settings.body_timeout_s,
            settings.body_min_bytes_per_s,
            settings.max_connections,
        )


class GuardedConfig(uvicorn.Config):
    """uvicorn's Config with the limits its protocols read (uvicorn builds them with the config)."""

    def __init__(self, app: Any, limits: Limits, **kwargs: Any) -> None:
        super().__init__(app, http=HttpToolsGuarded, h11_max_incomplete_event_size=MAX_HEAD_BYTES, **kwargs)
        self.limits = limits


def server_config(app: Any, host: str, port: int, settings: Settings, **kwargs: Any) -> uvicorn.Config:
    """The uvicorn configuration both servers run with."""
    return GuardedConfig(
        app,
        Limits.of(settings),
        host=host,
        port=port,
        log_config=log_config(),
        # In-flight requests (a landing, a commit) finish on SIGTERM before the process exits.
        timeout_graceful_shutdown=30,
        **kwargs,
    )


def response(status: int, reason: str, error: str, message: str) -> bytes:
    body = json.dumps({"error": error, "message": message}).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode() + body


class _Guard(asyncio.Protocol):
    """Deadlines and the cap, mixed into a uvicorn HTTP protocol (which sets the attributes)."""

    config: uvicorn.Config
    transport: asyncio.Transport
    connections: set[Protocols]
    cycle: Any
    loop: asyncio.AbstractEventLoop

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.limits = cast(GuardedConfig, self.config).limits
        self._timer: asyncio.TimerHandle | None = None
        self._seen: Any = None  # the request whose head was last seen whole
        self._start(HEAD)
        if len(self.connections) > self.limits.max_connections and not self._make_room():
            n = self.limits.max_connections
            self._refuse(503, "Service Unavailable", f"{n} connections are open (CDCLAKE_MAX_CONNECTIONS)")

    def data_received(self, data: bytes) -> None:
        if self._phase in (DRAIN, GONE):
            return  # answered already: dropped unread
        self._received += len(data)
        super().data_received(data)
        self._observe()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # type: ignore[misc]
        if self._phase == GONE or self.transport.is_closing():
            return
        if self._phase == BODY:  # answered before the body was all in
            self._start(DRAIN)
            self.transport.write_eof()
            return
        self._start(HEAD)
        self._observe()  # a pipelined request may be whole already

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop()
        super().connection_lost(exc)

    # ------------------------------------------------------------------ phases

    def _start(self, phase: str) -> None:
        self._phase = phase
        self._since = self.loop.time()
        self._received = 0
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self.loop.call_at(self._deadline(), self._expire) if phase in (HEAD, BODY, DRAIN) else None

    def _stop(self) -> None:
        self._phase = GONE
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _deadline(self) -> float:
        if self._phase in (HEAD, DRAIN):
            return self._since + self.limits.header_timeout_s
        return self._since + self.limits.body_timeout_s + self._received / self.limits.body_min_bytes_per_s

    def _observe(self) -> None:
        """Move on when the parser has moved on: a whole head, a whole body, another protocol."""
        if self._phase == GONE:
            return
        if self.transport.get_protocol() is not self:  # upgraded to a WebSocket
            self._stop()
            return
        cycle = self.cycle
        if self._phase == HEAD and cycle is not None and cycle is not self._seen:
            self._seen = cycle
            self._start(BODY)
        if self._phase == BODY and not cycle.more_body:
            self._start(APP)
        if self._phase == HEAD and self._received > MAX_HEAD_BYTES:
            self._refuse(431, "Request Header Fields Too Large", f"request head over {MAX_HEAD_BYTES} bytes")

    def _expire(self) -> None:
        self._timer = None
        if self._phase == DRAIN:
            self._stop()
            self.transport.close()
            return
        self._observe()
        if self._phase not in (HEAD, BODY):
            return
        deadline = self._deadline()
        if self.loop.time() < deadline:  # the body moved on meanwhile
            self._timer = self.loop.call_at(deadline, self._expire)
            return
        if self._phase == HEAD:
            why = f"request head not complete within {self.limits.header_timeout_s:g} s (CDCLAKE_HEADER_TIMEOUT_S)"
        else:
            why = (
                f"request body not complete within {self.limits.body_timeout_s:g} s plus 1 s per "
                f"{self.limits.body_min_bytes_per_s} bytes (CDCLAKE_BODY_TIMEOUT_S, CDCLAKE_BODY_MIN_BYTES_PER_S)"
            )
        self._refuse(408, "Request Timeout", why)

    def _refuse(self, status: int, reason: str, message: str) -> None:
        peer = self.transport.get_extra_info("peername")
        log.warning("closing a connection from %s: %s", peer, message)
        cycle = self.cycle if self._phase == BODY else None
        if cycle is None or not cycle.response_started:
            error = {408: "request_timeout", 431: "head_too_large", 503: "connection_limit"}[status]
            self.transport.write(response(status, reason, error, message))
        if cycle is not None:
            cycle.disconnected = True  # the application hears a disconnect, and writes nothing more
            cycle.message_event.set()
        self._stop()
        self.transport.close()

    def _make_room(self) -> bool:
        """Close the connection that has waited longest for a request head, if there is one."""
        idle = [c for c in self.connections if isinstance(c, _Guard) and c is not self and c._phase in (HEAD, DRAIN)]
        if not idle:
            return False
        oldest = min(idle, key=lambda c: c._since)
        oldest._stop()
        oldest.transport.close()
        return True


class H11Guarded(_Guard, H11Protocol):
    def _unsupported_upgrade_warning(self) -> None:
        """Declining an h2c offer is ordinary (Java makes it with every request): no warning."""


class HttpToolsGuarded(_Guard, HttpToolsProtocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._first: bytearray | None = bytearray()  # the first request's head, until it is whole

    def data_received(self, data: bytes) -> None:
        if self._first is None or self._phase == GONE:
            super().data_received(data)
            return
        self._first += data
        self._received += len(data)
        end = self._first.find(b"\r\n\r\n")
        if end < 0:
            end = self._first.find(b"\n\n")  # bare LF: for httptools to judge, as before
        if end < 0:
            self._observe()  # the head size limit
            return
        head, self._first = bytes(self._first), None
        self._received = 0
        if offers_other_upgrade(head[:end]):
            self._hand_over(head)
        else:
            self.data_received(head)

    def _hand_over(self, received: bytes) -> None:
        """Serve this connection with h11 from its first byte on."""
        h11 = H11Guarded(self.config, self.server_state, self.app_state, _loop=self.loop)
        self._stop()
        self.connections.discard(self)
        self.transport.set_protocol(h11)
        h11.connection_made(self.transport)
        h11.data_received(received)


def offers_other_upgrade(head: bytes) -> bool:
    """Whether a request head carries an ``Upgrade`` header other than ``websocket``."""
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"upgrade" and value.strip().lower() != b"websocket":
            return True
    return False
