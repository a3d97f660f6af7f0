"""How fresh each CDC table is, measured two ways that are never mixed up:

* **by commit time**: how long acked data has been waiting to become visible, i.e. the age of the
  oldest staging object the table has not consumed, in the staging store's clock (the clock that
  named it, :mod:`cdclake.staging.clock`); 0 when nothing is pending. The freshness objective
  (``CDCLAKE_FRESHNESS_OBJECTIVE_S``, per table ``freshness_objective_s``) is judged on this one:
  ``dags/cdc_freshness.py`` fails when a table misses it.
* **by event time**: now minus valid-through (the newest applied ``_cdc_ts``, from the
  manifests: :mod:`cdclake.lake.health`). A quiet source, or one sending old events, makes it
  large while nothing waits: it says how old the data is, not whether the pipeline keeps up.

pyiceberg and a staging listing only, no JVM: the DAG's check and the REST catalog's /metrics.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cdclake import staging
from cdclake.config.settings import Settings
from cdclake.config.tables import load_table_config
from cdclake.staging import stores
from cdclake.staging.clock import StoreClock


@dataclass(frozen=True)
class Freshness:
    table: str
    objective_s: int
    pending_objects: int
    oldest_pending_ms: int | None
    """Landing time (store clock) of the oldest staging object the table has not consumed."""
    now_ms: int
    """The store's clock (its lower bound) after the listing."""
    last_apply: dict[str, str] = field(default_factory=dict)
    """Summary of the last apply's commit: watermark, counts, running totals, phase seconds."""
    last_apply_ms: int | None = None
    valid_through_ms: int | None = None
    """Newest applied event time; None when not asked for (or the table is empty)."""
    unreadable: str | None = None
    """Why the table's metadata cannot be read; then nothing else is known of it (no watermark:
    its pending objects are not counted) and ``cdc_freshness`` fails naming it."""
    held: tuple[str, ...] = ()
    """The expectations holding the table's publish (:mod:`cdclake.lake.holds`), each with why;
    ``cdc_freshness`` fails naming them."""

    def describe_held(self) -> str:
        return f"{self.table}: " + "; ".join(self.held) + f" (nothing published; `cdclake holds release {self.table}`)"

    @property
    def by_commit_s(self) -> float:
        """Seconds the oldest acked, not yet visible object has waited; 0 when none waits."""
        if self.oldest_pending_ms is None:
            return 0.0
        return max(0.0, (self.now_ms - self.oldest_pending_ms) / 1000)

    @property
    def by_event_s(self) -> float | None:
        return None if self.valid_through_ms is None else (self.now_ms - self.valid_through_ms) / 1000

    @property
    def missed(self) -> bool:
        return self.by_commit_s > self.objective_s

    def describe_unreadable(self) -> str:
        return f"{self.table}: its metadata cannot be read ({self.unreadable}); cdc_apply skips it"

    def describe(self) -> str:
        return (
            f"{self.table}: acked data has waited {self.by_commit_s:.0f} s to become visible "
            f"(freshness by commit time; oldest of {self.pending_objects} pending staging objects), "
            f"objective {self.objective_s} s"
        )


def table_freshness(
    settings: Settings, store: staging.Store | None = None, event_time: bool = False
) -> list[Freshness]:
    """Every CDC table with a staging folder or an Iceberg table, by name; ``event_time`` also
    reads valid-through from the manifests (every data file's metadata: not free)."""
    from cdclake.lake.catalog import UnreadableTable, load_table, pending_by_table, summary_of, watermark_snapshot
    from cdclake.lake.health import cdc_tables, table_health

    store = store or stores.open_store(settings)
    config = load_table_config(settings)
    from cdclake.lake.holds import held

    pending = pending_by_table(settings, store)  # leaves an unreadable table out: its row below says why
    holds = {t: tuple(f"{f.expectation}: {f.detail}" for f in h.failures) for t, h in held(store).items()}
    # After the listing: an object that landed during it is not older than now.
    now_ms = StoreClock(store).lower_ms()
    out = []
    for table in sorted(set(store.tables()) | set(cdc_tables(settings))):
        objective = config.freshness_objective_s(table, settings)
        try:
            t = load_table(settings, table)
            health = table_health(settings, table) if event_time and t is not None else None
        except UnreadableTable as exc:
            out.append(Freshness(table, objective, 0, None, now_ms, unreadable=exc.reason))
            continue
        snap = watermark_snapshot(t) if t is not None else None
        out.append(
            Freshness(
                table=table,
                objective_s=objective,
                pending_objects=len(pending.get(table, [])),
                oldest_pending_ms=min((k.landed_ms for k in pending.get(table, [])), default=None),
                now_ms=now_ms,
                last_apply=summary_of(snap),
                last_apply_ms=snap.timestamp_ms if snap is not None else None,
                valid_through_ms=health.valid_through_ms if health is not None else None,
                held=holds.get(table, ()),
            )
        )
    return out
