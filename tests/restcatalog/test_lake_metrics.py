"""The lake collector alone (restcatalog/lakemetrics.py), over made-up observations: what each
summary property becomes, the scrape cache, and a failed read of the lake."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from cdclake.config.settings import load
from cdclake.contracts.watermark import phase_properties, total_properties
from cdclake.lake.freshness import Freshness
from restcatalog.lakemetrics import LakeCollector

NOW = 1_800_000_000_000


def registry(observe, cache_s: float = 3600.0) -> CollectorRegistry:  # type: ignore[no-untyped-def]
    r = CollectorRegistry()
    r.register(LakeCollector(load({}), observe=observe, cache_s=cache_s))
    return r


def test_a_tables_last_apply_becomes_counters_and_gauges() -> None:
    summary = total_properties({}, {"received": 5, "applied": 3, "duplicate": 2}) | phase_properties({"read": 1.5})
    found = [Freshness("orders", 60, 2, NOW - 90_000, NOW, summary, NOW - 30_000, NOW - 3_600_000)]
    r = registry(lambda s: found)
    v = r.get_sample_value
    assert v("cdclake_apply_events_total", {"table": "orders", "outcome": "applied"}) == 3
    assert v("cdclake_apply_events_total", {"table": "orders", "outcome": "duplicate"}) == 2
    assert v("cdclake_apply_events_total", {"table": "orders", "outcome": "received"}) is None  # the sum, not a label
    assert v("cdclake_applies_total", {"table": "orders"}) == 1
    assert v("cdclake_apply_phase_seconds", {"table": "orders", "phase": "read"}) == 1.5
    assert v("cdclake_apply_last_success_timestamp_seconds", {"table": "orders"}) == (NOW - 30_000) / 1000
    assert v("cdclake_table_freshness_seconds", {"table": "orders", "by": "commit"}) == 90
    assert v("cdclake_table_freshness_seconds", {"table": "orders", "by": "event"}) == 3600
    assert v("cdclake_table_pending_objects", {"table": "orders"}) == 2
    assert v("cdclake_table_freshness_objective_seconds", {"table": "orders"}) == 60


def test_scrapes_within_the_cache_read_the_lake_once_and_a_failed_read_says_so() -> None:
    calls = []

    def observe(settings):  # type: ignore[no-untyped-def]
        calls.append(1)
        if len(calls) > 1:
            raise OSError("catalog down")
        return [Freshness("orders", 60, 0, None, NOW)]

    cached = registry(observe)
    for _ in range(3):
        assert cached.get_sample_value("cdclake_table_freshness_seconds", {"table": "orders", "by": "commit"}) == 0
    assert len(calls) == 1
    uncached = registry(observe, cache_s=0.0)  # the read fails from now on
    assert uncached.get_sample_value("cdclake_lake_metrics_up") == 0
    assert uncached.get_sample_value("cdclake_table_pending_objects", {"table": "orders"}) is None
