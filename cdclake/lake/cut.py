"""Several tables read at one catalog state: a consistent cut.

A reader that loads tables one at a time (pyiceberg, or Spark's catalog once per table reference)
can straddle a publish: :mod:`cdclake.lake.publish` moves every table's ``main`` in ONE
transaction over the catalog's ``iceberg_tables`` rows, but a reader that loads ``orders`` after
that transaction and ``order_lines`` before it sees half of it. Here the rows of all the tables
are read in ONE SELECT (one statement: one database snapshot, so all of a publish or none of it),
and each row's metadata file then gives that table's ``main``. A metadata file never changes once
written, so reading the files after the SELECT still reads the state the rows named.

A cut at a source position is taken from the same read: per table, the newest snapshot in the
ancestry of that ``main`` whose summary carries the source's position
(``cdclake.source-position.<source>``, :mod:`cdclake.contracts.watermark`) at or before the
position asked for. Walking from one cut matters: loaded one by one, a table loaded after a
publish and another before it could answer for different sets of publishes when the position
asked for lies beyond the older one.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from cdclake.config.settings import Settings
from cdclake.contracts.watermark import positions_of
from cdclake.lake import positions, publish


class NoSnapshotAtPosition(LookupError):
    """A table has no snapshot carrying the source's position at or before the one asked for."""


def table_metadata(settings: Settings, tables: Sequence[str]) -> dict[str, dict[str, Any]]:
    """The raw metadata of the namespace's ``tables`` as ONE read of their catalog rows names
    them. Raises pyiceberg's NoSuchTableError naming the tables that are not there."""
    from cdclake.lake.catalog import open_catalog

    catalog = open_catalog(settings)
    found = publish.locations(catalog, [(settings.namespace, t) for t in dict.fromkeys(tables)])
    return {name: publish.read_metadata(publish.file_io(catalog, loc), loc) for (_, name), loc in found.items()}


def current_snapshots(settings: Settings, tables: Sequence[str]) -> dict[str, int | None]:
    """Each table's ``main`` at one catalog state (None: a table with no snapshot yet)."""
    metas = table_metadata(settings, tables)
    return {t: publish.main_of(metas[t]) for t in dict.fromkeys(tables)}


def snapshots_at_position(settings: Settings, tables: Sequence[str], source: str, position: str) -> dict[str, int]:
    """Each table's newest snapshot at or before ``source``'s ``position``, from one catalog
    state; :class:`NoSnapshotAtPosition` naming the first table (in ``tables``' order) that has none."""
    metas = table_metadata(settings, tables)
    return {t: at_position(metas[t], t, source, position) for t in dict.fromkeys(tables)}


def at_position(meta: Mapping[str, Any], table: str, source: str, position: str) -> int:
    """The newest snapshot of ``main``'s ancestry in ``meta`` whose ``source`` position is at
    or before ``position``. Snapshots without one (maintenance, a write outside a consistent
    publish) are passed over: the first carrying one at or before is what the table held then."""
    newer: str | None = None
    for snap in ancestry(meta):
        got = positions_of(snap.get("summary") or {}).get(source)
        if got is None:
            continue
        if covered(got, position):
            return int(snap["snapshot-id"])
        newer = got
    later = f" (its oldest is {newer})" if newer is not None else ""
    raise NoSnapshotAtPosition(
        f"{table} has no snapshot at or before position {position} of source {source}{later}: it was "
        "not published by a consistent publish of that source then, or that snapshot has been expired "
        "(CDCLAKE_SNAPSHOTS_AT_MOST, iceberg_expire)"
    )


def covered(position: str, asked: str) -> bool:
    """Whether a snapshot's ``position`` lies at or before ``asked``. A GTID position may be a
    set, one GTID per domain (:func:`cdclake.lake.positions.greatest`): every one must be."""
    parts = [position] if positions.key(position) is not None else position.split(",")
    return all(positions.before(p, asked) for p in parts)


def ancestry(meta: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    """The snapshots of ``main`` and its ancestors in raw metadata, newest first."""
    by_id = {s["snapshot-id"]: s for s in meta.get("snapshots", [])}
    snap = by_id.get(publish.main_of(meta))
    seen = 0
    while snap is not None and seen <= len(by_id):  # the bound: a cycle in a corrupt file
        yield snap
        seen += 1
        snap = by_id.get(snap.get("parent-snapshot-id"))
