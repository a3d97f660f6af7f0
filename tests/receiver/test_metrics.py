"""cdclake.service.metrics: prometheus_client behind the services' /metrics, one registry per app."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from cdclake.service.metrics import LATENCY_BUCKETS, Metrics


def families(m: Metrics) -> dict[str, object]:
    return {f.name: f for f in text_string_to_metric_families(m.render())}


def test_two_apps_in_one_process_keep_their_own_metrics() -> None:
    # The process-global registry would refuse the second app's metric names.
    a, b = Metrics(), Metrics()
    for m in (a, b):
        m.describe("cdclake_x_total", "counter", "x", ("table",))
    a.inc("cdclake_x_total", 3, table="orders")
    assert a.value("cdclake_x_total", table="orders") == 3
    assert b.value("cdclake_x_total", table="orders") == 0


def test_the_exposition_parses_with_kinds_labels_and_buckets() -> None:
    m = Metrics()
    m.describe("cdclake_acks_total", "counter", "acks", ("status",))
    m.describe("cdclake_backlog", "gauge", "backlog", ("table",))
    m.describe("cdclake_idle", "gauge", "declared, never set")
    m.describe("cdclake_landing_seconds", "histogram", "landing", ("transport",))
    m.inc("cdclake_acks_total", status="persisted")
    m.inc("cdclake_acks_total", 2, status="persisted")
    # A label value a producer controls: quotes, backslash and newline are escaped, not injected.
    hostile = 'o"r\\d\ners'
    m.set("cdclake_backlog", 1_732_650_000_123.5, table=hostile)
    m.observe("cdclake_landing_seconds", 0.003, transport="http")
    m.observe("cdclake_landing_seconds", 99.0, transport="http")
    fam = families(m)
    assert fam["cdclake_acks"].type == "counter"  # type: ignore[attr-defined]
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in fam.values() for s in f.samples}  # type: ignore[attr-defined]
    assert samples[("cdclake_acks_total", (("status", "persisted"),))] == 3
    assert samples[("cdclake_backlog", (("table", hostile),))] == 1_732_650_000_123.5  # full precision
    assert samples[("cdclake_idle", ())] == 0  # declared series exist before their first update
    buckets = {s.labels["le"]: s.value for s in fam["cdclake_landing_seconds"].samples if s.name.endswith("_bucket")}  # type: ignore[attr-defined]
    assert len(buckets) == len(LATENCY_BUCKETS) + 1
    assert buckets["0.0025"] == 0 and buckets["0.005"] == 1 and buckets["10.0"] == 1 and buckets["+Inf"] == 2
    assert samples[("cdclake_landing_seconds_sum", (("transport", "http"),))] == pytest.approx(99.003)


def test_a_metric_used_as_the_wrong_kind_is_refused() -> None:
    m = Metrics()
    m.describe("cdclake_h", "histogram", "h")
    m.describe("cdclake_c_total", "counter", "c")
    with pytest.raises(TypeError, match="cdclake_h is not a counter or gauge"):
        m.inc("cdclake_h")
    with pytest.raises(TypeError, match="cdclake_c_total is not a gauge"):
        m.set("cdclake_c_total", 1)
