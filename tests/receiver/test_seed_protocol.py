"""Issue 14: the seed's own producer works unchanged.

The seed README (``../shared/seeds/001_*.txt`` beside the repo) is read here, not copied: its
Quick Start producer (the upgrade headers, the ``connect`` and ``cdc_batch`` literals) is sent
verbatim over a real WebSocket at ``/ws`` and ``/v1/stream``, and every answer is checked field
by field against the seed's own TypeScript interfaces (``AckMessage``, ``NackMessage``,
``StatusMessage``), parsed out of the same file. The only edit to the literals is
``Date.now()``, which becomes the current time in milliseconds.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from cdclake import staging
from cdclake.config.settings import Settings
from receiver.app import create_app
from tests.support import make_settings
from tests.support.airflow import FakeAirflow

# The repo's root is tests/..; the seeds live beside it (../shared/seeds from the root).
SEED = Path(__file__).resolve().parents[3] / "shared" / "seeds" / "001_8e584fd5b8f0eb29.txt"
ROUTES = ["/ws", "/v1/stream"]

pytestmark = pytest.mark.skipif(not SEED.is_file(), reason=f"seed document {SEED} is not beside the repo")


# --------------------------------------------------------------------------- reading the seed


def balanced(text: str, start: int) -> str:
    """``text[start:]`` up to the brace that closes the one at ``start`` (quotes respected)."""
    assert text[start] == "{", text[start : start + 20]
    depth, i, quote = 0, start, ""
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == "\\":
                i += 1
            elif ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[start : i + 1]
        i += 1
    raise AssertionError(f"unbalanced braces from offset {start}")


# A single-quoted string, Date.now(), a bare key, or a trailing comma: what separates the
# seed's object literals from JSON.
_JS = re.compile(r"'((?:[^'\\]|\\.)*)'|\bDate\.now\(\)|([A-Za-z_$][\w$]*)(?=\s*:)|,(?=\s*[}\]])")


def js_to_json(literal: str, now_ms: int) -> Any:
    def sub(m: re.Match[str]) -> str:
        if m.group(1) is not None:
            return json.dumps(m.group(1))
        if m.group(0) == "Date.now()":
            return str(now_ms)
        if m.group(2) is not None:
            return json.dumps(m.group(2))
        return ""

    return json.loads(_JS.sub(sub, literal))


Shape = dict[str, tuple[bool, Any]]
"""Field name -> (optional, type): a type is its TypeScript text or a nested Shape."""


def strip_comments(ts: str) -> str:
    return re.sub(r"//[^\n]*", "", re.sub(r"/\*.*?\*/", "", ts, flags=re.S))


def parse_fields(body: str) -> Shape:
    fields: Shape = {}
    i = 0
    field = re.compile(r"\s*(\w+)(\?)?\s*:\s*")
    while True:
        m = field.match(body, i)
        if m is None:
            assert not body[i:].strip(), f"cannot read {body[i : i + 60]!r}"
            return fields
        i = m.end()
        if body[i] == "{":
            inner = balanced(body, i)
            fields[m[1]] = (bool(m[2]), parse_fields(inner[1:-1]))
            i += len(inner)
            i = body.index(";", i) + 1
        else:
            end = body.index(";", i)
            fields[m[1]] = (bool(m[2]), body[i:end].strip())
            i = end + 1


@dataclass
class Seed:
    text: str
    now_ms: int

    @classmethod
    def load(cls) -> Seed:
        return cls(SEED.read_text(), int(time.time() * 1000))

    def producer_block(self) -> str:
        blocks = re.findall(r"```typescript\n(.*?)```", self.text, re.S)
        (block,) = [b for b in blocks if "new WebSocket(" in b and "X-Client-ID" in b]
        text: str = block
        return text

    def headers(self) -> dict[str, str]:
        block = self.producer_block()
        at = block.index("{", block.index("headers:"))
        out: dict[str, str] = js_to_json(balanced(block, at), self.now_ms)
        return out

    def sent(self) -> list[dict[str, Any]]:
        """Every ``ws.send(JSON.stringify({...}))`` of the Quick Start producer, in order."""
        block = self.producer_block()
        return [
            js_to_json(balanced(block, m.end() - 1), self.now_ms) for m in re.finditer(r"JSON\.stringify\(\{", block)
        ]

    def sent_of(self, kind: str) -> dict[str, Any]:
        (msg,) = [m for m in self.sent() if m["type"] == kind]
        return msg

    def interface(self, name: str) -> Shape:
        m = re.search(rf"\binterface {name} \{{", self.text)
        assert m, f"the seed has no interface {name}"
        return parse_fields(strip_comments(balanced(self.text, m.end() - 1)[1:-1]))

    def alias(self, name: str) -> str:
        m = re.search(rf"\btype {name} =(.*?);", strip_comments(self.text), re.S)
        assert m, f"the seed has no type {name}"
        return m[1]

    def conforms(self, value: Any, t: str | Shape, path: str = "$") -> list[str]:
        """What in ``value`` breaks the seed's type ``t`` (extra fields are fine, as in TypeScript;
        an optional field may be absent, not null)."""
        if isinstance(t, dict):
            if not isinstance(value, dict):
                return [f"{path}: {value!r} is not an object"]
            problems = []
            for name, (optional, ft) in t.items():
                if name not in value:
                    problems += [] if optional else [f"{path}.{name}: missing"]
                else:
                    problems += self.conforms(value[name], ft, f"{path}.{name}")
            return problems
        t = t.strip()
        alternatives = [a.strip() for a in t.split("|") if a.strip()]
        if len(alternatives) > 1:
            if any(not self.conforms(value, a, path) for a in alternatives):
                return []
            return [f"{path}: {value!r} is not {t}"]
        ok: bool
        if t.startswith("'"):
            ok = value == t[1:-1]
        elif t == "number":
            ok = isinstance(value, int | float) and not isinstance(value, bool)
        elif t == "string":
            ok = isinstance(value, str)
        elif t == "boolean":
            ok = isinstance(value, bool)
        elif t == "unknown":
            ok = True
        elif t.startswith("Record<"):
            ok = isinstance(value, dict)
        elif t.endswith("[]"):
            if not isinstance(value, list):
                return [f"{path}: {value!r} is not {t}"]
            return [p for i, v in enumerate(value) for p in self.conforms(v, t[:-2], f"{path}[{i}]")]
        elif re.fullmatch(r"[A-Z]\w*", t):
            named = self.interface(t) if re.search(rf"\binterface {t} \{{", self.text) else self.alias(t)
            return self.conforms(value, named, path)
        else:
            raise AssertionError(f"the test cannot read the seed's type {t!r}")
        return [] if ok else [f"{path}: {value!r} is not {t}"]

    def check(self, value: Any, interface: str) -> None:
        problems = self.conforms(value, self.interface(interface))
        assert not problems, f"{interface}: {problems}\n{json.dumps(value, indent=1)}"


@pytest.fixture(scope="module")
def seed() -> Seed:
    return Seed.load()


def staged(settings: Settings) -> list[dict[str, Any]]:
    store = staging.LocalStaging(settings.staging_dir)
    return [
        json.loads(x) | {"table": k.table}
        for t in store.tables()
        for k in store.list(t)
        for x in store.get(k).splitlines()
    ]


def closed(ws: Any) -> bool:
    try:
        ws.receive_json()
    except WebSocketDisconnect:
        return True
    return False


# --------------------------------------------------------------------------- the seed's producer


def test_the_seed_documents_what_this_test_replays(seed: Seed) -> None:
    assert seed.headers() == {"Upgrade": "websocket", "X-Client-ID": "dosql-shard-1", "X-Shard-Name": "users-shard-1"}
    assert [m["type"] for m in seed.sent()] == ["connect", "cdc_batch"]
    seed.check(seed.sent_of("connect"), "ConnectMessage")
    seed.check(seed.sent_of("cdc_batch"), "CDCBatchMessage")
    assert "remainingTokens" in seed.interface("AckMessage")["details"][1]
    assert set(seed.interface("AckMessage")["rateLimit"][1]) == {"limit", "remaining", "resetAt"}


@pytest.mark.parametrize("route", ROUTES)
def test_seed_producer_unchanged(tmp_path: Path, route: str, seed: Seed, airflow: FakeAirflow) -> None:
    # The seed's rate limits are the defaults: burst 50, refill 10/s.
    settings = make_settings(tmp_path, airflow_password="pw", notify_debounce_ms=0)
    connect, batch = seed.sent_of("connect"), seed.sent_of("cdc_batch")
    with TestClient(create_app(settings)) as c, c.websocket_connect(route, headers=seed.headers()) as ws:
        # As the seed's producer does: connect, then the batch, without waiting in between.
        ws.send_text(json.dumps(connect))
        ws.send_text(json.dumps(batch))
        status = ws.receive_json()
        seed.check(status, "StatusMessage")
        assert status["lastAckSequence"] is None  # nothing landed yet for dosql-shard-1
        assert status["sourceShardName"] == "users-shard-1"

        ack = ws.receive_json()
        seed.check(ack, "AckMessage")
        assert (ack["type"], ack["sequenceNumber"], ack["status"]) == ("ack", batch["sequenceNumber"], "persisted")
        d = ack["details"]
        assert d["eventsProcessed"] == 1 and 0 <= d["bufferUtilization"] <= 1
        assert (d["bucketCapacity"], d["remainingTokens"]) == (50, 49)
        assert "suggestedDelayMs" not in d  # no backpressure: the seed's client would not wait
        rl = ack["rateLimit"]
        assert (rl["limit"], rl["remaining"]) == (50, 49)
        assert isinstance(rl["resetAt"], int) and rl["resetAt"] >= batch["timestamp"]  # Unix ms

        ws.send_text(json.dumps(batch | {"isRetry": True, "retryCount": 1}))
        again = ws.receive_json()
        seed.check(again, "AckMessage")
        # A resend costs a token too; the bucket refills meanwhile (10/s), so 48 or 49, never 50.
        assert again["status"] == "duplicate" and again["details"]["remainingTokens"] in (48, 49)
        assert again["rateLimit"]["remaining"] == again["details"]["remainingTokens"]

        heartbeat = {"type": "heartbeat", "timestamp": seed.now_ms, "sourceDoId": connect["sourceDoId"]}
        heartbeat |= {"lastAckSequence": 1, "pendingEvents": 0}
        assert set(heartbeat) == set(seed.interface("HeartbeatMessage"))
        seed.check(heartbeat, "HeartbeatMessage")
        ws.send_text(json.dumps(heartbeat))
        seed.check(ws.receive_json(), "StatusMessage")

        flush = {"type": "flush_request", "timestamp": seed.now_ms, "sourceDoId": connect["sourceDoId"]}
        flush["reason"] = "manual"
        assert set(flush) == set(seed.interface("FlushRequestMessage"))
        seed.check(flush, "FlushRequestMessage")
        ws.send_text(json.dumps(flush))
        flushed = ws.receive_json()
        seed.check(flushed, "StatusMessage")
        assert flushed["flush"] == {"dag_run_id": "manual__1"}

    (row,) = staged(settings)
    (event,) = batch["events"]
    assert row["table"] == event["table"] and row["source"] == connect["sourceDoId"]
    assert (row["batchSequence"], row["sequence"], row["rowId"]) == (1, event["sequence"], event["rowId"])
    assert (row["operation"], row["after"], row["timestamp"]) == ("INSERT", event["after"], event["timestamp"])


@pytest.mark.parametrize("route", ROUTES)
def test_seed_nack_when_rate_limited(tmp_path: Path, route: str, seed: Seed) -> None:
    settings = make_settings(tmp_path, rate_limit_burst=1, rate_limit_per_s=0.001)
    batch = seed.sent_of("cdc_batch")
    second = batch | {"sequenceNumber": 2, "events": [e | {"sequence": 2} for e in batch["events"]]}
    with TestClient(create_app(settings)) as c, c.websocket_connect(route, headers=seed.headers()) as ws:
        ws.send_text(json.dumps(seed.sent_of("connect")))
        ws.receive_json()
        ws.send_text(json.dumps(batch))
        first = ws.receive_json()
        assert first["details"]["remainingTokens"] == 0 and first["rateLimit"]["remaining"] == 0
        ws.send_text(json.dumps(second))
        nack = ws.receive_json()
    seed.check(nack, "NackMessage")
    assert (nack["reason"], nack["sequenceNumber"], nack["shouldRetry"]) == ("rate_limited", 2, True)
    assert nack["retryDelayMs"] > 0
    assert len(staged(settings)) == 1


def tokens(home: Path, source: str = "dosql-shard-1") -> Path:
    p = home / "tokens.toml"
    p.write_text(f'[[producer]]\nid = "{source}"\ntoken_sha256 = "{hashlib.sha256(b"s3cret").hexdigest()}"\n')
    return p


@pytest.mark.parametrize("route", ROUTES)
def test_with_tokens_the_token_is_the_source_and_nacks_carry_the_batch_number(
    tmp_path: Path, route: str, seed: Seed
) -> None:
    # With tokens the rate limit is taken before the frame's events are decoded: the nack still
    # names the batch (the seed's NackMessage requires sequenceNumber).
    settings = make_settings(tmp_path, tokens_file=tokens(tmp_path), rate_limit_burst=1, rate_limit_per_s=0.001)
    batch = seed.sent_of("cdc_batch")
    headers = seed.headers() | {"Authorization": "Bearer s3cret"}
    with TestClient(create_app(settings)) as c, c.websocket_connect(route, headers=headers) as ws:
        ws.send_text(json.dumps(seed.sent_of("connect")))
        ws.send_text(json.dumps(batch))
        seed.check(ws.receive_json(), "StatusMessage")
        ack = ws.receive_json()
        seed.check(ack, "AckMessage")
        assert ack["status"] == "persisted" and ack["rateLimit"]["limit"] == 1
        ws.send_text(json.dumps(batch | {"sequenceNumber": 2}))
        nack = ws.receive_json()
        seed.check(nack, "NackMessage")
        assert (nack["reason"], nack["sequenceNumber"]) == ("rate_limited", 2)
    assert [r["source"] for r in staged(settings)] == ["dosql-shard-1"]


@pytest.mark.parametrize(
    ("header", "value"),
    [("X-Client-ID", "dosql-shard-2"), ("X-Shard-Name", "orders-shard-9")],
)
def test_headers_that_contradict_the_connect_message_are_refused(
    tmp_path: Path, seed: Seed, header: str, value: str
) -> None:
    headers = seed.headers() | {header: value}
    with TestClient(create_app(make_settings(tmp_path))) as c, c.websocket_connect("/ws", headers=headers) as ws:
        ws.send_text(json.dumps(seed.sent_of("connect")))
        nack = ws.receive_json()
        assert (nack["type"], nack["reason"], nack["field"]) == ("nack", "invalid_format", header)
        assert value in nack["errorMessage"]
        assert closed(ws)


def test_x_client_id_must_be_the_tokens_source(tmp_path: Path, seed: Seed) -> None:
    settings = make_settings(tmp_path, tokens_file=tokens(tmp_path, "other-db"))
    headers = seed.headers() | {"Authorization": "Bearer s3cret"}
    with TestClient(create_app(settings)) as c, c.websocket_connect("/ws", headers=headers) as ws:
        ws.send_text(json.dumps(seed.sent_of("connect") | {"sourceDoId": "other-db"}))
        nack = ws.receive_json()
        assert (nack["reason"], nack["field"]) == ("invalid_format", "X-Client-ID")
        assert "other-db" in nack["errorMessage"]


def test_batches_speak_for_the_connected_source_only(tmp_path: Path, seed: Seed) -> None:
    settings = make_settings(tmp_path)
    batch = seed.sent_of("cdc_batch")
    with TestClient(create_app(settings)) as c, c.websocket_connect("/ws") as ws:
        ws.send_text(json.dumps(seed.sent_of("connect")))
        ws.receive_json()
        ws.send_text(json.dumps(batch | {"sourceDoId": "someone-else"}))
        nack = ws.receive_json()
        seed.check(nack, "NackMessage")
        assert (nack["reason"], nack["field"], nack["sequenceNumber"]) == ("invalid_format", "$.sourceDoId", 1)
    assert staged(settings) == []


def test_http_acks_carry_the_rate_limit_block_too(tmp_path: Path, seed: Seed) -> None:
    batch = seed.sent_of("cdc_batch")
    body = {"source": batch["sourceDoId"], "sequenceNumber": 1, "events": batch["events"]}
    with TestClient(create_app(make_settings(tmp_path))) as c:
        r = c.post("/v1/batches", json=body)
    assert r.status_code == 200, r.text
    seed.check(r.json(), "AckMessage")
    assert (r.json()["details"]["remainingTokens"], r.json()["details"]["bucketCapacity"]) == (49, 50)
    assert r.json()["rateLimit"]["remaining"] == int(r.headers["X-RateLimit-Remaining"]) == 49
