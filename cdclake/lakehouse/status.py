"""Per-table status of the lake, read with pyiceberg and the staging listing alone (no JVM): what
the Lakehouse page of the Airflow UI and its JSON API show.

Every table of the namespace (side tables included) and every table that has staging objects
but no Iceberg table yet. Two freshness figures, named for what they measure:

* ``freshness_event_s``: now - valid-through (the newest applied ``_cdc_ts``): how old the newest
  change the table holds is, by event time;
* ``freshness_commit_s``: how long acked data has waited to be committed: the age of the oldest
  pending staging object (object names carry their landing time), 0 when nothing is pending;
  ``since_commit_s`` beside it is the time since the table's last commit of any kind.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from cdclake import staging
from cdclake.config.settings import Settings
from cdclake.contracts.events import QUARANTINE_SUFFIX
from cdclake.contracts.history import REPLAYED_AT
from cdclake.contracts.watermark import EVENT_COUNTS, counts_of
from cdclake.staging import stores

if TYPE_CHECKING:
    from pyiceberg.table import Table

TOP_REASONS = 3
REASON_COLUMN = "_cdc_reason"


@dataclass(frozen=True)
class LastApply:
    snapshot_id: int
    committed_ms: int
    counts: dict[str, int | None]
    """:data:`~cdclake.contracts.watermark.EVENT_COUNTS` of the apply, None where not recorded."""


@dataclass(frozen=True)
class TableStatus:
    table: str
    exists: bool
    """False: staging objects wait for the table's first apply."""
    rows: int
    data_files: int
    small_files: int
    delete_files: int
    snapshots: int
    compaction_candidate: bool
    last_apply: LastApply | None
    last_commit_ms: int | None
    valid_through_ms: int | None
    pending_objects: int
    oldest_pending_ms: int | None
    quarantined: int | None
    """Rows of ``<table>__quarantine`` not replayed yet; None when there is no such table."""
    top_reasons: list[tuple[str, int]]
    freshness_event_s: float | None
    freshness_commit_s: float
    since_commit_s: float | None
    held: list[str] = field(default_factory=list)
    """The expectations holding the table's publish, each with why (:mod:`cdclake.lake.holds`)."""
    released: bool = False
    """An operator released the hold: the next apply publishes once."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def live_rows(table: Table, fallback: int) -> int:
    """Rows a reader sees: the current snapshot's records minus its position deletes (what
    merge-on-read MERGE and DELETE write), from the summary totals; ``fallback`` without them."""
    snap = table.current_snapshot()
    props = snap.summary.additional_properties if snap is not None and snap.summary is not None else {}
    try:
        return int(props["total-records"]) - int(props.get("total-position-deletes", 0))
    except (KeyError, ValueError):
        return fallback


def last_apply(table: Table) -> LastApply | None:
    """The newest snapshot in the current ancestry that carries the apply watermark, and its
    accounting (received = applied + duplicate + superseded + late + quarantined)."""
    from cdclake.lake.catalog import summary_of, watermark_snapshot

    snap = watermark_snapshot(table)
    if snap is None:
        return None
    counts = counts_of(summary_of(snap))
    return LastApply(snap.snapshot_id, int(snap.timestamp_ms), dict(zip(EVENT_COUNTS, counts, strict=True)))


def quarantine_reasons(settings: Settings, table: str) -> tuple[int | None, list[tuple[str, int]]]:
    """Rows of ``<table>__quarantine`` not replayed yet and their most common reasons; (None, [])
    without the table, (rows, []) when it has no reason column. Only those two columns are read."""
    from cdclake.lake.catalog import load_table

    side = load_table(settings, table + QUARANTINE_SUFFIX)
    if side is None:
        return None, []
    if REASON_COLUMN not in {f.name for f in side.schema().fields}:
        return live_rows(side, 0), []
    import pyarrow.compute as pc

    columns = {f.name for f in side.schema().fields}
    read = (REASON_COLUMN, *([REPLAYED_AT] if REPLAYED_AT in columns else []))
    rows = side.scan(selected_fields=read).to_arrow()
    if REPLAYED_AT in columns:  # a replayed event is no longer waiting for a fix
        rows = rows.filter(pc.is_null(rows.column(REPLAYED_AT)))
    reasons = rows.column(REASON_COLUMN).to_pylist()
    counted = Counter(str(r) for r in reasons)
    return len(reasons), sorted(counted.items(), key=lambda kv: (-kv[1], kv[0]))[:TOP_REASONS]


def _age_s(now_ms: int, then_ms: int | None) -> float | None:
    return None if then_ms is None else max(0.0, (now_ms - then_ms) / 1000)


def table_status(
    settings: Settings, table: str, pending: list[staging.ObjectKey], now_ms: int, min_files: int = 5
) -> TableStatus:
    """One table's status; ``pending`` are its staging objects not consumed yet."""
    from cdclake.lake.catalog import load_table
    from cdclake.lake.health import table_health

    health = table_health(settings, table)
    t = load_table(settings, table) if health is not None else None
    oldest = min((k.landed_ms for k in pending), default=None)
    quarantined, reasons = quarantine_reasons(settings, table) if t is not None else (None, [])
    return TableStatus(
        table=table,
        exists=t is not None,
        rows=live_rows(t, health.rows) if t is not None and health is not None else 0,
        data_files=health.data_files if health else 0,
        small_files=health.small_files if health else 0,
        delete_files=health.delete_files if health else 0,
        snapshots=health.snapshots if health else 0,
        compaction_candidate=bool(health and health.needs_compaction(min_files)),
        last_apply=last_apply(t) if t is not None else None,
        last_commit_ms=health.last_commit_ms if health else None,
        valid_through_ms=health.valid_through_ms if health else None,
        pending_objects=len(pending),
        oldest_pending_ms=oldest,
        quarantined=quarantined,
        top_reasons=reasons,
        freshness_event_s=_age_s(now_ms, health.valid_through_ms if health else None),
        freshness_commit_s=_age_s(now_ms, oldest) or 0.0,
        since_commit_s=_age_s(now_ms, health.last_commit_ms if health else None),
    )


def lake_status(
    settings: Settings, now_ms: int, min_files: int = 5, store: staging.Store | None = None
) -> list[TableStatus]:
    """Every table of the namespace and every table with staging objects, by name."""
    from cdclake.lake.catalog import pending_by_table
    from cdclake.lake.health import all_tables
    from cdclake.lake.holds import held

    store = store or stores.open_store(settings)
    by_table = pending_by_table(settings, store)
    holds = held(store)
    names = sorted(set(all_tables(settings)) | set(by_table))
    out = [table_status(settings, n, by_table.get(n, []), now_ms, min_files) for n in names]
    return [
        replace(s, held=[f"{f.expectation}: {f.detail}" for f in h.failures], released=h.released)
        if (h := holds.get(s.table))
        else s
        for s in out
    ]
