"""Table health from Iceberg metadata alone (pyiceberg, no JVM): file counts, small files, delete
files, snapshots, and freshness (``valid-through``: the newest applied event time, read from the
``_cdc_ts`` upper bounds in the manifests). Used to pick compaction candidates and for metrics."""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from cdclake.config.maintenance import MIN_INPUT_FILES, TARGET_FILE_SIZE_BYTES
from cdclake.config.settings import Settings

log = logging.getLogger("cdclake.lake.health")

SMALL_FRACTION = 0.75
"""A data file under this fraction of the target size is small (compaction rewrites them)."""


@dataclass(frozen=True)
class TableHealth:
    table: str
    data_files: int
    small_files: int
    max_small_files_per_partition: int
    delete_files: int
    snapshots: int
    rows: int
    valid_through_ms: int | None
    """Newest event time (``_cdc_ts``) in the table's data files; None if empty or unknown."""
    last_commit_ms: int | None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def needs_compaction(self, min_files: int) -> bool:
        return self.max_small_files_per_partition >= min_files or self.delete_files > 0


def table_health(settings: Settings, table: str, target_file_size: int = TARGET_FILE_SIZE_BYTES) -> TableHealth | None:
    from cdclake.lake.catalog import load_table

    t = load_table(settings, table)
    if t is None:
        return None
    snap = t.current_snapshot()
    if snap is None:
        return TableHealth(table, 0, 0, 0, 0, len(t.metadata.snapshots), 0, None, None)
    files = t.inspect.files().to_pylist()
    data = [f for f in files if f["content"] == 0]
    deletes = [f for f in files if f["content"] != 0]
    small = [f for f in data if f["file_size_in_bytes"] < SMALL_FRACTION * target_file_size]
    per_partition = Counter(repr(sorted((f.get("partition") or {}).items())) for f in small)
    newest: datetime | None = None
    for f in data:
        ts = ((f.get("readable_metrics") or {}).get("_cdc_ts") or {}).get("upper_bound")
        if isinstance(ts, datetime) and (newest is None or ts > newest):
            newest = ts
    return TableHealth(
        table=table,
        data_files=len(data),
        small_files=len(small),
        max_small_files_per_partition=max(per_partition.values(), default=0),
        delete_files=len(deletes),
        snapshots=len(t.metadata.snapshots),
        rows=sum(int(f["record_count"]) for f in data),
        valid_through_ms=int(newest.timestamp() * 1000) if newest else None,
        last_commit_ms=snap.timestamp_ms,
    )


def all_tables(settings: Settings) -> list[str]:
    """Every table of the namespace, side tables included; none before the first apply."""
    from pyiceberg.exceptions import NoSuchNamespaceError

    from cdclake.lake.catalog import open_catalog

    try:
        return sorted(i[-1] for i in open_catalog(settings).list_tables(settings.namespace))
    except NoSuchNamespaceError:
        return []


def cdc_tables(settings: Settings) -> list[str]:
    """The namespace's CDC tables (side tables ``<t>__changes`` etc. excluded)."""
    from cdclake.contracts.events import RESERVED_SUFFIXES

    return [n for n in all_tables(settings) if not n.endswith(RESERVED_SUFFIXES)]


def compaction_candidates(
    settings: Settings,
    min_files: int = MIN_INPUT_FILES,
    target_file_size: int = TARGET_FILE_SIZE_BYTES,
    only: list[str] | None = None,
) -> dict[str, dict[str, Any]]:
    """Tables (side tables included) whose partitions hold ``min_files`` small files, or that
    carry delete files, with their health. A table whose metadata cannot be read is left out
    (logged): nothing can compact it, and the others are not held up."""
    from cdclake.lake.catalog import UnreadableTable

    names = all_tables(settings)
    wanted = {t.lower() for t in only} if only else None
    out = {}
    for name in names:
        if wanted is not None and name not in wanted:
            continue
        try:
            h = table_health(settings, name, target_file_size)
        except UnreadableTable as exc:
            log.error("%s", exc)
            continue
        if h is not None and h.needs_compaction(min_files):
            out[name] = h.as_dict()
    return out
