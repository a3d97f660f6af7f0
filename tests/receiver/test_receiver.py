from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from cdclake import staging
from cdclake.dev.workload import generate
from receiver.app import create_app
from tests.support import make_settings


@pytest.fixture()
def client(tmp_path: Path) -> Any:
    with TestClient(create_app(make_settings(tmp_path, max_body_bytes=64 * 1024))) as c:
        c.staging = staging.LocalStaging(tmp_path / "staging")
        yield c


def staged_events(store: staging.LocalStaging) -> list[dict[str, Any]]:
    out = []
    for table in store.tables():
        for key in store.list(table):
            out += [json.loads(line) | {"table": table} for line in store.get(key).splitlines()]
    return out


def test_every_acked_batch_is_in_staging_one_object_per_table(client: Any) -> None:
    w = generate(events=200, batch_size=25, duplicate_every=0)
    for b in w.batches:
        r = client.post("/v1/batches", content=json.dumps(b))
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["type"] == "ack" and body["status"] == "persisted"
        assert body["sequenceNumber"] == b["sequenceNumber"]
        assert body["details"]["eventsProcessed"] == len(b["events"])
        tables = {e["table"] for e in b["events"]}
        assert len(body["details"]["persistedPaths"]) == len(tables)
        assert body["details"]["persistedPath"] == body["details"]["persistedPaths"][0]
    landed = staged_events(client.staging)
    sent = [
        {
            **{k: v for k, v in e.items() if k != "table"},
            "source": b["source"],
            "batchSequence": b["sequenceNumber"],
            "table": e["table"],
        }
        for b in w.batches
        for e in b["events"]
    ]
    key = lambda e: (e["source"], e["sequence"])  # noqa: E731
    assert sorted(landed, key=key) == sorted(sent, key=key)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"source": "a", "sequenceNumber": 1, "events": [{"sequence": "one"}]}, "$.events[0].sequence"),
        ({"source": "a", "sequenceNumber": 1}, "$"),
        (
            {
                "source": "a",
                "sequenceNumber": 1,
                "events": [
                    {
                        "sequence": 1,
                        "timestamp": 1,
                        "operation": "INSERT",
                        "table": "t",
                        "rowId": "1",
                        "after": {"a": 1},
                    },
                    {"sequence": 2, "timestamp": 1, "operation": "UPDATE", "table": "t", "rowId": "1"},
                ],
            },
            "$.events[1].after",
        ),
    ],
)
def test_bad_batch_gets_400_naming_the_field_and_nothing_lands(client: Any, body: Any, field: str) -> None:
    r = client.post("/v1/batches", content=json.dumps(body))
    assert r.status_code == 400
    assert r.json()["field"] == field
    assert r.json()["reason"] == "invalid_format"
    assert staged_events(client.staging) == []


def test_oversized_body_is_refused_with_413_and_the_limit(client: Any) -> None:
    big = generate(events=2000, batch_size=2000, duplicate_every=0).batches[0]
    r = client.post("/v1/batches", content=json.dumps(big))
    assert r.status_code == 413
    assert r.json()["maxSize"] == 64 * 1024
    assert "CDCLAKE_MAX_BODY_BYTES" in r.json()["errorMessage"]
    assert staged_events(client.staging) == []


def test_not_json_is_400(client: Any) -> None:
    r = client.post("/v1/batches", content=gzip.compress(b"{}"))
    assert r.status_code == 400 and "malformed JSON" in r.json()["errorMessage"]


def test_health(client: Any) -> None:
    assert client.get("/health").json()["status"] == "ok"
