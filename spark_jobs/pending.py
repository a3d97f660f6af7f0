"""What one apply run consumes: the staging objects no watermark holds yet, or exactly the objects
a crashed run logged in a side table but never committed to the table.

Every write carries its own consumed-staging watermark (:mod:`cdclake.contracts.watermark`). This
version publishes a run's side tables and table in one catalog commit (:mod:`spark_jobs.stage`),
so a side table's watermark is never ahead of the table's and the resume below finds nothing.
The resume is for tables an older cdclake left that way only: it committed the side tables
before the table, and a crash between those commits left the side tables holding a run the
table never got."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql import SparkSession

from cdclake import staging
from cdclake.config.settings import Settings
from cdclake.contracts import history
from cdclake.contracts.events import CHANGES_SUFFIX, QUARANTINE_SUFFIX, TOMBSTONES_SUFFIX
from cdclake.contracts.watermark import SUMMARY_KEY, Watermark
from cdclake.lake.catalog import table_state, table_watermark
from cdclake.lake.spark import table_ident
from cdclake.staging import stores
from cdclake.staging.clock import StoreClock
from cdclake.staging.names import ObjectKey

CHANGES, QUARANTINE, TOMBSTONES = CHANGES_SUFFIX, QUARANTINE_SUFFIX, TOMBSTONES_SUFFIX
SIDE_TABLES = (QUARANTINE, CHANGES, TOMBSTONES)
HISTORY_OBJECT = history.HISTORY_OBJECT  # the staging object an event of __changes/__quarantine came in


@dataclass
class Run:
    spark: SparkSession
    settings: Settings
    table: str
    listed: list[str]
    horizon: str

    def ident(self, suffix: str = "") -> str:
        return table_ident(self.settings, self.table + suffix)

    def watermark_props(self, wm: Watermark, consumed: Sequence[str]) -> dict[str, str]:
        return {SUMMARY_KEY: wm.advance(consumed, self.listed, self.horizon).encode()}


@dataclass
class Pending:
    """The objects this run consumes and the table's watermark they were chosen against."""

    run: Run
    watermark: Watermark  # the main table's
    names: list[str]
    uris: list[str]
    resumed: bool  # finishing a crashed run's objects
    backlog: int  # objects no watermark of the table holds, this run's included
    rows: int  # the table's rows, about (deletes not subtracted): how classify joins the batch
    recorded: list[Any] | None = None  # the objects' JSON types, from their receipts (or None: infer)
    # The events of the objects' batches, all tables (None: unknown): a bound to choose plans by, never a count.
    events_at_most: int | None = None


@dataclass
class Listing:
    """A table's staging objects no watermark holds, before a run picks from them."""

    run: Run
    watermark: Watermark
    unconsumed: list[ObjectKey]
    resumed: list[ObjectKey]  # a crashed older run's objects: the run takes exactly these
    rows: int

    @property
    def candidates(self) -> list[str]:
        """The names a run may take, in listing order."""
        return [k.name for k in self.resumed or self.unconsumed]


def list_table(spark: SparkSession, settings: Settings, table: str) -> Listing:
    store = stores.open_store(settings)
    # pyiceberg reads the snapshot ancestry in milliseconds; the same query through Spark SQL
    # costs seconds of planning on a fresh JVM (docs/benchmarks.md, "A JVM per task").
    found, rows = table_state(settings, table)
    wm_main = found or Watermark()
    # The store's clock, which named the objects, not this host's (see cdclake.staging.clock).
    listed_at_ms = StoreClock(store).lower_ms()
    listed_keys = list(store.list(table, after=wm_main.low))
    unconsumed = [k for k in listed_keys if not wm_main.consumed(k.name)]
    # A crashed run of an older cdclake logged its decisions in side tables the main table never
    # caught up with: the re-run first finishes exactly those objects (their events keep those
    # decisions); objects that landed since wait for the next run.
    logged = aux_watermarks(settings, table)
    resumed = [k for k in unconsumed if any(wm.consumed(k.name) for wm in logged)]
    run = Run(
        spark,
        settings,
        table,
        [k.name for k in listed_keys],
        staging.horizon(listed_at_ms - settings.landing_grace_s * 1000),
    )
    return Listing(run, wm_main, unconsumed, resumed, rows)


def pending_of(listing: Listing, names: Sequence[str] | None, max_objects: int) -> Pending:
    """The run's objects: a crashed run's (``resumed``), else ``names`` (chosen by
    :mod:`cdclake.lake.selection`), else the first ``max_objects``."""
    if listing.resumed:
        pending = listing.resumed
    elif names is not None:
        wanted = set(names)
        pending = [k for k in listing.unconsumed if k.name in wanted]
    else:
        pending = listing.unconsumed[:max_objects]
    store = stores.open_store(listing.run.settings)
    receipts = staging.naming_receipts(store, pending)
    return Pending(
        listing.run,
        listing.watermark,
        names=[k.name for k in pending],
        uris=[store.uri(k) for k in pending],
        resumed=bool(listing.resumed),
        backlog=len(listing.unconsumed),
        rows=listing.rows,
        recorded=staging.recorded_types(store, pending, receipts),
        events_at_most=None if None in receipts else sum(r.events for r in receipts if r is not None),
    )


def list_pending(spark: SparkSession, settings: Settings, table: str, max_objects: int) -> Pending:
    return pending_of(list_table(spark, settings, table), None, max_objects)


def aux_watermarks(settings: Settings, table: str) -> list[Watermark]:
    """The watermarks the side tables' own commits carry (none for a side table never written)."""
    found = (table_watermark(settings, table + suffix) for suffix in (QUARANTINE, CHANGES, TOMBSTONES))
    return [wm for wm in found if wm is not None]


def aux_watermark(run: Run, suffix: str, wm_main: Watermark) -> Watermark:
    # An aux table holds everything the main table consumed (published with it), plus, left by an
    # older cdclake's crash, the objects of a run that did not reach the main commit.
    wm = table_watermark(run.settings, run.table + suffix)
    return wm_main if wm is None else wm.union(wm_main)
