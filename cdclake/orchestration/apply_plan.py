"""Which apply runs a ``cdc_apply`` run makes of the pending staging objects, and which runs a
draining task takes on between its passes.

The run's plan (its first task) groups the tables with pending objects into at most
``CDCLAKE_APPLY_TASKS`` tasks, and each task drains its group (``spark_jobs.group``). A table whose
data first lands after the plan is in no group: it would wait for the next DAG run, queued
behind the draining one for up to ``CDCLAKE_APPLY_DRAIN_S`` (120 s by default) while the busy
tables are applied every few seconds. So between passes a draining task looks again
(:class:`Discovery`) and takes on the new tables that fall to it (:func:`owner`, a hash of the
run's first table), never a table the plan gave to a task.

The plan hands discovery out only to a run of one apply task (the default on a small local
master). With several, a new table's owner may already have left its drain (its own tables went
quiet), and the others cannot tell which tasks still drain: the table would wait as before, and
two tasks whose looks saw different transactions could both take a unit (correct under the
per-table lock, but sharing the cores).
"""

from __future__ import annotations

import json
import logging
import time
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from cdclake.config.settings import Settings
from cdclake.lake import catalog, selection
from cdclake.orchestration.dag_support import apply_units
from cdclake.staging.store import Store
from cdclake.staging.stores import open_store

log = logging.getLogger("cdclake.apply_plan")

DISCOVERY_SHARE = 20
"""A look for new tables costs a staging listing and a metadata read per table outside the run
(about what the plan's own look costs): the next look waits this many times as long as the last
one took, so after the first look, looking costs at most 1/20 of a drain's time whatever the
number of tables (a few tables: every pass)."""

DISCOVERY_TAKEN_MAX_CHARS = 32_768
"""The plan hands every task the tables it planned, in the task's arguments (a command line with
spark-submit, where one argument may not exceed 128 KiB; and XCom, once per task). A run that
planned more tables than fit here does not discover: new tables wait for the next DAG run."""


def discovery_fits(taken: Sequence[str]) -> bool:
    """May a run that planned ``taken`` hand them to its tasks (:data:`DISCOVERY_TAKEN_MAX_CHARS`)?"""
    return len(json.dumps(taken)) <= DISCOVERY_TAKEN_MAX_CHARS


@dataclass(frozen=True)
class Planned:
    units: dict[str, list[str]]
    """The runs, by their first table: the tables each applies and publishes together."""
    weights: dict[str, int]
    """Pending staging objects per run."""


def pending_units(
    settings: Settings, only: Sequence[str] = (), unreadable: dict[str, str] | None = None, store: Store | None = None
) -> Planned:
    """The tables with pending objects (all, or ``only`` those) as apply runs: the tables that
    share a source's transactions (``CDCLAKE_CONSISTENT_PUBLISH``) in one run. ``store``: the
    staging store, opened once by a caller that looks again and again."""
    store = store or open_store(settings)
    pending = catalog.pending_tables(settings, only=list(only), store=store, unreadable=unreadable)
    landings = selection.survey(store) if settings.consistent_publish and pending else {}
    units = apply_units(pending, lambda t: selection.unit([t], landings))
    return Planned(units, {first: sum(pending.get(t, 0) for t in tables) for first, tables in units.items()})


def run_argv(tables: Iterable[str], max_objects: int | str) -> list[str]:
    """One apply run's arguments (``spark_jobs.apply``)."""
    return [a for t in tables for a in ("--table", t)] + ["--max-objects", str(max_objects)]


def owner(first: str, tasks: int) -> int:
    """The task (0 .. tasks-1) that takes on a run found after the plan: stable across processes."""
    return zlib.crc32(first.encode()) % tasks


class Discovery:
    """Called between a drain's passes: the runs of tables that got pending objects since the
    plan and fall to task ``task`` of ``tasks`` (:func:`owner`), each returned once."""

    def __init__(
        self,
        settings: Settings,
        taken: Iterable[str],
        task: int,
        tasks: int,
        max_objects: int | str,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings, self.task, self.tasks, self.max_objects = settings, task, tasks, max_objects
        self.taken = set(taken)
        self.clock = clock
        self.next_at = 0.0
        self.store: Store | None = None

    def __call__(self) -> list[list[str]]:
        start = self.clock()
        if start < self.next_at:
            return []
        try:
            self.store = self.store or open_store(self.settings)
            outside = [t for t in self.store.tables() if t not in self.taken]
            unreadable: dict[str, str] = {}
            found = pending_units(self.settings, outside, unreadable, self.store).units if outside else {}
            self.taken.update(unreadable)  # logged once: the next DAG run's plan names it again
        except Exception:  # the drain goes on with its own tables; the next DAG run's plan looks again
            log.warning("looking for tables pending since the plan failed", exc_info=True)
            found = {}
        runs = []
        for first, tables in sorted(found.items()):
            if self.taken.isdisjoint(tables) and owner(first, self.tasks) == self.task:
                self.taken.update(tables)
                runs.append(run_argv(tables, self.max_objects))
        self.next_at = start + DISCOVERY_SHARE * (self.clock() - start)
        if runs:
            log.info("taking on %d runs found after the plan: %s", len(runs), runs)
        return runs
