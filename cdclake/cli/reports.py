"""``cdclake tables`` and ``cdclake snapshots``: reports read with pyiceberg (no JVM).

pyiceberg is imported inside functions: ``cdclake`` imports stay light.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from cdclake.cli.output import Result
from cdclake.config.settings import Settings
from cdclake.contracts.watermark import EVENT_COUNTS, SUMMARY_KEY, counts_of
from cdclake.lakehouse.status import live_rows
from cdclake.query.statements import EPOCH, QueryError


def _ms_time(ms: int | None) -> datetime | None:
    return None if ms is None else EPOCH + timedelta(milliseconds=ms)


def last_applied_ms(table: Any) -> int | None:
    """Commit time of the newest snapshot in the current ancestry that carries the apply watermark."""
    from cdclake.lake.catalog import watermark_snapshot

    snap = watermark_snapshot(table)
    return None if snap is None else int(snap.timestamp_ms)


def tables_report(settings: Settings, now: datetime | None = None) -> Result:
    """Every table of the namespace (side tables included): live rows, data and delete files,
    snapshots, last apply (commit time of the newest snapshot with the apply watermark),
    valid-through (the newest ``_cdc_ts`` in the data files), and freshness both ways
    (:mod:`cdclake.lake.freshness`): by event time (now - valid-through: old events make it large)
    and, for a CDC table, by commit time (how long its oldest pending staging object has waited)."""
    from cdclake.lake.catalog import load_table
    from cdclake.lake.freshness import table_freshness
    from cdclake.lake.health import all_tables, table_health

    now = now or datetime.now(UTC)
    waiting = {f.table: f for f in table_freshness(settings)}
    columns = [
        "table",
        "rows",
        "data_files",
        "delete_files",
        "snapshots",
        "last_applied",
        "valid_through",
        "freshness_by_event_time",
        "pending_objects",
        "freshness_by_commit_time",
    ]
    rows = []
    for name in all_tables(settings):
        h = table_health(settings, name)
        t = load_table(settings, name)
        if h is None or t is None:
            continue  # dropped meanwhile
        valid = _ms_time(h.valid_through_ms)
        f = waiting.get(name)
        rows.append(
            (
                name,
                live_rows(t, h.rows),
                h.data_files,
                h.delete_files,
                h.snapshots,
                _ms_time(last_applied_ms(t)),
                valid,
                None if valid is None else now - valid,
                None if f is None else f.pending_objects,
                None if f is None else timedelta(seconds=round(f.by_commit_s)),
            )
        )
    return Result(columns, rows)


def resolve_table(settings: Settings, name: str) -> str:
    """``orders``, ``cdc.orders`` or ``lake.cdc.orders`` -> ``orders``."""
    parts = [p.strip("`").lower() for p in name.split(".")]
    ok = (
        len(parts) <= 3
        and all(parts)
        and (len(parts) < 3 or parts[0] == settings.catalog_name.lower())
        and (len(parts) < 2 or parts[-2] == settings.namespace.lower())
    )
    if not ok:
        raise QueryError(
            f"{name!r}: name a table as <table>, {settings.namespace}.<table> or "
            f"{settings.catalog_name}.{settings.namespace}.<table>"
        )
    return parts[-1]


def snapshots_report(settings: Settings, table: str) -> Result:
    """Every snapshot of a table, oldest first, with its apply watermark flag and the
    ``cdclake.events-*`` accounting of the apply that made it."""
    from pyiceberg.table.snapshots import ancestors_of

    from cdclake.lake.catalog import load_table
    from cdclake.lake.health import all_tables

    name = resolve_table(settings, table)
    t = load_table(settings, name)
    if t is None:
        known = ", ".join(all_tables(settings)) or "none yet"
        raise QueryError(f"no table {settings.catalog_name}.{settings.namespace}.{name} (tables: {known})")
    current = t.current_snapshot()
    on_main = {s.snapshot_id for s in ancestors_of(current, t.metadata)} if current is not None else set()
    columns = [
        "snapshot_id",
        "parent_id",
        "committed_at",
        "operation",
        "current_ancestor",
        "watermark",
        *EVENT_COUNTS,
    ]
    rows = []
    for s in sorted(t.metadata.snapshots, key=lambda s: (s.timestamp_ms, s.sequence_number or 0)):
        props = dict(s.summary.additional_properties) if s.summary is not None else {}
        counts = counts_of(props)
        rows.append(
            (
                s.snapshot_id,
                s.parent_snapshot_id,
                _ms_time(s.timestamp_ms),
                s.summary.operation.value if s.summary is not None else None,
                s.snapshot_id in on_main,
                SUMMARY_KEY in props,
                *counts,
            )
        )
    return Result(columns, rows)
