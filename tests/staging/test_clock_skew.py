"""Clock skew between a receiver and the apply host must not lose acked data (issue 13, finding 6).

Staging object names start with a time, and the apply's watermark ``low`` passes over names
older than its landing horizon (listing time minus CDCLAKE_LANDING_GRACE_S). A receiver whose
clock is behind by more than the grace used to name objects below a ``low`` that had already
passed: never applied, then deleted by clean-up as consumed. Here the receiver's clock is the
injected one (``Lander(clock=...)``); the store's clock is the real one (file mtimes, S3
LastModified)."""

from __future__ import annotations

import time
from datetime import UTC
from pathlib import Path
from typing import Any

import pytest

from cdclake import staging
from cdclake.contracts import events
from cdclake.lake.cleanup import clean_staging
from cdclake.lake.spark import table_ident
from cdclake.staging import stores
from receiver.landing import Lander
from receiver.prepared import Prepared
from tests.support import fresh_settings, table_rows
from tests.support.s3server import SeaweedS3

SKEW_S = 3600.0  # far beyond any landing grace
GRACE_S = 1


def prepared(seq: int, row: str, source: str = "app") -> Prepared:
    ev = {
        "sequence": seq,
        "timestamp": 1_767_225_600_000 + seq,
        "operation": "INSERT",
        "table": "orders",
        "rowId": row,
        "after": {"id": int(row), "v": f"row {row}"},
    }
    b = {"source": source, "sequenceNumber": seq, "events": [ev]}
    return Prepared.from_batch(events.decode_batch(events.encode(b)))


def behind() -> float:
    return time.time() - SKEW_S


@pytest.mark.spark
def test_a_receiver_clock_behind_the_apply_host_loses_no_acked_batch(spark: Any, spark_home: Path) -> None:
    from spark_jobs.apply import apply_table

    settings = fresh_settings(spark_home, landing_grace_s=GRACE_S)
    store = staging.LocalStaging(settings.staging_dir)
    ident = table_ident(settings, "orders")

    # A receiver with a correct clock lands batch 1; once it is older than the grace, the
    # apply consumes it and the watermark's low moves past its name.
    assert Lander(store, None).land(prepared(1, "1")).status == "persisted"
    time.sleep(GRACE_S + 0.5)
    assert apply_table(spark, settings, "orders", 10_000)["committed"]

    # A second receiver (another replica, or the same host after a clock step) is an hour behind.
    landed = Lander(store, None, clock=behind).land(prepared(2, "2"))
    assert landed.status == "persisted"

    apply_table(spark, settings, "orders", 10_000)
    assert sorted(table_rows(spark, ident)) == ["1", "2"], "an acked batch was never applied"

    clean_staging(settings, cutoff_ms=int((time.time() + 86_400) * 1000))
    assert sorted(table_rows(spark, ident)) == ["1", "2"]


@pytest.mark.spark
def test_clean_up_keeps_an_object_that_became_visible_after_the_grace(spark: Any, spark_home: Path) -> None:
    """Belt and braces: an object whose name is older than its store time by more than the
    grace (written by a receiver before the fix, or a landing slower than the grace) may have been
    passed by the watermark unseen. Clean-up must not delete it as consumed."""
    from spark_jobs.apply import apply_table

    settings = fresh_settings(spark_home, landing_grace_s=GRACE_S)
    store = staging.LocalStaging(settings.staging_dir)
    assert Lander(store, None).land(prepared(1, "1")).status == "persisted"
    time.sleep(GRACE_S + 0.5)
    assert apply_table(spark, settings, "orders", 10_000)["committed"]

    data = prepared(1, "7", source="old").objects["orders"]
    late = staging.make_key("orders", "old", 1, int(behind() * 1000))
    store.put(late, data)  # named an hour before it was written: below the watermark's low
    out = clean_staging(settings, cutoff_ms=int((time.time() + 86_400) * 1000))
    assert store.exists(late.path), "clean-up deleted an object it cannot know was applied"
    assert out["objects_landed_late"] == 1


@pytest.mark.server
def test_a_skewed_receiver_names_s3_objects_with_the_stores_time(s3server: SeaweedS3) -> None:
    """The same receiver on S3: its object's name is the store's time (LastModified, 1 s
    resolution), not the receiver's clock."""
    store = s3server.store()
    landed = Lander(store, None, clock=behind).land(prepared(1, "1"))
    assert landed.status == "persisted"
    (key,) = list(store.list("orders"))
    head = s3server.client().head_object(Bucket=store.bucket, Key=f"{store.prefix}/{key.path}")
    modified_ms = head["LastModified"].astimezone(UTC).timestamp() * 1000
    assert abs(key.landed_ms - modified_ms) < 5_000, (key.landed_ms, modified_ms)


class FakeStore:
    """A store whose clock reads ``store_s`` (seconds) when probed; probes are counted."""

    MTIME_SLACK_MS = 1000

    def __init__(self, store_s: float) -> None:
        self.store_s = store_s
        self.probes = 0
        self.fail = False

    def clock_probe(self) -> int:
        self.probes += 1
        if self.fail:
            raise OSError("store down")
        return int(self.store_s * 1000) // 1000 * 1000  # whole seconds, as S3's LastModified


def test_store_clock_bounds_hold_the_stores_time_and_refresh() -> None:
    from cdclake.staging.clock import DRIFT, StoreClock, StoreClockError

    store = FakeStore(1_800_000_000.7)
    elapsed = [100.0]

    def tick() -> float:
        elapsed[0] += 0.25  # every reading of the elapsed clock costs a quarter second
        store.store_s += 0.25 * (1 + DRIFT / 2)  # the store's clock runs a little fast
        return elapsed[0]

    clock = StoreClock(store, refresh_s=60, monotonic=tick)  # type: ignore[arg-type]
    for _ in range(400):  # 200 s: three probes
        lo, hi = clock.lower_ms(), clock.upper_ms()
        assert lo <= store.store_s * 1000 <= hi, (lo, store.store_s * 1000, hi)
        assert hi - lo < 4_000
    assert store.probes == 4
    store.fail = True
    elapsed[0] += 61  # the reading is stale, and the store cannot be probed
    with pytest.raises(StoreClockError, match="staging store's clock"):
        clock.upper_ms()


def test_a_receiver_that_cannot_read_the_stores_clock_is_not_ready_and_refuses_retryably(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from starlette.testclient import TestClient

    from receiver.app import create_app
    from tests.support import make_settings

    class NoClock(staging.LocalStaging):
        def clock_probe(self) -> int:
            raise PermissionError("cannot write the probe")

    settings = make_settings(tmp_path, rate_limit_per_s=0.0)
    monkeypatch.setattr(stores, "open_store", lambda s: NoClock(s.staging_dir))
    with TestClient(create_app(settings)) as c:
        ready = c.get("/ready")
        body = {"source": "app", "sequenceNumber": 1, "events": [prepared_event(1)]}
        r = c.post("/v1/batches", json=body)
    assert ready.status_code == 503 and "clock" in ready.json()["storage"].lower()
    assert r.status_code == 503 and r.json()["shouldRetry"] is True
    assert "staging store's clock" in r.json()["errorMessage"]
    assert not list(NoClock(settings.staging_dir).list("orders"))


def prepared_event(seq: int) -> dict[str, Any]:
    return {"sequence": seq, "timestamp": 1, "operation": "INSERT", "table": "orders", "rowId": "1", "after": {"id": 1}}
