"""Which tables count against ``CDCLAKE_MAX_TABLES``: the tables that exist, and those a landing in
flight is creating.

A table exists when the catalog holds it (a CDC table the apply created) or staging holds at
least one of its objects (landed, waiting for the apply that creates it). What does not count: a
staging folder with no object left (a local store keeps the folder after its objects go), and a
table named only by a batch that did not land (refused after its claim, failed, or a duplicate's).
A batch's new tables are *held* from its claim until its landing ends; then they exist (landed)
or are given back at once. So ids a client invents, and batches refused after their claim,
cannot use up the lake's table slots: only data that landed can.

Listed in the background with the backlog (:mod:`receiver.backlog`): the tables with pending
objects (the same listing) and the catalog's; when the catalog cannot be read, its last good
listing stands in (tables are rarely dropped), never the tables merely held since.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Iterable

from cdclake import staging
from cdclake.config.settings import Settings

log = logging.getLogger("cdclake.receiver")


class TableSlots:
    def __init__(self, settings: Settings, store: staging.Store) -> None:
        self.settings = settings
        self.store = store
        self.known: set[str] | None = None
        """Tables that count; None until first listed (then nothing is refused for a slot)."""
        self.held: Counter[str] = Counter()
        self._listed: set[str] = set()
        self._landed: set[str] = set()  # landed since the current listing began
        self._catalog: set[str] | None = None  # the last good listing of the catalog's tables
        # Landings (the event loop) and listings (a worker thread) both change these.
        self._lock = threading.Lock()

    def hold(self, tables: Iterable[str]) -> None:
        """A landing is creating ``tables``: they count until it ends."""
        with self._lock:
            self.held.update(tables)
            if self.known is not None:
                self.known.update(tables)

    def release(self, tables: Iterable[str], landed: bool) -> None:
        """The landing that held ``tables`` ended: they exist (``landed``), or their slots return."""
        with self._lock:
            for t in tables:
                self.held[t] -= 1
                if self.held[t] <= 0:
                    del self.held[t]
                if landed:
                    self._note(t)
                elif self.known is not None and t not in self.held and t not in self._listed | self._landed:
                    self.known.discard(t)

    def landed(self, tables: Iterable[str]) -> None:
        """Objects of ``tables`` just landed: they exist from now on."""
        with self._lock:
            for t in tables:
                self._note(t)

    def _note(self, table: str) -> None:
        self._landed.add(table)
        if self.known is not None:
            self.known.add(table)

    def begin_listing(self) -> None:
        self._landed = set()

    def ensure(self) -> None:
        """Before the first listing: the staging folders, listed now (once). Folders, not objects:
        the first batch must not wait for a walk of staging; the refresh corrects it seconds later."""
        if self.known is not None:
            return
        try:
            folders = set(self.store.tables())
        except Exception as exc:  # the store is down (batches go to the spool): unknown
            log.warning("listing staging tables failed: %s: %s", type(exc).__name__, exc)
            return
        with self._lock:
            if self.known is None:
                self.known = folders | self._landed | set(self.held)

    def load(self, staged: set[str] | None) -> None:
        """Which tables exist: ``staged`` (those with staging objects; None: that listing failed,
        so the staging folders stand in) and the catalog's CDC tables."""
        from cdclake.lake.health import cdc_tables

        try:
            self._catalog = set(cdc_tables(self.settings))
        except Exception as exc:
            log.warning("listing catalog tables failed: %s: %s", type(exc).__name__, exc)
        if staged is None or self._catalog is None:
            try:
                folders = set(self.store.tables())
            except Exception as exc:
                log.warning("listing staging tables failed: %s: %s", type(exc).__name__, exc)
                return
            staged = folders if staged is None else staged
            # The catalog never read yet: the folders stand in (a local store keeps an applied table's).
            catalog = folders if self._catalog is None else self._catalog
        else:
            catalog = self._catalog
        with self._lock:
            self._listed = staged | catalog
            self.known = self._listed | self._landed | set(self.held)
