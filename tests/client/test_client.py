from __future__ import annotations

import gzip
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
import zstandard
from websockets.exceptions import ConnectionClosedError

from cdclake import staging
from cdclake.client import Ack, Producer, ProducerError, ws_url
from cdclake.config.settings import Settings
from cdclake.dev.stack import free_port
from receiver.__main__ import Server as ReceiverServer
from receiver.app import create_app
from tests.support import make_settings
from tests.support.threaded import serve_app

URL = "http://receiver.test"
Reply = httpx.Response | Exception | Callable[[httpx.Request], httpx.Response]


class FakeTime:
    """Clock and sleep for the producer: sleeping advances the clock, nothing really waits."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.sleeps.append(round(s, 6))
        self.now += s


class MaxJitter(random.Random):
    """Full jitter at its upper bound, so the backoff schedule is exact."""

    def uniform(self, a: float, b: float) -> float:
        return b


def ack(seq: int, status: str = "persisted", **details: Any) -> httpx.Response:
    return httpx.Response(200, json={"type": "ack", "sequenceNumber": seq, "status": status, "details": details})


def nack(code: int, reason: str, headers: dict[str, str] | None = None, **extra: Any) -> httpx.Response:
    body = {"type": "nack", "reason": reason, "errorMessage": reason, "shouldRetry": code >= 429, **extra}
    return httpx.Response(code, json=body, headers=headers)


def echo_ack(request: httpx.Request) -> httpx.Response:
    return ack(json.loads(request.content)["sequenceNumber"])


class Receiver:
    """Scripted receiver: POSTs get the next reply (then acks); GET /v1/sources gives ``last_ack``."""

    def __init__(self, *replies: Reply, last_ack: int | None = None) -> None:
        self.replies = list(replies)
        self.last_ack = last_ack
        self.posts: list[httpx.Request] = []
        self.gets: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.method == "GET":
            self.gets.append(request)
            return httpx.Response(200, json={"source": "src", "lastAckSequence": self.last_ack})
        self.posts.append(request)
        reply = self.replies.pop(0) if self.replies else echo_ack
        if isinstance(reply, Exception):
            raise reply
        return reply(request) if callable(reply) else reply

    def bodies(self) -> list[dict[str, Any]]:
        return [json.loads(r.content) for r in self.posts]


def producer(receiver: Callable[[httpx.Request], httpx.Response], fake: FakeTime, **kw: Any) -> Producer:
    kw = {"url": URL, "start_event_sequence": 1, "batch_size": 2, "max_attempts": 4, **kw}
    client = httpx.Client(transport=httpx.MockTransport(receiver))
    return Producer(source="src", http_client=client, sleep=fake.sleep, clock=fake.clock, rng=MaxJitter(), **kw)


@pytest.fixture()
def fake() -> FakeTime:
    return FakeTime()


@pytest.mark.parametrize(("last_ack", "first"), [(None, 1), (41, 42)])
def test_resumes_from_the_receiver_and_numbers_batches_and_events(fake: FakeTime, last_ack: Any, first: int) -> None:
    rx = Receiver(last_ack=last_ack)
    acks: list[Ack] = []
    with producer(rx, fake, token="s3cret", on_ack=acks.append) as p:
        for i in range(3):
            p.send("users", "INSERT", f"u{i}", after={"id": i}, timestamp_ms=5)
        p.send("users", "UPDATE", "u0", after={"id": 0}, sequence=100, timestamp_ms=5)
        p.send("users", "DELETE", "u1", timestamp_ms=5)
    assert len(rx.gets) == 1 and rx.gets[0].url.path == "/v1/sources/src"
    bodies = rx.bodies()
    assert [b["sequenceNumber"] for b in bodies] == [first, first + 1, first + 2]
    assert [[e["sequence"] for e in b["events"]] for b in bodies] == [[1, 2], [3, 100], [101]]
    assert bodies[1] == {
        "source": "src",
        "sequenceNumber": first + 1,
        "firstEventSequence": 3,
        "lastEventSequence": 100,
        "events": [
            {"sequence": 3, "timestamp": 5, "operation": "INSERT", "table": "users", "rowId": "u2", "after": {"id": 2}},
            {
                "sequence": 100,
                "timestamp": 5,
                "operation": "UPDATE",
                "table": "users",
                "rowId": "u0",
                "after": {"id": 0},
            },
        ],
        "isRetry": False,
        "retryCount": 0,
    }
    assert all(r.headers["authorization"] == "Bearer s3cret" for r in rx.posts + rx.gets)
    assert [a.sequence_number for a in acks] == [first, first + 1, first + 2]
    assert p.last_ack_sequence == first + 2 and fake.sleeps == []


def test_events_are_numbered_from_the_clock_by_default(fake: FakeTime) -> None:
    rx = Receiver()
    before = time.time_ns() // 1000
    with producer(rx, fake, start_event_sequence=None, start_sequence=1) as p:
        p.send_events([{"operation": "INSERT", "table": "t", "rowId": "a", "after": {}}] * 3)
    seqs = [e["sequence"] for e in rx.bodies()[0]["events"]]
    assert before <= seqs[0] < seqs[1] < seqs[2] <= time.time_ns() // 1000 + 2


def test_429_waits_for_retry_after(fake: FakeTime) -> None:
    rx = Receiver(nack(429, "rate_limited", headers={"Retry-After": "7"}))
    p = producer(rx, fake, start_sequence=1)
    assert p.send_events([{"operation": "DELETE", "table": "t", "rowId": "a"}]).status == "persisted"
    assert fake.sleeps == [7.0] and len(rx.posts) == 2


def test_503_waits_for_retry_delay_ms(fake: FakeTime) -> None:
    rx = Receiver(nack(503, "buffer_full", retryDelayMs=2500))
    producer(rx, fake, start_sequence=1).send_events([{"operation": "DELETE", "table": "t", "rowId": "a"}])
    assert fake.sleeps == [2.5]


def test_suggested_delay_holds_back_the_next_batch(fake: FakeTime) -> None:
    rx = Receiver(ack(1, suggestedDelayMs=1500))
    p = producer(rx, fake, start_sequence=1)
    assert p.send_events([{"operation": "DELETE", "table": "t", "rowId": "a"}]).suggested_delay_ms == 1500
    fake.now += 1.0  # time the caller spent on other work counts towards the delay
    p.send_events([{"operation": "DELETE", "table": "t", "rowId": "b"}])
    assert fake.sleeps == [0.5]


def test_connection_error_resends_the_same_batch_marked_as_retry(fake: FakeTime) -> None:
    rx = Receiver(httpx.ConnectError("refused"), httpx.ReadTimeout("slow"))
    p = producer(rx, fake, start_sequence=7)
    p.send_events([{"operation": "INSERT", "table": "t", "rowId": "a", "after": {"x": 1}}])
    first, *retries = rx.bodies()
    assert [(b["isRetry"], b["retryCount"]) for b in rx.bodies()] == [(False, 0), (True, 1), (True, 2)]
    assert all(b | {"isRetry": False, "retryCount": 0} == first for b in retries)
    assert fake.sleeps == [0.1, 0.2] and p.last_ack_sequence == 7


def test_duplicate_ack_is_success_and_the_number_moves_on(fake: FakeTime) -> None:
    rx = Receiver(httpx.ReadTimeout("lost ack"), ack(3, "duplicate"))
    p = producer(rx, fake, start_sequence=3)
    assert p.send_events([{"operation": "DELETE", "table": "t", "rowId": "a"}]).status == "duplicate"
    p.send_events([{"operation": "DELETE", "table": "t", "rowId": "b"}])
    assert [b["sequenceNumber"] for b in rx.bodies()] == [3, 3, 4] and p.last_ack_sequence == 4


def test_400_raises_naming_the_field_without_retrying(fake: FakeTime) -> None:
    bad = nack(400, "invalid_format", field="$.events[0].after", message="required for INSERT")
    rx = Receiver(bad)
    p = producer(rx, fake, start_sequence=5)
    with pytest.raises(ProducerError) as err:
        p.send_events([{"operation": "INSERT", "table": "t", "rowId": "a"}])
    e = err.value
    assert (e.reason, e.field, e.status_code, e.retryable) == ("invalid_format", "$.events[0].after", 400, False)
    assert e.events is not None and e.events[0]["rowId"] == "a" and len(rx.posts) == 1 and fake.sleeps == []
    # Nothing landed, so the next batch takes the rejected one's number.
    p.send_events([{"operation": "DELETE", "table": "t", "rowId": "a"}])
    assert rx.bodies()[-1]["sequenceNumber"] == 5


@pytest.mark.parametrize(
    ("reply", "reason"),
    [(nack(401, "unauthorized"), "unauthorized"), (nack(413, "payload_too_large", maxSize=10), "payload_too_large")],
)
def test_auth_and_size_rejections_are_final(fake: FakeTime, reply: httpx.Response, reason: str) -> None:
    rx = Receiver(reply)
    with pytest.raises(ProducerError, match=reason):
        producer(rx, fake, start_sequence=1).send_events([{"operation": "DELETE", "table": "t", "rowId": "a"}])
    assert len(rx.posts) == 1


def test_invalid_sequence_raises_with_the_expected_number(fake: FakeTime) -> None:
    rx = Receiver(nack(409, "invalid_sequence", expectedSequence=12))
    with pytest.raises(ProducerError) as err:
        producer(rx, fake, start_sequence=20).send_events([{"operation": "DELETE", "table": "t", "rowId": "a"}])
    assert err.value.reason == "invalid_sequence" and err.value.expected_sequence == 12


def test_exhausted_attempts_raise_and_keep_the_batch_for_the_next_flush(fake: FakeTime) -> None:
    rx = Receiver(*[httpx.Response(502, text="bad gateway")] * 4)
    p = producer(rx, fake, start_sequence=1)
    p.send("t", "DELETE", "a")
    with pytest.raises(ProducerError) as err:
        p.flush()
    assert err.value.retryable and err.value.reason == "http_502" and "4 attempts" in str(err.value)
    assert len(rx.posts) == 4 and fake.sleeps == [0.1, 0.2, 0.4] and p.pending_events == 1
    assert p.flush() == Ack(1, "persisted", 1, {}, 0)
    last = rx.bodies()[-1]
    assert (last["sequenceNumber"], last["isRetry"], last["retryCount"]) == (1, True, 4)


def test_backoff_is_capped_by_max_delay(fake: FakeTime) -> None:
    rx = Receiver(*[nack(503, "load_shedding")] * 5)
    producer(rx, fake, start_sequence=1, max_attempts=6, max_delay_s=0.3).send_events(
        [{"operation": "DELETE", "table": "t", "rowId": "a"}]
    )
    assert fake.sleeps == [0.1, 0.2, 0.3, 0.3, 0.3]


def test_resume_without_the_endpoint_asks_for_start_sequence(fake: FakeTime) -> None:
    client = httpx.Client(transport=httpx.MockTransport(lambda r: httpx.Response(404, text="Not Found")))
    p = Producer(URL, "src", http_client=client, sleep=fake.sleep, clock=fake.clock)
    with pytest.raises(ProducerError, match="start_sequence"):
        p.send_events([{"operation": "DELETE", "table": "t", "rowId": "a"}])


@pytest.mark.parametrize("codec", ["gzip", "zstd"])
def test_compressed_body(fake: FakeTime, codec: Any) -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        raw = request.content
        body = gzip.decompress(raw) if codec == "gzip" else zstandard.ZstdDecompressor().decompress(raw)
        return ack(json.loads(body)["sequenceNumber"])

    client = httpx.Client(transport=httpx.MockTransport(handler))
    p = Producer(URL, "src", compress=codec, start_sequence=1, http_client=client, sleep=fake.sleep)
    p.send_events([{"operation": "DELETE", "table": "t", "rowId": "a"}])
    assert seen[0].headers["content-encoding"] == codec


def test_request_flush_over_http_reports_without_retrying(fake: FakeTime) -> None:
    answers = [httpx.Response(202, json={"status": "triggered", "dag_run_id": "r1"}), httpx.Response(502, json={})]
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.path)
        return answers.pop(0)

    client = httpx.Client(transport=httpx.MockTransport(handler))
    p = Producer(URL, "src", start_sequence=1, http_client=client, sleep=fake.sleep)
    assert p.request_flush()["dag_run_id"] == "r1"
    with pytest.raises(ProducerError, match="HTTP 502"):
        p.request_flush()
    assert seen == ["/flush", "/flush"] and fake.sleeps == []


def vars_of(fake: FakeTime) -> dict[str, Any]:
    return {"sleep": fake.sleep, "clock": fake.clock, "rng": MaxJitter()}


class FakeWs:
    """A scripted /v1/stream: replies to connect with a status, acks batches, can drop once."""

    def __init__(self, last_ack: int | None) -> None:
        self.last_ack = last_ack
        self.drop_next_batch = True
        self.connects: list[tuple[str, dict[str, str]]] = []
        self.sent: list[dict[str, Any]] = []
        self.inbox: list[str] = []

    def connect(self, url: str, headers: dict[str, str], timeout_s: float) -> FakeWs:
        self.connects.append((url, headers))
        return self

    def send(self, message: str) -> None:
        msg = json.loads(message)
        self.sent.append(msg)
        if msg["type"] == "connect":
            self.inbox.append(json.dumps({"type": "status", "state": "idle", "lastAckSequence": self.last_ack}))
        elif msg["type"] == "cdc_batch" and self.drop_next_batch:
            self.drop_next_batch = False
        elif msg["type"] == "cdc_batch":
            self.inbox.append(json.dumps({"type": "status", "state": "receiving"}))
            self.inbox.append(json.dumps({"type": "ack", "sequenceNumber": msg["sequenceNumber"], "status": "ok"}))
        elif msg["type"] == "flush_request":
            self.inbox.append(json.dumps({"type": "status", "state": "idle", "flush": {"dag_run_id": "r1"}}))

    def recv(self, timeout: float | None = None) -> str:
        if not self.inbox:
            raise ConnectionClosedError(None, None)
        return self.inbox.pop(0)

    def close(self) -> None:
        self.inbox.clear()


def test_websocket_resumes_reconnects_and_resends(fake: FakeTime) -> None:
    ws = FakeWs(last_ack=4)
    p = Producer("https://rx.test/base/", "src", transport="ws", token="t", ws_connect=ws.connect, **vars_of(fake))
    ack1 = p.send_events([{"operation": "DELETE", "table": "t", "rowId": "a", "sequence": 9, "timestamp": 1}])
    assert p.request_flush() == {"dag_run_id": "r1"}
    assert ack1.sequence_number == 5 and p.last_ack_sequence == 5
    assert ws.connects == [("wss://rx.test/base/v1/stream", {"Authorization": "Bearer t"})] * 2
    kinds = [m["type"] for m in ws.sent]
    assert kinds == ["connect", "cdc_batch", "connect", "cdc_batch", "flush_request"]
    assert ws.sent[2]["lastAckSequence"] == 4 and ws.sent[0]["sourceDoId"] == "src"
    first, again = ws.sent[1], ws.sent[3]
    assert (first["isRetry"], again["isRetry"], again["retryCount"]) == (False, True, 1)
    assert first["events"] == again["events"] and first["sequenceNumber"] == again["sequenceNumber"] == 5
    assert (first["firstEventSequence"], first["lastEventSequence"]) == (9, 9)


def test_ws_url() -> None:
    assert ws_url("http://h:1") == "ws://h:1/v1/stream"
    assert ws_url("ws://h:1/x") == "ws://h:1/x/v1/stream"


def test_receiver_urls_from_a_string_a_comma_list_or_a_sequence() -> None:
    assert Producer("http://a:1/", "src").urls == ("http://a:1",)
    p = Producer(" http://a:1 , https://b.example/base/ ", "src")
    assert p.urls == ("http://a:1", "https://b.example/base") and p.url == "http://a:1" and p.failovers == 0
    assert Producer(["http://a:1", "http://b:2"], "src").urls == ("http://a:1", "http://b:2")
    assert Producer("ws://a:1", "src", transport="ws").url == "ws://a:1"


@pytest.mark.parametrize(
    ("url", "bad"),
    [
        ("", ""),
        ([], None),
        ("a:1", "a:1"),
        ("127.0.0.1:8090", "127.0.0.1:8090"),
        ("http://", "http://"),
        ("ftp://a", "ftp://a"),
        ("ws://a:1", "ws://a:1"),  # HTTP transport
        ("http://a:port", "http://a:port"),
        ("http://a:1,,http://b:2", ""),
        (["http://a:1", "http://b:2?x=1"], "http://b:2?x=1"),
    ],
)
def test_a_bad_receiver_url_is_a_value_error_naming_it(url: Any, bad: str | None) -> None:
    with pytest.raises(ValueError) as err:
        Producer(url, "src")
    text = str(err.value)
    assert (f"receiver URL {bad!r}" if bad is not None else "no receiver URL") in text and repr(url) in text


A, B = "http://a.test", "http://b.test"


class Replicas:
    """Routes each request to the scripted Receiver of its host; they share ``last_ack``."""

    def __init__(self, **by_host: Callable[[httpx.Request], httpx.Response]) -> None:
        self.by_host = by_host
        self.order: list[str] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        host = request.url.host.split(".")[0]
        self.order.append(host)
        return self.by_host[host](request)


def one_event(p: Producer, row: str = "a") -> Ack:
    return p.send_events([{"operation": "DELETE", "table": "t", "rowId": row}])


def test_connection_error_fails_over_to_the_next_replica_with_the_same_batch(fake: FakeTime) -> None:
    a, b = Receiver(httpx.ConnectError("refused")), Receiver()
    rx = Replicas(a=a, b=b)
    p = producer(rx, fake, url=f"{A},{B}", start_sequence=7)
    assert one_event(p).sequence_number == 7 and one_event(p, "b").sequence_number == 8
    assert rx.order == ["a", "b", "b"] and p.url == B and p.failovers == 1
    first, again = a.bodies()[0], b.bodies()[0]
    assert again == first | {"isRetry": True, "retryCount": 1}
    assert fake.sleeps == [0.1]  # a switch is an attempt and waits the usual backoff


def refused(request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectError("refused")


def test_resumption_fails_over_too(fake: FakeTime) -> None:
    rx = Replicas(a=refused, b=Receiver(last_ack=41))
    p = producer(rx, fake, url=[A, B])
    assert one_event(p).sequence_number == 42 and p.failovers == 1 and rx.order == ["a", "b", "b"]


@pytest.mark.parametrize(
    ("reply", "switches", "sleep"),
    [
        # Backpressure from a healthy replica: stay and honour its delay.
        (nack(503, "buffer_full", retryDelayMs=2500), False, 2.5),
        (nack(503, "internal_error", headers={"Retry-After": "1"}, retryDelayMs=1000), False, 1.0),
        (nack(503, "load_shedding"), False, 0.1),
        (nack(429, "rate_limited", headers={"Retry-After": "3"}), False, 3.0),
        (nack(429, "connection_limit", retryDelayMs=100), False, 0.1),
        # The replica is going away, or a proxy found none behind it: next replica, usual backoff.
        (nack(503, "shutting_down", headers={"Retry-After": "1"}, retryDelayMs=1000), True, 0.1),
        (httpx.Response(502, text="Bad Gateway"), True, 0.1),
        (httpx.Response(503, text="<html>no healthy upstream</html>"), True, 0.1),
        (httpx.Response(504, text="Gateway Timeout"), True, 0.1),
        (httpx.ReadTimeout("no answer"), True, 0.1),
        (httpx.RemoteProtocolError("peer closed"), True, 0.1),
    ],
)
def test_which_failures_switch_replicas(fake: FakeTime, reply: Reply, switches: bool, sleep: float) -> None:
    rx = Replicas(a=Receiver(reply), b=Receiver())
    p = producer(rx, fake, url=[A, B], start_sequence=1)
    assert one_event(p).status == "persisted"
    assert rx.order == (["a", "b"] if switches else ["a", "a"])
    assert (p.url, p.failovers) == ((B, 1) if switches else (A, 0)) and fake.sleeps == [sleep]


def test_replicas_are_tried_round_robin_within_max_attempts(fake: FakeTime) -> None:
    rx = Replicas(a=refused, b=refused, c=refused)
    p = producer(rx, fake, url="http://a.test,http://b.test,http://c.test", start_sequence=1, max_attempts=4)
    p.send("t", "DELETE", "x")
    with pytest.raises(ProducerError) as err:
        p.flush()
    assert err.value.retryable and "4 attempts" in str(err.value)
    assert rx.order == ["a", "b", "c", "a"] and fake.sleeps == [0.1, 0.2, 0.4]
    # The last failure moved on too: the next flush starts on b, which answers now.
    rx.by_host["b"] = Receiver()
    assert p.url == "http://b.test" and p.failovers == 4
    assert p.flush() == Ack(1, "persisted", 1, {}, 0) and rx.order[-1] == "b"


def test_one_replica_retries_in_place_without_counting_failovers(fake: FakeTime) -> None:
    rx = Receiver(nack(503, "shutting_down", retryDelayMs=1000), httpx.ConnectError("refused"))
    p = producer(rx, fake, start_sequence=1)
    one_event(p)
    assert p.failovers == 0 and p.url == URL and fake.sleeps == [1.0, 0.2]


def test_websocket_fails_over_and_resumes_on_the_other_replica(fake: FakeTime) -> None:
    a, b = FakeWs(last_ack=4), FakeWs(last_ack=4)
    a.drop_next_batch, b.drop_next_batch = True, False
    by_url = {"ws://a.test/v1/stream": a, "ws://b.test/v1/stream": b}

    def connect(url: str, headers: dict[str, str], timeout_s: float) -> FakeWs:
        return by_url[url].connect(url, headers, timeout_s)

    p = Producer([A, B], "src", transport="ws", ws_connect=connect, **vars_of(fake))
    assert one_event(p).sequence_number == 5 and (p.url, p.failovers) == (B, 1)
    assert [m["type"] for m in a.sent] == ["connect", "cdc_batch"]
    assert [m["type"] for m in b.sent] == ["connect", "cdc_batch"]
    assert b.sent[0]["lastAckSequence"] == 4
    assert b.sent[1]["events"] == a.sent[1]["events"] and b.sent[1]["sequenceNumber"] == 5
    assert b.sent[1]["retryCount"] == 1


@pytest.fixture()
def live_receiver(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    settings = make_settings(tmp_path)
    with serve_app(create_app(settings), timeout_s=10) as url:
        yield url, settings.staging_dir


@pytest.mark.server
def test_three_batches_land_in_staging_of_the_real_receiver(live_receiver: tuple[str, Path]) -> None:
    url, staging_dir = live_receiver
    acks: list[Ack] = []
    with Producer(url, "it-src", batch_size=4, start_sequence=1, start_event_sequence=1, on_ack=acks.append) as p:
        for i in range(10):
            p.send("orders" if i % 2 else "users", "INSERT", f"r{i}", after={"id": i})
        p.send("users", "DELETE", "r0", before={"id": 0})
        p.send("users", "UPDATE", "r2", after={"id": 2, "v": "x"})
    assert [(a.sequence_number, a.status, a.events) for a in acks] == [(n, "persisted", 4) for n in (1, 2, 3)]
    store = staging.LocalStaging(staging_dir)
    landed = [json.loads(line) for t in store.tables() for k in store.list(t) for line in store.get(k).splitlines()]
    assert sorted(store.tables()) == ["orders", "users"]
    assert sorted(e["sequence"] for e in landed) == list(range(1, 13))
    assert {e["batchSequence"] for e in landed} == {1, 2, 3}
    assert next(e for e in landed if e["sequence"] == 11) | {"timestamp": 0} == {
        "source": "it-src",
        "batchSequence": 3,
        "sequence": 11,
        "timestamp": 0,
        "operation": "DELETE",
        "rowId": "r0",
        "before": {"id": 0},
    }
    # A new producer asks the receiver (GET /v1/sources) where this source stands.
    with Producer(url, "it-src", start_event_sequence=13) as again:
        assert again.send_events([{"operation": "DELETE", "table": "users", "rowId": "r1"}]).sequence_number == 4


class ThreadReplica:
    """A receiver replica: uvicorn in a thread on a free 127.0.0.1 port. ``stop`` takes the path
    of SIGTERM (refuse with ``shutting_down``, finish what is landing, close connections)."""

    def __init__(self, settings: Settings) -> None:
        port = free_port()
        config = uvicorn.Config(
            create_app(settings), host="127.0.0.1", port=port, log_level="warning", timeout_graceful_shutdown=10
        )
        self.server = ReceiverServer(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert self.thread.is_alive() and time.monotonic() < deadline, "receiver did not start"
            time.sleep(0.01)

    def stop(self) -> None:
        self.server.handle_exit(signal.SIGTERM, None)
        self.thread.join(20)
        assert not self.thread.is_alive(), "receiver did not stop"


class ProcessReplica:
    """A receiver replica as its own process (``python -m receiver``); ``stop`` is kill -9."""

    def __init__(self, settings: Settings, log: Path) -> None:
        port = free_port()
        env = {**os.environ, **make_settings(settings.home, receiver_port=port, rate_limit_per_s=0.0).as_env()}
        with log.open("ab") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "receiver"], env=env, stdout=subprocess.DEVNULL, stderr=err
            )
        self.url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            assert self.proc.poll() is None and time.monotonic() < deadline, "receiver did not start"
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.05)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)  # reaped: the survivor sees its claims' owner is gone and takes them over


EVENTS_PER_BATCH = 5


def produce_until(
    p: Producer, stopped: threading.Event, acked: dict[int, set[int]], errors: list[BaseException]
) -> None:
    """Send batches without pause until 30 were acked after ``stopped`` (or 20 s passed)."""
    try:
        with p:
            n, after_stop, deadline = 0, 0, time.monotonic() + 20
            while after_stop < 30 and time.monotonic() < deadline:
                events: list[dict[str, Any]] = [
                    {"sequence": n + i, "operation": "INSERT", "table": "items", "rowId": str(n + i), "after": {"n": n}}
                    for i in range(EVENTS_PER_BATCH)
                ]
                ack = p.send_events(events)
                acked[ack.sequence_number] = {e["sequence"] for e in events}
                n += EVENTS_PER_BATCH
                after_stop += stopped.is_set()
    except BaseException as exc:  # surfaced by the test thread
        errors.append(exc)


@pytest.mark.parametrize("how", ["sigterm", "kill -9"])
@pytest.mark.server
def test_a_replica_stopped_under_load_fails_over_and_loses_nothing(tmp_path: Path, how: str) -> None:
    settings = make_settings(tmp_path, rate_limit_per_s=0.0)  # one home: both replicas share staging
    started: list[ThreadReplica | ProcessReplica] = []
    try:
        first = ThreadReplica(settings) if how == "sigterm" else ProcessReplica(settings, tmp_path / "first.log")
        started.append(first)
        second = ThreadReplica(settings)
        started.append(second)
        stopped = threading.Event()
        acked: dict[str, dict[int, set[int]]] = {"fo-http": {}, "fo-ws": {}}
        errors: list[BaseException] = []
        kw: dict[str, Any] = {"start_sequence": 1, "max_attempts": 50, "base_delay_s": 0.02, "max_delay_s": 0.2}
        producers = {
            src: Producer([first.url, second.url], src, transport=tr, timeout_s=5.0, **kw)  # type: ignore[arg-type]
            for src, tr in (("fo-http", "http"), ("fo-ws", "ws"))
        }
        threads = [
            threading.Thread(target=produce_until, args=(producers[src], stopped, acked[src], errors))
            for src in producers
        ]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 20
        while min(len(a) for a in acked.values()) < 20:  # both mid-stream on the first replica
            assert not errors and time.monotonic() < deadline, errors or "producers are not getting acks"
            time.sleep(0.01)
        first.stop()
        started.remove(first)
        stopped.set()
        for t in threads:
            t.join(60)
        assert not any(t.is_alive() for t in threads), "a producer did not finish"
        assert not errors, errors
    finally:
        for replica in started:
            replica.stop()

    for p in producers.values():
        assert p.url == second.url and p.failovers == 1, (p.source, p.failovers)
    store = staging.LocalStaging(settings.staging_dir)
    landed = Counter(
        (e["source"], e["batchSequence"], e["sequence"])
        for k in store.list("items")
        for e in map(json.loads, store.get(k).splitlines())
    )
    assert max(landed.values()) == 1, [k for k, n in landed.items() if n > 1][:5]  # nothing twice
    for src, batches in acked.items():
        assert sorted(batches) == list(range(1, len(batches) + 1)) and len(batches) >= 50
        # Every acked event is in staging, under its batch; nothing else of this source is.
        assert {(b, s) for (source, b, s) in landed if source == src} == {
            (b, s) for b, seqs in batches.items() for s in seqs
        }
