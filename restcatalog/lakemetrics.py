"""Every apply and every table's freshness as Prometheus metrics, on the REST catalog's /metrics.

Apply tasks are short-lived processes, maybe on other machines, so they export nothing
themselves: each apply writes its record into the table commit's snapshot summary (this apply's
counts, running totals, phase seconds: :mod:`cdclake.contracts.watermark`), and this collector,
on the one long-lived service every deployment runs once, reads the tables' newest watermark
snapshots with pyiceberg when Prometheus scrapes (at most every :data:`CACHE_S`), together with
the pending staging objects (:mod:`cdclake.lake.freshness`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from cdclake.config.settings import Settings
from cdclake.contracts.watermark import EVENT_COUNTS, phases_of, totals_of
from cdclake.lake.freshness import Freshness, table_freshness

log = logging.getLogger("restcatalog.lakemetrics")

CACHE_S = 15.0
"""A scrape within this long of the last one answers from it: reading every table's metadata and
the staging listing costs more than a scrape should, and data does not change faster than applies."""
OUTCOMES = tuple(k for k in EVENT_COUNTS if k != "received")
"""``received`` is their sum: a label for it would count every event twice in a ``sum()``."""


class LakeCollector(Collector):
    def __init__(
        self, settings: Settings, observe: Callable[[Settings], list[Freshness]] | None = None, cache_s: float = CACHE_S
    ) -> None:
        self.settings = settings
        self._observe = observe or (lambda s: table_freshness(s, event_time=True))
        self.cache_s = cache_s
        self._lock = threading.Lock()
        self._at = float("-inf")
        self._found: list[Freshness] = []
        self._ok = True

    def _current(self) -> tuple[list[Freshness], bool]:
        with self._lock:  # two scrapes at once read the lake once
            if time.monotonic() - self._at >= self.cache_s:
                try:
                    self._found, self._ok = self._observe(self.settings), True
                except Exception as exc:  # keep serving the other metrics; say so in one gauge
                    log.warning("reading the lake for /metrics failed: %s: %s", type(exc).__name__, exc)
                    self._ok = False
                self._at = time.monotonic()
            return self._found, self._ok

    def describe(self) -> Iterator[Metric]:
        return iter(families([], True))  # the names, without reading the lake at registration

    def collect(self) -> Iterator[Metric]:
        found, ok = self._current()
        return iter(families(found, ok))


def families(found: list[Freshness], ok: bool) -> list[Metric]:
    events = CounterMetricFamily(
        "cdclake_apply_events_total",
        "Events applies consumed, by outcome (received = the sum), running total kept in the table's snapshot summary.",
        labels=["table", "outcome"],
    )
    applies = CounterMetricFamily("cdclake_applies_total", "Applies committed (running total).", labels=["table"])
    phases = GaugeMetricFamily(
        "cdclake_apply_phase_seconds",
        "Wall seconds of each phase of the last apply, before its commit.",
        labels=["table", "phase"],
    )
    last = GaugeMetricFamily(
        "cdclake_apply_last_success_timestamp_seconds", "Commit time of the last apply (unix s).", labels=["table"]
    )
    fresh = GaugeMetricFamily(
        "cdclake_table_freshness_seconds",
        'Freshness, by="commit": age of the oldest acked staging object not yet visible (0: none); '
        'by="event": now minus the newest applied event time.',
        labels=["table", "by"],
    )
    objective = GaugeMetricFamily(
        "cdclake_table_freshness_objective_seconds",
        "The table's freshness objective (by commit time).",
        labels=["table"],
    )
    pending = GaugeMetricFamily("cdclake_table_pending_objects", "Staging objects not yet applied.", labels=["table"])
    up = GaugeMetricFamily("cdclake_lake_metrics_up", "1 if the last read of the lake for these metrics succeeded.")
    unreadable = GaugeMetricFamily(
        "cdclake_table_unreadable",
        "1 for a table whose metadata cannot be read: cdc_apply skips it (nothing else is known of it).",
        labels=["table"],
    )
    for f in found:
        if f.unreadable is not None:
            unreadable.add_metric([f.table], 1.0)
            continue
        totals = totals_of(f.last_apply)
        for outcome in OUTCOMES:
            if outcome in totals:
                events.add_metric([f.table, outcome], totals[outcome])
        if "applies" in totals:
            applies.add_metric([f.table], totals["applies"])
        for phase, seconds in sorted(phases_of(f.last_apply).items()):
            phases.add_metric([f.table, phase], seconds)
        if f.last_apply_ms is not None:
            last.add_metric([f.table], f.last_apply_ms / 1000)
        fresh.add_metric([f.table, "commit"], f.by_commit_s)
        if f.by_event_s is not None:
            fresh.add_metric([f.table, "event"], f.by_event_s)
        objective.add_metric([f.table], f.objective_s)
        pending.add_metric([f.table], f.pending_objects)
    up.add_metric([], 1.0 if ok else 0.0)
    return [events, applies, phases, last, fresh, objective, pending, up, unreadable]
