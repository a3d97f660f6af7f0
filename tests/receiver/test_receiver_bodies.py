"""What a request body may do to the receiver (issue 13, findings 4 and 11), over the real
Starlette app in-process: every compressed member/frame is decoded or the body is refused, deep
JSON is a 400 naming the depth rule, an NDJSON line cannot leave its element, ``GET
/v1/sources/{source}`` is validated, ``/status`` needs a token when tokens are on."""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
import zstandard
from starlette.testclient import TestClient

from cdclake import staging
from receiver.app import create_app
from tests.support import make_settings

T0 = 1_767_225_600_000
NDJSON = "application/x-ndjson"


def ev(seq: int, pad: str = "", **after: Any) -> dict[str, Any]:
    return {
        "sequence": seq,
        "timestamp": T0 + seq,
        "operation": "INSERT",
        "table": "items",
        "rowId": str(seq),
        "after": {"id": seq, "pad": pad, **after},
    }


def line(seq: int, width: int = 0) -> bytes:
    """One NDJSON line (with its newline), padded to exactly ``width`` bytes when given."""
    raw = json.dumps(ev(seq), separators=(",", ":")).encode()
    if width:
        raw = json.dumps(ev(seq, "x" * (width - 1 - len(raw))), separators=(",", ":")).encode()
        assert len(raw) == width - 1
    return raw + b"\n"


def staged(home: Path) -> list[dict[str, Any]]:
    """Every staged line, read from the files (not through the receiver)."""
    store = staging.LocalStaging(home / "staging")
    return [json.loads(x) for t in store.tables() for k in store.list(t) for x in store.get(k).splitlines()]


def client_for(home: Path, **over: Any) -> TestClient:
    over.setdefault("rate_limit_per_s", 0.0)
    return TestClient(create_app(make_settings(home, **over)))


def post_ndjson(c: TestClient, body: bytes, encoding: str, source: str = "nd-1", seq: int = 1) -> Any:
    headers = {"Content-Type": NDJSON, "Content-Encoding": encoding, "X-CDC-Source": source}
    return c.post("/v1/batches", content=body, headers=headers | {"X-CDC-Sequence-Number": str(seq)})


# --------------------------------------------------------------------------- finding 4: compression


def test_every_gzip_member_is_decoded_and_counted(tmp_path: Path) -> None:
    body = gzip.compress(line(1) + line(2)) + gzip.compress(line(3))
    with client_for(tmp_path) as c:
        r = post_ndjson(c, body, "gzip")
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "persisted" and r.json()["details"]["eventsProcessed"] == 3
    assert sorted(e["sequence"] for e in staged(tmp_path)) == [1, 2, 3]


def test_every_zstd_frame_is_decoded(tmp_path: Path) -> None:
    lines = [line(i) for i in range(1, 20_001)]
    z = zstandard.ZstdCompressor()
    frames = b"".join(z.compress(b"".join(lines[i : i + 5_800])) for i in range(0, len(lines), 5_800))
    with client_for(tmp_path) as c:
        r = post_ndjson(c, frames, "zstd")
    assert r.status_code == 200, r.text
    assert r.json()["details"]["eventsProcessed"] == 20_000
    assert sorted(e["sequence"] for e in staged(tmp_path)) == list(range(1, 20_001))


@pytest.mark.parametrize(
    ("name", "body", "encoding"),
    [
        ("gzip + garbage", gzip.compress(line(1)) + b"trailing garbage", "gzip"),
        ("gzip + truncated member", gzip.compress(line(1)) + gzip.compress(line(2))[:-6], "gzip"),
        ("zstd + garbage", zstandard.ZstdCompressor().compress(line(1)) + b"trailing garbage", "zstd"),
        # 3,000 lines of 128 bytes: the frame's blocks end on line ends, so a frame cut inside
        # its last block decodes to 2,048 whole lines, which landed (and were acked) before.
        (
            "zstd truncated",
            zstandard.ZstdCompressor().compress(b"".join(line(i, 128) for i in range(1, 3_001)))[:-10],
            "zstd",
        ),
    ],
)
def test_a_body_with_more_or_less_than_whole_members_is_refused(
    tmp_path: Path, name: str, body: bytes, encoding: str
) -> None:
    with client_for(tmp_path) as c:
        r = post_ndjson(c, body, encoding)
    assert r.status_code == 400, (name, r.text)
    assert r.json()["reason"] == "invalid_format" and r.json()["field"] == "Content-Encoding"
    assert staged(tmp_path) == []


@pytest.mark.parametrize("encoding", ["gzip", "zstd"])
def test_the_decompressed_size_cap_holds_across_members(tmp_path: Path, encoding: str) -> None:
    limit = 64 * 1024
    part = b" " * (limit // 2 + 1024)  # each member is under the cap, together they are over it
    pack = gzip.compress if encoding == "gzip" else zstandard.ZstdCompressor().compress
    with client_for(tmp_path, max_body_bytes=limit) as c:
        r = post_ndjson(c, pack(part) + pack(part) + pack(line(1)), encoding)
    assert r.status_code == 413, r.text
    assert r.json()["reason"] == "payload_too_large" and r.json()["maxSize"] == limit
    assert staged(tmp_path) == []


# --------------------------------------------------------------------------- finding 11: deep JSON


NESTED = '"@nested@"'


def with_deep(doc: Any, levels: int) -> bytes:
    """``doc`` as JSON with its ``"@nested@"`` value replaced by ``levels`` nested arrays (the
    json module cannot encode that deep itself)."""
    text = json.dumps(doc)
    assert text.count(NESTED) == 1
    return text.replace(NESTED, "[" * levels + "1" + "]" * levels).encode()


DEEP = 5_000


def test_deep_json_is_a_400_naming_the_depth_rule_on_batches_and_debezium(tmp_path: Path) -> None:
    seed = {"source": "deep-1", "sequenceNumber": 1, "events": [ev(1, nested="@nested@")]}
    dbz = {
        "before": None,
        "after": {"id": 1, "nested": "@nested@"},
        "source": {"connector": "postgresql", "db": "d", "schema": "public", "table": "items", "lsn": 1},
        "op": "c",
        "ts_ms": T0,
    }
    with client_for(tmp_path) as c:
        answers = {
            "batches": c.post("/v1/batches", content=with_deep(seed, DEEP)),
            "ndjson": post_ndjson(c, with_deep(ev(1, nested="@nested@"), DEEP), "identity"),
            "debezium": c.post("/v1/debezium", content=with_deep(dbz, DEEP)),
            "debezium as batch": c.post("/v1/batches", content=with_deep(dbz, DEEP)),
        }
    for name, r in answers.items():
        assert r.status_code == 400, (name, r.status_code, r.text[:200])
        assert r.json()["reason"] == "invalid_format", name
        assert "CDCLAKE_MAX_DEPTH" in r.json()["errorMessage"], (name, r.json())
    assert staged(tmp_path) == []


def test_deep_json_on_the_websocket_is_a_nack_and_the_stream_goes_on(tmp_path: Path) -> None:
    msg = {"type": "cdc_batch", "sourceDoId": "ws-1", "sequenceNumber": 1, "events": [ev(1, nested="@nested@")]}
    with client_for(tmp_path) as c, c.websocket_connect("/v1/stream") as ws:
        ws.send_json({"type": "connect", "sourceDoId": "ws-1"})
        assert ws.receive_json()["type"] == "status"
        ws.send_bytes(with_deep(msg, DEEP))
        n = ws.receive_json()
        assert (n["type"], n["reason"]) == ("nack", "invalid_format"), n
        assert "CDCLAKE_MAX_DEPTH" in n["errorMessage"]
        ws.send_json(msg | {"events": [ev(1)]})  # the connection still serves
        assert ws.receive_json()["status"] == "persisted"
    assert [e["sequence"] for e in staged(tmp_path)] == [1]


# --------------------------------------------------------------------------- finding 11: NDJSON


def test_an_ndjson_line_cannot_close_the_events_array_and_set_the_source(tmp_path: Path) -> None:
    escape = (
        json.dumps(ev(1)).encode()
        + b'],"source":"victim","sequenceNumber":1,"events":['
        + json.dumps(ev(2)).encode()
        + b"\n"
    )
    with client_for(tmp_path) as c:
        r = post_ndjson(c, escape, "identity", source="attacker")
    assert r.status_code == 400, r.text
    assert r.json()["field"] == "$.events[0]"
    assert {e["source"] for e in staged(tmp_path)} == set()


# --------------------------------------------------------------------------- finding 11: endpoints


def test_a_source_name_in_the_path_is_validated_and_no_path_leaks(tmp_path: Path) -> None:
    with client_for(tmp_path) as c:
        long = c.get("/v1/sources/" + "a" * 300)
        space = c.get("/v1/sources/a%20b")
        good = c.get("/v1/sources/app-1")
    for r in (long, space):
        assert r.status_code == 400, r.text
        assert r.json()["field"] == "source" and "^[A-Za-z0-9]" in r.json()["errorMessage"]
        assert str(tmp_path) not in r.text
    assert good.status_code == 200 and good.json() == {"source": "app-1", "lastAckSequence": None}


def test_status_needs_a_token_when_tokens_are_on(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.toml"
    digest = hashlib.sha256(b"secret-a").hexdigest()
    tokens.write_text(f'[[producer]]\nid = "app-1"\ntoken_sha256 = "{digest}"\ntables = ["*"]\n')
    with client_for(tmp_path, tokens_file=tokens) as c:
        anonymous = c.get("/status")
        wrong = c.get("/status", headers={"Authorization": "Bearer nope"})
        ok = c.get("/status", headers={"Authorization": "Bearer secret-a"})
    for r in (anonymous, wrong):
        assert r.status_code == 401 and r.json()["field"] == "Authorization"
        assert str(tmp_path) not in r.text
    assert ok.status_code == 200 and ok.json()["state"] == "idle"
