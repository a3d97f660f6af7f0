"""Every apply's record reaches the REST catalog's /metrics (restcatalog/lakemetrics.py): real
applies write running totals and phase seconds into the table commit's snapshot summary, and the
collector reads them back with pyiceberg, with the pending staging objects and both freshnesses.
Expected values come from the events sent, by the pipeline's rules, not from the apply's output."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from cdclake.contracts.events import CHANGES_SUFFIX
from cdclake.contracts.watermark import APPLIES_KEY
from cdclake.lake.catalog import applied_summary
from restcatalog.app import create_app
from tests.support import apply_all, fresh_settings, stage

pytestmark = pytest.mark.spark

T0 = 1_767_225_600_000


def ev(seq: int, op: str, key: str, after: dict[str, Any]) -> dict[str, Any]:
    return {"sequence": seq, "timestamp": T0 + seq, "operation": op, "table": "t", "rowId": key, "after": after}


def batch(n: int, *events: dict[str, Any]) -> dict[str, Any]:
    return {"source": "s", "sequenceNumber": n, "events": list(events)}


def scrape(settings: Any) -> dict[str, float]:
    """Samples by name and labels as written (prometheus_client sorts the labels by name)."""
    with TestClient(create_app(settings, query_sessions=None)) as c:
        text = c.get("/metrics").text
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line[:1] != "#"}


def test_two_applies_add_up_on_metrics_with_pending_data_and_both_freshnesses(spark: Any, spark_home: Path) -> None:
    settings = fresh_settings(spark_home, spark_connect_url="", freshness_objective_s=30)
    first = batch(1, ev(1, "INSERT", "1", {"id": 1, "v": 1}), ev(2, "UPDATE", "1", {"id": 1, "v": 2}))
    stage(settings, [first])
    apply_all(spark, settings)  # 1 applied, 1 superseded (the same key's older event)
    # The producer re-sends batch 1 (2 duplicates); a string is no bigint (quarantined); one insert.
    stage(settings, [batch(2, ev(3, "INSERT", "2", {"id": 2, "v": "abc"}), ev(4, "INSERT", "3", {"id": 3, "v": 3}))])
    stage(settings, [batch(3, *first["events"])])
    before_s = time.time()
    apply_all(spark, settings)
    after_s = time.time()
    # One more batch lands a minute ago (its name carries its landing time) and is not applied.
    stage(settings, [batch(4, ev(5, "INSERT", "4", {"id": 4, "v": 4}))], landed_ms=int(time.time() * 1000) - 60_000)

    scraped_before = time.time()
    m = scrape(settings)
    scraped_after = time.time()
    want = {"applied": 2, "superseded": 1, "duplicate": 2, "late": 0, "quarantined": 1}
    got = {k: m.get(f'cdclake_apply_events_total{{outcome="{k}",table="t"}}') for k in want}
    assert got == want
    assert m['cdclake_applies_total{table="t"}'] == 2
    assert before_s <= m['cdclake_apply_last_success_timestamp_seconds{table="t"}'] <= after_s
    phases = {k.split('"')[1] for k in m if k.startswith("cdclake_apply_phase_seconds{") and 'table="t"' in k}
    assert phases == {"list", "read", "fit", "history", "classify", "count", "side_tables"}
    assert m['cdclake_table_pending_objects{table="t"}'] == 1
    # By commit time: the unapplied object's age (a minute, plus this test's own seconds), read in
    # the store's clock within its bounds (a local store: 50 ms of mtime slack each way).
    assert 60 - 0.2 <= m['cdclake_table_freshness_seconds{by="commit",table="t"}'] < 60 + (scraped_after - before_s) + 5
    # By event time: now minus the newest applied event time (seq 4: T0 + 4 ms), years ago.
    by_event = m['cdclake_table_freshness_seconds{by="event",table="t"}']
    assert scraped_before - (T0 + 4) / 1000 - 5 <= by_event <= scraped_after - (T0 + 4) / 1000 + 5
    assert m['cdclake_table_freshness_objective_seconds{table="t"}'] == 30
    assert m["cdclake_lake_metrics_up"] == 1
    assert not any(f'table="t{CHANGES_SUFFIX}"' in k for k in m), "side tables are not CDC tables"
    # The totals ride on the table's commit only, not on the side tables' commits.
    assert APPLIES_KEY not in applied_summary(settings, "t" + CHANGES_SUFFIX)
