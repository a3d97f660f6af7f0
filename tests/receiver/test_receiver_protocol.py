"""The producer protocol over the real Starlette app (in-process ASGI): idempotency, sequence
rules, encodings, limits, auth, rate limits, backpressure, WebSocket, operations endpoints."""

from __future__ import annotations

import gzip
import hashlib
import json
import time
from pathlib import Path
from typing import Any, cast

import msgspec
import pytest
import zstandard
from starlette.applications import Starlette
from starlette.testclient import TestClient

from cdclake import staging
from cdclake.staging import Receipt
from receiver.app import create_app
from receiver.claim import IN_FLIGHT_S
from tests.support import make_settings


def ev(seq: int, table: str = "users", row: str | None = None, op: str = "INSERT", **after: Any) -> dict[str, Any]:
    e: dict[str, Any] = {"sequence": seq, "timestamp": 1_767_225_600_000 + seq, "operation": op, "table": table}
    e["rowId"] = row or str(seq)
    if op != "DELETE":
        e["after"] = {"id": int(e["rowId"]) if e["rowId"].isdigit() else e["rowId"], **after}
    return e


def batch(seq: int, *evs: dict[str, Any], source: str = "app-1") -> dict[str, Any]:
    return {"source": source, "sequenceNumber": seq, "events": list(evs) or [ev(seq)]}


def objects(root: Path) -> list[staging.ObjectKey]:
    store = staging.LocalStaging(root)
    return [k for t in store.tables() for k in store.list(t)]


def staged_lines(root: Path) -> list[dict[str, Any]]:
    store = staging.LocalStaging(root)
    return [json.loads(x) | {"table": k.table} for k in objects(root) for x in store.get(k).splitlines()]


@pytest.fixture()
def home(tmp_path: Path) -> Path:
    return tmp_path


def client_for(home: Path, **over: Any) -> TestClient:
    over.setdefault("rate_limit_per_s", 0.0)
    return TestClient(create_app(make_settings(home, **over)))


# --------------------------------------------------------------------------- idempotency


def test_resent_batch_is_acked_duplicate_and_lands_nothing_new_also_after_a_restart(home: Path) -> None:
    with client_for(home) as c:
        first = c.post("/v1/batches", json=batch(1, ev(1), ev(2, "orders")))
        again = c.post("/v1/batches", json=batch(1, ev(1), ev(2, "orders")))
    assert first.json()["status"] == "persisted"
    assert again.status_code == 200 and again.json()["status"] == "duplicate"
    assert again.json()["details"]["persistedPaths"] == first.json()["details"]["persistedPaths"]
    with client_for(home) as c:  # a new process: only what is on disk
        after_restart = c.post("/v1/batches", json=batch(1, ev(1), ev(2, "orders")))
        nxt = c.post("/v1/batches", json=batch(2))
    assert after_restart.json()["status"] == "duplicate"
    assert nxt.json()["status"] == "persisted"
    assert len(objects(home / "staging")) == 3
    assert sorted(e["sequence"] for e in staged_lines(home / "staging")) == [1, 2, 2]


def test_gap_and_regression_get_invalid_sequence_with_the_expected_value(home: Path) -> None:
    with client_for(home) as c:
        assert c.post("/v1/batches", json=batch(5)).status_code == 200  # a producer may start anywhere
        gap = c.post("/v1/batches", json=batch(7))
        below = c.post("/v1/batches", json=batch(3))
        reuse = c.post("/v1/batches", json=batch(5, ev(99)))
        ok = c.post("/v1/batches", json=batch(6))
    for r in (gap, below):
        assert r.status_code == 409, r.text
        assert r.json()["reason"] == "invalid_sequence" and r.json()["expectedSequence"] == 6
    assert reuse.status_code == 409 and "different events" in reuse.json()["errorMessage"]
    assert ok.json()["status"] == "persisted"
    assert sorted(e["batchSequence"] for e in staged_lines(home / "staging")) == [5, 6]


def test_dead_claim_is_taken_over_without_landing_twice(home: Path) -> None:
    """A receiver died after claiming batch 2 and writing one of its two objects."""
    root = home / "staging"
    with client_for(home) as c:
        c.post("/v1/batches", json=batch(1))
    store = staging.LocalStaging(root)
    b2 = batch(2, ev(10, "users"), ev(11, "orders"))
    from cdclake.contracts.events import decode_batch
    from receiver.prepared import Prepared

    p = Prepared.from_batch(decode_batch(json.dumps(b2).encode()))
    old_ms = int((time.time() - IN_FLIGHT_S - 5) * 1000)
    keys = [staging.make_key(t, "app-1", 2, old_ms) for t in sorted(p.objects)]
    receipt = Receipt("app-1", 2, 0, old_ms, p.digest, p.events, [k.path for k in keys])
    assert store.put_if_absent(staging.receipt_path("app-1", 2), msgspec.json.encode(receipt))
    store.put(keys[0], p.objects[keys[0].table])  # "orders" written, "users" not
    with client_for(home) as c:
        r = c.post("/v1/batches", json=b2)
        again = c.post("/v1/batches", json=b2)
    assert r.json()["status"] == "persisted" and again.json()["status"] == "duplicate"
    lines = staged_lines(root)
    assert sorted((e["table"], e["sequence"]) for e in lines if e["batchSequence"] == 2) == [
        ("orders", 11),
        ("users", 10),
    ]
    users_key = next(k for k in objects(root) if k.table == "users" and k.batch_sequence == 2)
    assert users_key.landed_ms > old_ms  # the missing object got a fresh name
    assert store.exists(staging.receipt_path("app-1", 2, 1))


def test_young_claim_of_another_replica_gets_a_retryable_503(home: Path) -> None:
    store = staging.LocalStaging(home / "staging")
    b1 = batch(1)
    from cdclake.contracts.events import decode_batch
    from receiver.prepared import Prepared

    p = Prepared.from_batch(decode_batch(json.dumps(b1).encode()))
    now = int(time.time() * 1000)
    key = staging.make_key("users", "app-1", 1, now)
    store.put_if_absent(
        staging.receipt_path("app-1", 1), msgspec.json.encode(Receipt("app-1", 1, 0, now, p.digest, 1, [key.path]))
    )
    with client_for(home) as c:
        r = c.post("/v1/batches", json=b1)
    assert r.status_code == 503 and r.json()["shouldRetry"] is True and r.headers["retry-after"] == "1"
    assert objects(home / "staging") == []


# --------------------------------------------------------------------------- formats


def test_ndjson_with_headers_or_query_and_compressed_bodies(home: Path) -> None:
    nd = b"\n".join(json.dumps(ev(i)).encode() for i in (1, 2, 3)) + b"\n"
    with client_for(home) as c:
        h = {"Content-Type": "application/x-ndjson", "X-CDC-Source": "nd-1", "X-CDC-Sequence-Number": "1"}
        r1 = c.post("/v1/batches", content=nd, headers=h)
        r2 = c.post(
            "/v1/batches?source=nd-1&sequenceNumber=2",
            content=gzip.compress(json.dumps(ev(4)).encode()),
            headers={"Content-Type": "application/x-ndjson", "Content-Encoding": "gzip"},
        )
        r3 = c.post(
            "/v1/batches",
            content=zstandard.ZstdCompressor().compress(json.dumps(batch(3, ev(5), source="nd-1")).encode()),
            headers={"Content-Type": "application/json", "Content-Encoding": "zstd"},
        )
        missing = c.post("/v1/batches", content=nd, headers={"Content-Type": "application/x-ndjson"})
        badline = c.post(
            "/v1/batches?source=nd-1&sequenceNumber=4",
            content=b'{"sequence": 9, "timestamp": 1, "operation": "INSERT", "table": "t", "rowId": "1"}\n',
            headers={"Content-Type": "application/x-ndjson"},
        )
    assert [r.json()["status"] for r in (r1, r2, r3)] == ["persisted"] * 3
    assert sorted(e["sequence"] for e in staged_lines(home / "staging")) == [1, 2, 3, 4, 5]
    assert missing.status_code == 400 and missing.json()["field"] == "source"
    assert badline.status_code == 400 and badline.json()["field"] == "$.events[0].after"


def test_bad_encodings_and_bombs_are_refused(home: Path) -> None:
    with client_for(home, max_body_bytes=64 * 1024) as c:
        bad_gzip = c.post("/v1/batches", content=b"not gzip", headers={"Content-Encoding": "gzip"})
        bad_zstd = c.post("/v1/batches", content=b"not zstd", headers={"Content-Encoding": "zstd"})
        bomb = c.post("/v1/batches", content=gzip.compress(b" " * 10_000_000), headers={"Content-Encoding": "gzip"})
        br = c.post("/v1/batches", content=b"{}", headers={"Content-Encoding": "br"})
        ctype = c.post("/v1/batches", content=b"{}", headers={"Content-Type": "text/csv"})
    assert bad_gzip.status_code == 400 and bad_gzip.json()["field"] == "Content-Encoding"
    assert bad_zstd.status_code == 400 and bad_zstd.json()["field"] == "Content-Encoding"
    assert bomb.status_code == 413 and bomb.json()["maxSize"] == 64 * 1024
    assert br.status_code == 415 and ctype.status_code == 415
    assert objects(home / "staging") == []


def test_event_over_the_event_limit_is_named(home: Path) -> None:
    with client_for(home, max_event_bytes=1024) as c:
        r = c.post("/v1/batches", json=batch(1, ev(1), ev(2, blob="x" * 2000)))
        nd = c.post(
            "/v1/batches?source=a&sequenceNumber=1",
            content=json.dumps(ev(2, blob="x" * 2000)).encode(),
            headers={"Content-Type": "application/x-ndjson"},
        )
    for x in (r, nd):
        assert x.status_code == 413 and x.json()["reason"] == "event_too_large"
        assert x.json()["maxSize"] == 1024 and "CDCLAKE_MAX_EVENT_BYTES" in x.json()["errorMessage"]
    assert r.json()["field"] == "$.events[1]"
    assert objects(home / "staging") == []


def test_declared_oversized_body_is_refused_before_it_is_read(home: Path) -> None:
    sent = []

    def body() -> Any:
        for _ in range(100):
            sent.append(1)
            yield b" " * 65536

    with client_for(home, max_body_bytes=64 * 1024) as c:
        r = c.post("/v1/batches", content=body(), headers={"Content-Length": str(100 * 65536)})
    assert r.status_code == 413 and r.json()["reason"] == "payload_too_large"


# --------------------------------------------------------------------------- protection


def tokens_file(home: Path) -> Path:
    p = home / "tokens.toml"
    digest = hashlib.sha256(b"secret-b").hexdigest()
    p.write_text(
        '[[producer]]\nid = "app-1"\ntoken = "secret-a"\ntables = ["users"]\n\n'
        f'[[producer]]\nid = "app-2"\ntoken_sha256 = "{digest}"\ntables = ["*"]\n'
    )
    return p


@pytest.mark.parametrize(
    ("token", "body", "status", "field"),
    [
        (None, batch(1), 401, "Authorization"),
        ("wrong", batch(1), 401, "Authorization"),
        ("secret-a", batch(1, ev(1, "orders")), 403, "$.events[0].table"),
        ("secret-a", batch(1, source="app-2"), 403, "$.source"),
        ("secret-a", batch(1, ev(1, "users")), 200, None),
        ("secret-b", batch(1, ev(1, "anything"), source="app-2"), 200, None),
    ],
)
def test_auth_matrix(home: Path, token: str | None, body: dict[str, Any], status: int, field: str | None) -> None:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with client_for(home, tokens_file=tokens_file(home)) as c:
        r = c.post("/v1/batches", json=body, headers=headers)
    assert r.status_code == status, r.text
    if field:
        assert r.json()["field"] == field
        assert objects(home / "staging") == []
    else:
        assert r.json()["status"] == "persisted"


def test_token_bucket_gives_429_with_retry_after_and_rate_limit_headers(home: Path) -> None:
    with client_for(home, rate_limit_burst=3, rate_limit_per_s=0.5) as c:
        answers = [c.post("/v1/batches", json=batch(n)) for n in (1, 2, 3, 4)]
    assert [a.status_code for a in answers] == [200, 200, 200, 429]
    limited = answers[3]
    assert limited.json()["reason"] == "rate_limited" and limited.json()["shouldRetry"] is True
    assert int(limited.headers["Retry-After"]) >= 1
    assert limited.headers["X-RateLimit-Limit"] == "3" and limited.headers["X-RateLimit-Remaining"] == "0"
    assert int(answers[0].headers["X-RateLimit-Remaining"]) == 2
    assert len(objects(home / "staging")) == 3


def test_backlog_brings_suggested_delay_then_buffer_full(home: Path) -> None:
    # One producer: its share of the backlog (a quarter by default) is the whole of it here.
    with client_for(home, backlog_soft=1, backlog_hard=3, backlog_per_source=3) as c:
        answers = [c.post("/v1/batches", json=batch(n)) for n in (1, 2, 3, 4)]
    assert "suggestedDelayMs" not in answers[0].json()["details"]
    assert answers[1].json()["details"]["suggestedDelayMs"] > 0
    assert answers[2].json()["details"]["bufferUtilization"] == 1.0
    assert answers[3].status_code == 503 and answers[3].json()["reason"] == "buffer_full"
    assert "CDCLAKE_BACKLOG_HARD" in answers[3].json()["errorMessage"]


# --------------------------------------------------------------------------- WebSocket


def test_websocket_protocol(home: Path) -> None:
    with client_for(home) as c:
        c.post("/v1/batches", json=batch(1, source="ws-1"))
        with c.websocket_connect("/v1/stream") as ws:
            ws.send_json(
                {
                    "type": "connect",
                    "sourceDoId": "ws-1",
                    "lastAckSequence": 0,
                    "protocolVersion": 1,
                    "capabilities": {
                        "binaryProtocol": False,
                        "compression": False,
                        "batching": True,
                        "maxBatchSize": 1000,
                        "maxMessageSize": 4194304,
                    },
                }
            )
            st = ws.receive_json()
            assert st["type"] == "status" and st["lastAckSequence"] == 1
            msg = {
                "type": "cdc_batch",
                "sourceDoId": "ws-1",
                "sequenceNumber": 2,
                "events": [ev(2)],
                "correlationId": "c-2",
                "isRetry": False,
                "retryCount": 0,
            }
            ws.send_json(msg)
            a = ws.receive_json()
            assert (a["type"], a["status"], a["sequenceNumber"], a["correlationId"]) == ("ack", "persisted", 2, "c-2")
            ws.send_json(msg | {"isRetry": True, "retryCount": 1})
            assert ws.receive_json()["status"] == "duplicate"
            ws.send_json(msg | {"sequenceNumber": 9, "events": [ev(9)]})
            n = ws.receive_json()
            assert (n["type"], n["reason"], n["expectedSequence"]) == ("nack", "invalid_sequence", 3)
            ws.send_json({"type": "cdc_batch", "sourceDoId": "ws-1", "sequenceNumber": 3, "events": [{"sequence": 1}]})
            bad = ws.receive_json()
            assert bad["reason"] == "invalid_format" and bad["field"].startswith("$.events[0]")
            assert bad["sequenceNumber"] == 3
            ws.send_json({"type": "bogus"})
            assert ws.receive_json()["field"] == "$.type"
            ws.send_text("not json")
            assert ws.receive_json()["reason"] == "invalid_format"
            ws.send_json({"type": "heartbeat", "sourceDoId": "ws-1", "lastAckSequence": 2, "pendingEvents": 0})
            assert ws.receive_json()["type"] == "status"
    assert sorted(e["batchSequence"] for e in staged_lines(home / "staging")) == [1, 2]


def test_websocket_connection_limit_and_auth(home: Path) -> None:
    with client_for(home, max_connections_per_source=1, tokens_file=tokens_file(home)) as c:
        with c.websocket_connect("/v1/stream") as ws:
            r = ws.receive_json()
            assert r["reason"] == "invalid_format" and r["field"] == "Authorization"
        auth = {"Authorization": "Bearer secret-a"}
        with c.websocket_connect("/v1/stream", headers=auth) as first:
            first.send_json({"type": "connect", "sourceDoId": "app-1"})
            assert first.receive_json()["type"] == "status"
            with c.websocket_connect("/v1/stream", headers=auth) as second:
                second.send_json({"type": "connect", "sourceDoId": "app-1"})
                r = second.receive_json()
                assert r["reason"] == "connection_limit" and r["shouldRetry"] is True
            first.send_json(
                {"type": "cdc_batch", "sourceDoId": "app-1", "sequenceNumber": 1, "events": [ev(1, "orders")]}
            )
            denied = first.receive_json()
            assert denied["type"] == "nack" and denied["field"] == "$.events[0].table"


# --------------------------------------------------------------------------- operations


def test_operations_endpoints(home: Path) -> None:
    with client_for(home) as c:
        c.post("/v1/batches", json=batch(1, ev(1), ev(2, "orders")))
        c.post("/v1/batches", json=batch(1, ev(1), ev(2, "orders")))
        c.post("/v1/batches", json=batch(9))
        assert c.get("/health").json() == {"status": "ok"}
        assert c.get("/ready").json()["status"] == "ready"
        assert c.get("/v1/sources/app-1").json() == {"source": "app-1", "lastAckSequence": 1}
        assert c.get("/v1/sources/nobody").json()["lastAckSequence"] is None
        st = c.get("/status").json()
        assert st["backlog"]["objects"] == 2 and st["lastLandingTime"] is not None
        text = c.get("/metrics").text
        doc = c.get("/openapi.json").json()
        flush = c.post("/flush")
    assert 'cdclake_receiver_acks_total{status="persisted"} 1' in text
    assert 'cdclake_receiver_acks_total{status="duplicate"} 1' in text
    assert 'cdclake_receiver_nacks_total{reason="invalid_sequence"} 1' in text
    assert "cdclake_receiver_events_total 2" in text
    assert 'cdclake_receiver_landing_seconds_count{transport="http"} 2' in text
    assert doc["openapi"].startswith("3.1") and "/v1/batches" in doc["paths"]
    assert "Batch" in doc["components"]["schemas"]
    # No Airflow credentials configured: says so rather than pretending.
    assert flush.status_code == 502 and "CDCLAKE_AIRFLOW_PASSWORD" in flush.json()["message"]


def test_shutting_down_refuses_new_batches_with_a_retryable_503(home: Path) -> None:
    with client_for(home) as c:
        cast(Starlette, c.app).state.service.shutting_down = True  # what the server's signal handler sets first
        r = c.post("/v1/batches", json=batch(1))
        ready = c.get("/ready")
    assert r.status_code == 503 and r.json()["reason"] == "shutting_down" and r.json()["shouldRetry"] is True
    assert ready.status_code == 503
    assert objects(home / "staging") == []


def test_logs_are_one_json_object_per_line() -> None:
    import logging

    from cdclake.service.logs import JsonFormatter

    rec = logging.LogRecord("cdclake.receiver", logging.INFO, __file__, 1, "batch landed", None, None)
    rec.source, rec.sequenceNumber = "app-1", 7
    line = JsonFormatter().format(rec)
    assert "\n" not in line
    out = json.loads(line)
    assert out["msg"] == "batch landed" and out["source"] == "app-1" and out["sequenceNumber"] == 7
    assert out["level"] == "info" and out["ts"].endswith("Z")
