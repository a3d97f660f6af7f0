"""How much landed data waits to be applied: the receiver's backpressure signal.

Refreshed in the background from the staging listing and the tables' watermarks (the same
:func:`cdclake.catalog.pending_tables` the apply DAG plans with); between refreshes every landing
counts one more object, so a burst is seen before the next refresh.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from cdclake import staging
from cdclake.settings import Settings

log = logging.getLogger("cdclake.receiver")
HEALTH_EVERY_S = 60.0


class Backlog:
    def __init__(self, settings: Settings, store: staging.Store) -> None:
        self.settings = settings
        self.store = store
        self.per_table: dict[str, int] = {}
        self.error: str | None = None
        self.health: dict[str, dict[str, Any]] = {}
        self._health_at = 0.0

    @property
    def total(self) -> int:
        return sum(self.per_table.values())

    @property
    def utilization(self) -> float:
        return min(1.0, self.total / self.settings.backlog_hard)

    def add(self, tables: list[str]) -> None:
        for t in tables:
            self.per_table[t] = self.per_table.get(t, 0) + 1

    def suggested_delay_ms(self) -> int:
        """0 below the soft limit, then rising linearly to 5 s at the hard limit."""
        soft, hard, n = self.settings.backlog_soft, self.settings.backlog_hard, self.total
        if n <= soft:
            return 0
        return int(100 + 4900 * min(1.0, (n - soft) / max(1, hard - soft)))

    def refresh(self) -> None:
        """Blocking: lists staging and reads watermarks (pyiceberg). Run it in a thread."""
        from cdclake.catalog import pending_tables

        try:
            self.per_table = pending_tables(self.settings, store=self.store)
            self.error = None
        except Exception as exc:  # a missing catalog or an unreachable store must not stop intake
            self.error = f"{type(exc).__name__}: {exc}"
            log.warning("backlog refresh failed: %s", self.error)
        if time.monotonic() - self._health_at >= HEALTH_EVERY_S:
            self._health_at = time.monotonic()
            self.refresh_health()

    def refresh_health(self) -> None:
        """Table health and freshness (manifests only, no data read), for /metrics."""
        from cdclake.health import cdc_tables, table_health

        try:
            out = {}
            for table in cdc_tables(self.settings):
                h = table_health(self.settings, table)
                if h is not None:
                    out[table] = h.as_dict()
            self.health = out
        except Exception as exc:
            log.warning("table health refresh failed: %s: %s", type(exc).__name__, exc)
