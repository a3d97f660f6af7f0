"""The apply job holds its table's lock (cdclake.lake.locks) while it reads, writes and commits, and
maintenance queued behind a stream of applies still gets its turn (issue 13, finding 12).

Without the lock, maintenance and an apply commit blindly against each other and only Iceberg's
commit-conflict retries separate them (apache/iceberg #4996)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from cdclake.dev.workload import generate
from cdclake.lake import locks
from cdclake.lake.catalog import table_watermark
from cdclake.lake.spark import table_ident
from tests.support import fresh_settings, stage, table_rows

pytestmark = pytest.mark.spark
BOUND_S = 300.0  # a bound on waiting for a Spark job on a busy machine, never a measurement


def wait_for(cond: Any, what: str) -> None:
    deadline = time.monotonic() + BOUND_S
    while not cond():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.05)


def test_apply_waits_for_the_table_lock_and_writes_nothing_until_released(spark: Any, spark_home: Path) -> None:
    from spark_jobs.apply import apply_with_retries

    settings = fresh_settings(spark_home)
    w = generate(events=20, seed=3, tables=("orders",), batch_size=20, duplicate_every=0)
    stage(settings, w.batches)
    assert locks.try_acquire(settings, "orders", "test-holder", ttl_s=BOUND_S)
    result: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: result.update(apply_with_retries(spark, settings, "orders", 10_000)))
    thread.start()
    try:
        # The apply either queues for the lock, or (without the lock) runs to its end.
        wait_for(
            lambda: any(o.startswith("apply@") for o in locks.waiters(settings, "orders")) or not thread.is_alive(),
            "the apply to queue for the lock",
        )
        assert thread.is_alive(), f"the apply ran while another holder had the table's lock: {result}"
        assert table_watermark(settings, "orders") is None  # nothing committed
        assert locks.holder(settings, "orders") == "test-holder"
    finally:
        locks.release(settings, "orders", "test-holder")
        thread.join(BOUND_S)
    assert result["committed"] and result["applied"] > 0
    assert len(table_rows(spark, table_ident(settings, "orders"))) > 0
    assert locks.holder(settings, "orders") is None and locks.waiters(settings, "orders") == []


def test_compaction_queued_behind_a_stream_of_applies_gets_its_turn(
    spark: Any, spark_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Applies run back to back on one table (the next one queues as soon as the last released);
    a compaction that queues while an apply holds the lock goes next, before the stream ends."""
    from spark_jobs.apply import apply_with_retries
    from spark_jobs.maintain import compact

    settings = fresh_settings(spark_home)
    w = generate(events=100, seed=9, tables=("orders",), batch_size=20, duplicate_every=0, keys_per_table=60)
    taken: list[str] = []  # roles, in the order they got the lock
    real = locks.try_acquire

    def recording(settings_: Any, table: str, owner: str, ttl_s: float = locks.DEFAULT_TTL_S) -> bool:
        ok = real(settings_, table, owner, ttl_s)
        role = owner.partition("@")[0]
        if ok and table == "orders":
            taken.append(role)
        elif role == "compaction" and not events:
            events.append(f"wait after {len(taken)}")  # its first try found the lock held
        return ok

    events: list[str] = []
    monkeypatch.setattr(locks, "try_acquire", recording)
    stage(settings, w.batches[:1])
    apply_with_retries(spark, settings, "orders", 10_000)  # the table exists before compaction runs
    taken.clear()
    errors: list[BaseException] = []

    def stream() -> None:
        try:
            for b in w.batches[1:]:
                stage(settings, [b])
                apply_with_retries(spark, settings, "orders", 10_000)
        except BaseException as exc:
            errors.append(exc)

    maint = spark.newSession()
    applies = threading.Thread(target=stream)
    applies.start()
    try:
        wait_for(
            lambda: (locks.holder(settings, "orders") or "").startswith("apply@") or not applies.is_alive(),
            "an apply to hold the lock",
        )
        compact(maint, settings, "orders", min_input_files=1)
        events.append(f"compacted after {len(taken)}")
    finally:
        applies.join(BOUND_S)
    assert not errors, [str(e)[:4000] for e in errors]
    assert events and events[0].startswith("wait"), f"compaction never waited for an apply: {events} {taken}"
    waited_at = int(events[0].split()[-1])
    # Next in line after the apply it queued behind: no apply overtook it ...
    assert taken[waited_at] == "compaction", (events, taken)
    # ... and it did not have to wait for the stream to end.
    assert "apply" in taken[waited_at + 1 :], taken
    assert len(taken) == len(w.batches)  # every apply and the compaction took the lock once
