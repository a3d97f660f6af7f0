"""Connections against the real servers (``python -m receiver`` / ``python -m restcatalog`` on
127.0.0.1, small deadlines through their settings): a silent connection, a header trickle, a body
trickle and a WebSocket that never sends ``connect`` are closed; idle connections past the cap
cannot exhaust the server; Java's ``Upgrade: h2c`` offer is answered over HTTP/1.1 with the whole
body (issue 13 finding 8, issue 14 finding 1). Every loop is bounded in count and time."""

from __future__ import annotations

import contextlib
import json
import os
import select
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect as ws_connect

from cdclake.dev.stack import free_port
from tests.support.debezium import ANNE, ENVELOPE_SCHEMA, pg_payload

pytestmark = pytest.mark.server  # real receiver and REST catalog processes on 127.0.0.1 ports

DEADLINE_S = 1.0
"""Header and body deadline, and the WebSocket connect deadline, of the servers under test."""
PATIENCE_S = 15.0
"""How long a test waits for the server to close a connection (well past DEADLINE_S)."""
CAP = 16


@dataclass
class Server:
    url: str
    port: int
    proc: subprocess.Popen[bytes]


@contextlib.contextmanager
def serve(module: str, home: Path, **env: str) -> Iterator[Server]:
    port = free_port()
    port_var = "CDCLAKE_REST_PORT" if module == "restcatalog" else "CDCLAKE_RECEIVER_PORT"
    full = {
        **os.environ,
        "CDCLAKE_HOME": str(home),
        port_var: str(port),
        "CDCLAKE_RATE_LIMIT_PER_S": "0",
        "CDCLAKE_HEADER_TIMEOUT_S": str(DEADLINE_S),
        "CDCLAKE_BODY_TIMEOUT_S": str(DEADLINE_S),
        "CDCLAKE_BODY_MIN_BYTES_PER_S": "100",
        "CDCLAKE_WS_CONNECT_TIMEOUT_S": str(DEADLINE_S),
        **env,
    }
    with (home / f"{module}.log").open("ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", module], env=full, stdout=subprocess.DEVNULL, stderr=log)
    server = Server(f"http://127.0.0.1:{port}", port, proc)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, f"python -m {module} did not start"
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(server.url + "/health", timeout=2).status_code == 200:
                    break
            time.sleep(0.1)
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


@pytest.fixture(scope="module")
def receiver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with serve("receiver", tmp_path_factory.mktemp("receiver")) as s:
        yield s


def opened(server: Server) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", server.port), timeout=PATIENCE_S)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def answer_or_close(s: socket.socket) -> bytes:
    """What the server sends until it closes (b'' for a bare close); socket.timeout if it does not
    close within PATIENCE_S."""
    got = b""
    while True:
        try:
            chunk = s.recv(65536)
        except ConnectionResetError:
            return got
        if not chunk:
            return got
        got += chunk


def closed_while_trickling(s: socket.socket, byte: bytes, every_s: float = 0.25, count: int = 60) -> bytes | None:
    """Send ``byte`` every ``every_s`` (at most ``count`` times, 15 s); the server's last words
    once it closes the connection, None if it never did."""
    for _ in range(count):
        readable, _, _ = select.select([s], [], [], every_s)
        if readable:
            return answer_or_close(s)
        try:
            s.sendall(byte)
        except (BrokenPipeError, ConnectionResetError):
            return b""
    return None


def refused_or_closed(words: bytes | None, status: bytes) -> bool:
    return words is not None and (words == b"" or words.startswith(b"HTTP/1.1 " + status))


# --------------------------------------------------------------------------- deadlines


def seed_event() -> dict[str, object]:
    return {
        "sequence": 1,
        "timestamp": 1_767_225_600_000,
        "operation": "INSERT",
        "table": "items",
        "rowId": "1",
        "after": {"id": 1},
    }


@pytest.mark.parametrize("module", ["receiver", "restcatalog"])
def test_a_silent_connection_and_a_header_trickle_are_closed(tmp_path: Path, module: str) -> None:
    with serve(module, tmp_path) as server, opened(server) as silent, opened(server) as trickle:
        trickle.sendall(b"POST /v1/batches HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        words = closed_while_trickling(trickle, b"a")
        assert refused_or_closed(words, b"408"), words
        assert refused_or_closed(answer_or_close(silent), b"408")


def test_a_body_trickle_is_closed_and_a_slow_body_above_the_minimum_rate_is_not(receiver: Server) -> None:
    head = b"POST /v1/batches HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    with opened(receiver) as s:
        s.sendall(head + b"Content-Length: 10000\r\n\r\n{")
        words = closed_while_trickling(s, b" ")
        assert refused_or_closed(words, b"408"), words
    # 10 pieces of 1 KB, 0.2 s apart: longer than the 1 s deadline, far above 100 bytes/s.
    batch = {"source": "slow-1", "sequenceNumber": 1, "events": [seed_event()]}
    body = json.dumps(batch).encode()
    body += b" " * (10 * 1024 - len(body))
    with opened(receiver) as s:
        s.sendall(head + b"Content-Length: %d\r\n\r\n" % len(body))
        for i in range(10):
            time.sleep(0.2)
            s.sendall(body[i * 1024 : (i + 1) * 1024])
        head, answer = read_response(s)
    assert head.startswith(b"HTTP/1.1 200"), (head, answer)
    assert json.loads(answer)["status"] == "persisted"


def test_an_answer_before_the_body_is_read_whole_and_the_connection_then_ends(receiver: Server) -> None:
    # The declared body is over CDCLAKE_MAX_BODY_BYTES: refused before it is read. The client
    # reads the 413 (no reset while it still sends), the rest of its body is dropped unread, and
    # the connection ends within the linger time rather than waiting for another request.
    declared = 5 * 1024 * 1024
    with opened(receiver) as s:
        s.sendall(b"POST /v1/batches HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % declared)
        s.sendall(b" " * 65536)
        head, answer = read_response(s)
        assert head.startswith(b"HTTP/1.1 413"), (head, answer)
        assert json.loads(answer)["reason"] == "payload_too_large"
        assert closed_while_trickling(s, b" " * 1024) == b"", "still open"


def test_a_websocket_that_never_sends_connect_is_closed(receiver: Server) -> None:
    with ws_connect(f"ws://127.0.0.1:{receiver.port}/v1/stream", open_timeout=PATIENCE_S) as ws:
        nack = json.loads(ws.recv(timeout=PATIENCE_S))
        assert nack["type"] == "nack" and "CDCLAKE_WS_CONNECT_TIMEOUT_S" in nack["errorMessage"]
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=PATIENCE_S)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008


# --------------------------------------------------------------------------- the cap


def test_connections_past_the_cap_cannot_exhaust_the_server(tmp_path: Path) -> None:
    # Deadlines far away: only the cap can protect the server here.
    slow = {"CDCLAKE_HEADER_TIMEOUT_S": "120", "CDCLAKE_BODY_TIMEOUT_S": "120", "CDCLAKE_MAX_CONNECTIONS": str(CAP)}
    with serve("receiver", tmp_path, **slow) as server, contextlib.ExitStack() as stack:
        proc = psutil.Process(server.proc.pid)
        before = proc.num_fds()
        idle = [stack.enter_context(opened(server)) for _ in range(4 * CAP)]
        with httpx.Client(timeout=PATIENCE_S) as c:
            r = c.get(server.url + "/health")  # a new connection past the cap: an idle one makes room
        assert r.status_code == 200
        assert proc.num_fds() <= before + CAP + 4
        assert len(idle) == 4 * CAP
        # Connections that are all busy (headers read: the server asked for the body with
        # "100 Continue") are not taken: a new one is refused with 503 at once.
        for s in idle:
            s.close()
        for _ in range(CAP):
            s = stack.enter_context(opened(server))
            s.sendall(b"POST /v1/batches HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 100\r\n\r\n")
            assert s.recv(100).startswith(b"HTTP/1.1 100")
        with opened(server) as extra:
            extra.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            words = answer_or_close(extra)
        assert words.startswith(b"HTTP/1.1 503"), words
        assert b"CDCLAKE_MAX_CONNECTIONS" in words
        assert proc.num_fds() <= before + CAP + 4


# --------------------------------------------------------------------------- h2c


def java_post(path: str, body: bytes) -> bytes:
    """A POST as Java 21's HttpClient sends it on an http:// URL (HTTP/2 preferred): the h2c
    upgrade offer with the body, headers in its order and spelling."""
    return (
        f"POST {path} HTTP/1.1\r\n"
        "Connection: Upgrade, HTTP2-Settings\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Host: 127.0.0.1\r\n"
        "HTTP2-Settings: AAEAAEAAAAIAAAABAAMAAABkAAQBAAAAAAUAAEAA\r\n"
        "Upgrade: h2c\r\n"
        "User-Agent: Java-http-client/21.0.5\r\n"
        "Content-Type: application/json\r\n"
        "\r\n"
    ).encode() + body


def read_response(s: socket.socket) -> tuple[bytes, bytes]:
    """One HTTP/1.1 response with Content-Length: (head, body)."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = s.recv(65536)
        assert chunk, f"closed after {buf!r}"
        buf += chunk
    head, body = buf.split(b"\r\n\r\n", 1)
    length = next(int(x.split(b":")[1]) for x in head.split(b"\r\n") if x.lower().startswith(b"content-length:"))
    while len(body) < length:
        chunk = s.recv(65536)
        assert chunk, f"closed in the body after {body!r}"
        body += chunk
    return head, body


def test_an_h2c_upgrade_offer_is_answered_over_http11_with_the_whole_body(receiver: Server) -> None:
    with opened(receiver) as s:
        for lsn in (24023128, 24023200):  # two requests on one connection, as Java's pool does
            event = {"schema": ENVELOPE_SCHEMA, "payload": pg_payload("c", None, dict(ANNE), lsn=lsn, commit=lsn)}
            body = json.dumps(event).encode()
            request = java_post("/v1/debezium", body)
            cut = request.index(b"\r\n\r\n") + 4
            s.sendall(request[:cut])  # the head, then the body in two pieces
            time.sleep(0.05)
            s.sendall(request[cut : cut + 10])
            time.sleep(0.05)
            s.sendall(request[cut + 10 :])
            head, answer = read_response(s)
            assert head.startswith(b"HTTP/1.1 200"), (head, answer)
            ack = json.loads(answer)
            assert ack["type"] == "ack" and ack["details"]["eventsProcessed"] == 1, ack
