"""pyiceberg access to the shared catalog: the light way for DAG tasks to read table state
without starting a JVM. pyiceberg is imported lazily."""

from __future__ import annotations

import functools
import logging
import threading
from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING

from cdclake import staging
from cdclake.config.settings import Settings
from cdclake.contracts import watermark
from cdclake.staging import stores

if TYPE_CHECKING:
    from pyiceberg.catalog.sql import SqlCatalog
    from pyiceberg.table import Table
    from pyiceberg.table.snapshots import Snapshot


log = logging.getLogger("cdclake.lake.catalog")


def io_properties(settings: Settings) -> dict[str, str]:
    """pyiceberg FileIO properties for an S3 warehouse, from the S3 settings staging shares."""
    if not settings.warehouse_on_s3:
        return {}
    out = {"s3.region": settings.s3_region, "s3.force-virtual-addressing": str(not settings.s3_path_style).lower()}
    if settings.s3_endpoint:
        out["s3.endpoint"] = settings.s3_endpoint
    if settings.s3_access_key:
        out["s3.access-key-id"] = settings.s3_access_key
        out["s3.secret-access-key"] = settings.s3_secret_key
    return out


_opening = threading.Lock()


def open_catalog(settings: Settings) -> SqlCatalog:
    # One thread at a time: two first opens at once both create the catalog's tables in the
    # database, and the second fails ("table iceberg_tables already exists").
    with _opening:
        return _catalog(
            settings.catalog_name,
            settings.catalog_db_url,
            settings.warehouse,
            tuple(sorted(io_properties(settings).items())),
        )


@functools.lru_cache(maxsize=8)
def _catalog(name: str, url: str, warehouse: str, io: tuple[tuple[str, str], ...] = ()) -> SqlCatalog:
    # One SQLAlchemy engine per catalog and process, not one per call.
    from pyiceberg.catalog.sql import SqlCatalog

    return SqlCatalog(name, uri=url, warehouse=warehouse, schema_version="v1", **dict(io))


class UnreadableTable(Exception):
    """A table the catalog lists whose metadata file cannot be read: lost (a purge of a table
    sharing its files, a hand-made deletion) or not Iceberg metadata. Nothing can apply to it or
    maintain it until an operator restores the file or drops the table; every other table goes on."""

    def __init__(self, table: str, reason: str) -> None:
        super().__init__(
            f"TABLE UNREADABLE {table}: its metadata cannot be read ({reason}); it is skipped until its "
            "metadata file is restored or the table is dropped"
        )
        self.table = table
        self.reason = reason


def load_table(settings: Settings, table: str) -> Table | None:
    """The namespace's ``table``; None if there is none. Raises :class:`UnreadableTable`."""
    from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

    try:
        return open_catalog(settings).load_table((settings.namespace, table))
    except (NoSuchTableError, NoSuchNamespaceError):
        return None
    except (OSError, ValueError) as exc:  # the file is gone or unreadable, not the row
        raise UnreadableTable(table, f"{type(exc).__name__}: {exc}") from exc


def watermark_snapshot(t: Table) -> Snapshot | None:
    """The newest snapshot in ``t``'s current ancestry that carries a watermark (maintenance
    snapshots carry none, staged write-audit-publish snapshots are not ancestors)."""
    current = t.current_snapshot()
    if current is None:
        return None
    from pyiceberg.table.snapshots import ancestors_of

    return watermark.newest_carrying(
        ancestors_of(current, t.metadata), lambda s: s.summary.additional_properties if s.summary else None
    )


def summary_of(snap: Snapshot | None) -> dict[str, str]:
    """A snapshot's summary properties (watermark, counts, totals, phases); empty without one."""
    return dict(snap.summary.additional_properties) if snap is not None and snap.summary is not None else {}


def applied_summary(settings: Settings, table: str) -> dict[str, str]:
    """The summary of the last apply's commit (the newest watermark snapshot); empty if none."""
    t = load_table(settings, table)
    return summary_of(watermark_snapshot(t) if t is not None else None)


def table_watermark(settings: Settings, table: str) -> watermark.Watermark | None:
    """The newest watermark in the current snapshot's ancestry; None if no such table."""
    return table_state(settings, table)[0]


def table_state(settings: Settings, table: str) -> tuple[watermark.Watermark | None, int]:
    """:func:`table_watermark` and the rows the current snapshot's data files hold (deletes not
    subtracted: an estimate of the table's size), from one load of the table."""
    t = load_table(settings, table)
    if t is None:
        return None, 0
    current = t.current_snapshot()
    rows = int(current.summary.get("total-records") or 0) if current and current.summary else 0
    snap = watermark_snapshot(t)
    if snap is None or snap.summary is None:
        return watermark.Watermark(), rows
    return watermark.Watermark.decode(snap.summary.additional_properties[watermark.SUMMARY_KEY]), rows


def pending_objects(
    settings: Settings,
    only: list[str] | None = None,
    store: staging.Store | None = None,
    unreadable: dict[str, str] | None = None,
) -> Iterator[staging.ObjectKey]:
    """Staging objects their table has not consumed yet, table by table. A table whose metadata
    cannot be read has no known watermark: it is left out (logged, and put in ``unreadable``
    with the reason), so one lost table never stops the others' applies."""
    store = store or stores.open_store(settings)
    wanted = {t.lower() for t in only} if only else None
    for table in store.tables():
        if wanted is not None and table not in wanted:
            continue
        try:
            wm = table_watermark(settings, table) or watermark.Watermark()
        except UnreadableTable as exc:
            log.warning("%s", exc)
            if unreadable is not None:
                unreadable[table] = exc.reason
            continue
        yield from (k for k in store.list(table, after=wm.low) if not wm.consumed(k.name))


def pending_by_table(
    settings: Settings, store: staging.Store | None = None, unreadable: dict[str, str] | None = None
) -> dict[str, list[staging.ObjectKey]]:
    """Staging objects not consumed yet, by table (oldest first: listings are in name order)."""
    out: dict[str, list[staging.ObjectKey]] = {}
    for key in pending_objects(settings, store=store, unreadable=unreadable):
        out.setdefault(key.table, []).append(key)
    return out


def pending_tables(
    settings: Settings,
    only: list[str] | None = None,
    store: staging.Store | None = None,
    unreadable: dict[str, str] | None = None,
) -> dict[str, int]:
    """Tables with staging objects not yet consumed, and how many (``unreadable``: see
    :func:`pending_objects`)."""
    return dict(Counter(k.table for k in pending_objects(settings, only, store, unreadable)))
