"""Schema-driven fuzzing of the receiver (hypothesis, derandomized): thousands of malformed and
mutated requests over HTTP and WebSocket. No 5xx, every refusal names its field or limit, and
nothing a refusal answered lands in staging."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path
from typing import Any

import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from receiver.app import create_app
from receiver.protocol import NACK_REASONS
from tests.support import make_settings

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False),
    st.text(max_size=20),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12,
)
tables = st.sampled_from(["users", "orders", "Bad-Name", "", "x" * 200, "t__changes", "_ok"])
ops = st.sampled_from(["INSERT", "UPDATE", "DELETE", "UPSERT", "insert", ""])


@st.composite
def events(draw: st.DrawFn) -> dict[str, Any]:
    e: dict[str, Any] = {
        "sequence": draw(st.one_of(st.integers(min_value=-5, max_value=2**64), st.text(max_size=3))),
        "timestamp": draw(st.integers(min_value=-1, max_value=2**63)),
        "operation": draw(ops),
        "table": draw(tables),
        "rowId": draw(st.one_of(st.text(max_size=5), st.integers())),
    }
    if draw(st.booleans()):
        e["after"] = draw(st.one_of(st.dictionaries(st.text(max_size=5), json_scalars, max_size=3), json_values))
    if draw(st.booleans()):
        e["before"] = draw(json_values)
    for k in draw(st.lists(st.sampled_from(list(e)), max_size=2)):
        e.pop(k, None)
    return e


@st.composite
def batches(draw: st.DrawFn) -> Any:
    b: dict[str, Any] = {
        "source": draw(st.sampled_from(["fz", "fz-2", "", "bad source", 7])),
        "sequenceNumber": draw(st.one_of(st.integers(min_value=-3, max_value=2**64), st.none())),
        "events": draw(st.lists(events(), max_size=3)),
    }
    for k in draw(st.lists(st.sampled_from(list(b)), max_size=1)):
        b.pop(k)
    return b


debezium = st.fixed_dictionaries(
    {
        "op": st.sampled_from(["c", "u", "d", "r", "t", "x"]),
        "ts_ms": st.integers(min_value=-1, max_value=2**63),
        "source": st.one_of(json_values, st.fixed_dictionaries({"table": tables, "name": st.text(max_size=4)})),
        "after": st.one_of(st.none(), st.dictionaries(st.sampled_from(["id", "name"]), json_scalars, max_size=2)),
    }
)

bodies = st.one_of(
    batches().map(lambda b: json.dumps(b).encode()),
    json_values.map(lambda v: json.dumps(v).encode()),
    debezium.map(lambda v: json.dumps({"schema": None, "payload": v}).encode()),
    st.binary(max_size=200),
)
ctypes = st.sampled_from(["application/json", "application/x-ndjson", "application/vnd.debezium+json", "", "text/csv"])
encodings = st.sampled_from([None, None, "gzip", "zstd", "br", "gzip-bad"])


def staged_files(root: Path) -> int:
    return sum(len(files) for _, _, files in os.walk(root))


def check_refusal(status: int, body: dict[str, Any]) -> None:
    assert status < 500 or body.get("reason") in ("buffer_full", "internal_error", "shutting_down"), (status, body)
    assert status < 500, body
    assert body["type"] == "nack" and body["reason"] in NACK_REASONS, body
    named = body.get("field") or body.get("maxSize") or "CDCLAKE_" in body["errorMessage"]
    assert named, f"refusal names neither field nor limit: {body}"


@pytest.fixture(scope="module")
def fuzz_client(tmp_path_factory: pytest.TempPathFactory) -> Any:
    home = tmp_path_factory.mktemp("fuzz")
    app = create_app(make_settings(home, rate_limit_per_s=0.0, max_body_bytes=16 * 1024, max_event_bytes=2048))
    with TestClient(app) as c:
        c.home = home
        yield c


@settings(max_examples=2000, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    body=bodies,
    ctype=ctypes,
    encoding=encodings,
    query=st.sampled_from(["", "?source=fz&sequenceNumber=1", "?source=fz"]),
)
def test_http_fuzz(fuzz_client: Any, body: bytes, ctype: str, encoding: str | None, query: str) -> None:
    headers = {"Content-Type": ctype} if ctype else {}
    data = body
    if encoding == "gzip":
        data = gzip.compress(body)
    elif encoding == "zstd":
        data = zstandard.ZstdCompressor().compress(body)
    elif encoding == "gzip-bad":
        data, encoding = body[:3], "gzip"
    if encoding:
        headers["Content-Encoding"] = encoding
    before = staged_files(fuzz_client.home / "staging")
    r = fuzz_client.post("/v1/batches" + query, content=data, headers=headers)
    if r.status_code == 200:
        assert r.json()["type"] == "ack"
        return
    check_refusal(r.status_code, r.json())
    assert staged_files(fuzz_client.home / "staging") == before


frames = st.one_of(
    batches().map(lambda b: {"type": "cdc_batch", **{("sourceDoId" if k == "source" else k): v for k, v in b.items()}}),
    st.fixed_dictionaries(
        {"type": st.sampled_from(["connect", "heartbeat", "flush_request", "nope", 3])},
        optional={
            "sourceDoId": st.one_of(st.text(max_size=5), st.integers()),
            "protocolVersion": st.integers(min_value=-1, max_value=3),
            "lastAckSequence": st.one_of(st.integers(min_value=-2, max_value=2**64), st.text(max_size=2)),
            "capabilities": json_values,
            "reason": st.text(max_size=5),
        },
    ),
    json_values,
)


@settings(max_examples=1000, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
@given(frame=frames, raw=st.booleans())
def test_websocket_fuzz(fuzz_client: Any, frame: Any, raw: bool) -> None:
    before = staged_files(fuzz_client.home / "staging")
    with fuzz_client.websocket_connect("/v1/stream") as ws:
        text = json.dumps(frame)
        ws.send_text(text[: len(text) // 2] if raw else text)
        if isinstance(frame, dict) and frame.get("type") == "flush_request" and not raw:
            reply = ws.receive_json()
            if reply["type"] == "status":
                return
        else:
            reply = ws.receive_json()
    if reply["type"] in ("ack", "status"):
        return
    assert reply["type"] == "nack", reply
    check_refusal(400, reply)
    assert staged_files(fuzz_client.home / "staging") == before
