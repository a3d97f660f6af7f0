"""How much landed data waits to be applied, per table and per producer, and which tables exist
(:mod:`receiver.slots`): the receiver's backpressure signal and its fan-out bookkeeping.

Refreshed in the background from the staging listing and the tables' watermarks (the same
:func:`cdclake.lake.catalog.pending_objects` the apply DAG plans with; object names carry their
producer); between refreshes every landing counts one more object per table, so a burst is seen
before the next refresh.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from typing import Any

from cdclake import staging
from cdclake.config.settings import Settings
from receiver.rejected import Rejected
from receiver.slots import TableSlots

log = logging.getLogger("cdclake.receiver")
HEALTH_EVERY_S = 60.0


class Backlog:
    def __init__(self, settings: Settings, store: staging.Store) -> None:
        self.settings = settings
        self.store = store
        self.per_table: dict[str, int] = {}
        self.per_source: dict[str, int] = {}
        self.slots = TableSlots(settings, store)
        """The tables that count against CDCLAKE_MAX_TABLES (receiver.slots)."""
        self.error: str | None = None
        self.health: dict[str, dict[str, Any]] = {}
        self._health_at = 0.0

    @property
    def total(self) -> int:
        return sum(self.per_table.values())

    @property
    def utilization(self) -> float:
        return min(1.0, self.total / self.settings.backlog_hard)

    def add(self, tables: list[str], source: str) -> None:
        for t in tables:
            self.per_table[t] = self.per_table.get(t, 0) + 1
        self.per_source[source] = self.per_source.get(source, 0) + len(tables)
        self.slots.landed(tables)

    def suggested_delay_ms(self) -> int:
        """0 below the soft limit, then rising linearly to 5 s at the hard limit."""
        soft, hard, n = self.settings.backlog_soft, self.settings.backlog_hard, self.total
        if n <= soft:
            return 0
        return int(100 + 4900 * min(1.0, (n - soft) / max(1, hard - soft)))

    def refusal(self, source: str | None) -> Rejected | None:
        """503 buffer_full when the whole backlog, or ``source``'s share of it, is at its limit."""
        hard, n = self.settings.backlog_hard, self.total
        if n >= hard:
            why = f"{n} staging objects wait to be applied, at the limit {hard} (CDCLAKE_BACKLOG_HARD)"
            return Rejected(503, "buffer_full", why, None, {"retryDelayMs": 5000})
        quota = self.settings.source_backlog_limit
        mine = self.per_source.get(source, 0) if source is not None else 0
        if mine >= quota:
            why = (
                f"{mine} staging objects of producer {source!r} wait to be applied, at its limit {quota} "
                "(CDCLAKE_BACKLOG_PER_SOURCE; default a quarter of CDCLAKE_BACKLOG_HARD)"
            )
            return Rejected(503, "buffer_full", why, None, {"retryDelayMs": 5000})
        return None

    # ------------------------------------------------------------------ blocking: run in a thread

    def refresh(self) -> None:
        """Lists staging and reads watermarks (pyiceberg)."""
        from cdclake.lake.catalog import pending_objects

        self.slots.begin_listing()
        staged: set[str] | None = None
        try:
            tables, sources = Counter[str](), Counter[str]()
            for key in pending_objects(self.settings, store=self.store):
                tables[key.table] += 1
                sources[key.source] += 1
            self.per_table, self.per_source = dict(tables), dict(sources)
            # A table not in the catalog has all its objects pending: these are the tables with
            # staging objects, as far as the catalog's do not count anyway.
            staged = set(tables)
            self.error = None
        except Exception as exc:  # a missing catalog or an unreachable store must not stop intake
            self.error = f"{type(exc).__name__}: {exc}"
            log.warning("backlog refresh failed: %s", self.error)
        self.slots.load(staged)
        if time.monotonic() - self._health_at >= HEALTH_EVERY_S:
            self._health_at = time.monotonic()
            self.refresh_health()

    def refresh_health(self) -> None:
        """Table health and freshness (manifests only, no data read), for /metrics."""
        from cdclake.lake.health import cdc_tables, table_health

        try:
            out = {}
            for table in cdc_tables(self.settings):
                h = table_health(self.settings, table)
                if h is not None:
                    out[table] = h.as_dict()
            self.health = out
        except Exception as exc:
            log.warning("table health refresh failed: %s: %s", type(exc).__name__, exc)
