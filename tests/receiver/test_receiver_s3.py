"""The receiver on a real S3 server (SeaweedFS on 127.0.0.1): two replicas sharing one bucket, and
an outage in the middle of a load — acks turn ``fallback``, the spool drains when the store is
back, and the bucket ends up holding exactly what was acked."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from receiver.app import create_app
from tests.support import make_settings
from tests.support.s3server import SeaweedS3

pytestmark = pytest.mark.server  # SeaweedFS and receivers on 127.0.0.1 ports


def ev(seq: int, table: str = "users") -> dict[str, Any]:
    return {
        "sequence": seq,
        "timestamp": seq,
        "operation": "INSERT",
        "table": table,
        "rowId": str(seq),
        "after": {"id": seq},
    }


def batch(source: str, n: int, per: int = 5) -> dict[str, Any]:
    return {
        "source": source,
        "sequenceNumber": n,
        "events": [ev(n * 100 + i, "users" if i % 2 else "orders") for i in range(per)],
    }


def bucket_scan(s3: SeaweedS3, prefix: str) -> Counter[tuple[str, int, int]]:
    """Independent of cdclake.staging: every data line under the prefix, counted."""
    c = s3.client()
    seen: Counter[tuple[str, int, int]] = Counter()
    for page in c.get_paginator("list_objects_v2").paginate(Bucket=s3.bucket, Prefix=prefix + "/"):
        for obj in page.get("Contents", []):
            key = obj["Key"]
            if "/." in key or not key.endswith(".ndjson"):
                continue
            body = c.get_object(Bucket=s3.bucket, Key=key)["Body"].read().decode()
            for line in body.splitlines():
                e = json.loads(line)
                seen[(e["source"], e["batchSequence"], e["sequence"])] += 1
    return seen


def test_replicas_sharing_a_bucket_land_each_batch_once(s3server: SeaweedS3, tmp_path: Path) -> None:
    prefix = uuid.uuid4().hex
    over = dict(s3server.settings_overrides(prefix), rate_limit_per_s=0.0)
    a = TestClient(create_app(make_settings(tmp_path / "a", **over)))
    b = TestClient(create_app(make_settings(tmp_path / "b", **over)))
    with a, b:
        r1 = a.post("/v1/batches", json=batch("rep", 1))
        r2 = b.post("/v1/batches", json=batch("rep", 1))  # the producer failed over and resent
        r3 = b.post("/v1/batches", json=batch("rep", 2))  # b learns batch 1 landed through a
        r4 = a.post("/v1/batches", json=batch("rep", 4))  # a gap, seen through the bucket
        ready = a.get("/ready").json()
    assert [r.json().get("status") for r in (r1, r2, r3)] == ["persisted", "duplicate", "persisted"]
    assert r1.json()["details"]["persistedPath"].startswith(f"s3://{s3server.bucket}/{prefix}/")
    assert r4.status_code == 409 and r4.json()["expectedSequence"] == 3
    assert ready["status"] == "ready"
    seen = bucket_scan(s3server, prefix)
    assert len(seen) == 10 and set(seen.values()) == {1}


def test_s3_outage_mid_load_falls_back_then_drains_exactly_once(s3server: SeaweedS3, tmp_path: Path) -> None:
    prefix = uuid.uuid4().hex
    settings = make_settings(tmp_path, **s3server.settings_overrides(prefix), rate_limit_per_s=0.0)
    acked: dict[int, str] = {}
    with TestClient(create_app(settings)) as c:
        for n in range(1, 11):
            acked[n] = c.post("/v1/batches", json=batch("out", n)).json()["status"]
        s3server.stop()
        try:
            for n in range(11, 31):
                r = c.post("/v1/batches", json=batch("out", n))
                assert r.status_code == 200, r.text
                acked[n] = r.json()["status"]
            # A resend while the store is down is still recognised (the spool holds it).
            assert c.post("/v1/batches", json=batch("out", 12)).json()["status"] == "duplicate"
            assert c.get("/ready").json()["status"] == "degraded"
            assert c.get("/status").json()["spool"] == 20
        finally:
            s3server.start()
        for n in range(31, 41):
            r = c.post("/v1/batches", json=batch("out", n))
            assert r.status_code == 200, r.text
            acked[n] = r.json()["status"]
        deadline = time.monotonic() + 60
        while c.get("/status").json()["spool"] and time.monotonic() < deadline:
            time.sleep(0.2)
        assert c.get("/status").json()["spool"] == 0
        metrics = c.get("/metrics").text
    assert all(acked[n] == "persisted" for n in range(1, 11))
    assert all(acked[n] == "fallback" for n in range(11, 31))
    assert all(acked[n] in ("persisted", "fallback") for n in range(31, 41))
    assert 'cdclake_receiver_acks_total{status="fallback"}' in metrics
    seen = bucket_scan(s3server, prefix)
    assert set(seen.values()) == {1}, [k for k, v in seen.items() if v > 1][:5]
    assert sorted({b for _, b, _ in seen}) == list(range(1, 41))
    assert len(seen) == 40 * 5
    assert not list((tmp_path / "spool").rglob("*.json"))


def test_drain_after_a_receiver_restart_and_concurrent_producers(s3server: SeaweedS3, tmp_path: Path) -> None:
    """Spooled batches survive the receiver stopping; another process drains them once."""
    prefix = uuid.uuid4().hex
    settings = make_settings(tmp_path, **s3server.settings_overrides(prefix), rate_limit_per_s=0.0)
    s3server.stop()
    try:
        with TestClient(create_app(settings)) as c:

            def send(src: str) -> None:
                for n in range(1, 6):
                    assert c.post("/v1/batches", json=batch(src, n)).json()["status"] == "fallback"

            threads = [threading.Thread(target=send, args=(f"p{i}",)) for i in range(3)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
    finally:
        s3server.start()
    with TestClient(create_app(settings)) as c:
        deadline = time.monotonic() + 60
        while c.get("/status").json()["spool"] and time.monotonic() < deadline:
            time.sleep(0.2)
        nxt = c.post("/v1/batches", json=batch("p0", 6))
    assert nxt.json()["status"] == "persisted"
    seen = bucket_scan(s3server, prefix)
    assert set(seen.values()) == {1} and len(seen) == 3 * 5 * 5 + 5
