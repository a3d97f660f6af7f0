"""One catalog commit that publishes snapshots staged on several tables, all or none.

A writer stages a snapshot on each table (Spark write-audit-publish: ``write.wap.enabled`` and
``spark.wap.id``; the snapshot is in the table's metadata, its ``main`` ref untouched). Here every
table's ``main`` moves to its staged snapshot in ONE database transaction over the catalog's
``iceberg_tables`` rows, each row by compare-and-swap on its metadata location (what Iceberg
Java's JdbcTableOperations and pyiceberg's SqlCatalog do per table, so a concurrent Spark commit
and this publish cannot both win). Iceberg's JDBC catalog has no multi-table commit; the rows in
one transaction are the one place where all tables can move at once.

Each table's new metadata file is its current one's JSON with only the fields a ref move changes
(``refs``, ``current-snapshot-id``, ``last-updated-ms``, ``snapshot-log``, ``metadata-log``, and
the published snapshot's ``timestamp-ms``, set to the publish time like its log entry);
everything else is copied as it is. Not through pyiceberg's model: pyiceberg 0.12 cannot write
format v3 metadata (iceberg-python #1551), our CDC tables are v3, and its rewrite of a
Java-written v2 file changes fields a ref move does not touch (design note 31).

Every table's log entry gets the same timestamp, so ``TIMESTAMP AS OF`` sees all of a publish
or none of it. A publish is refused (:class:`CommitFailedException`, which the apply's conflict
retry re-runs) when a table's ``main`` is no longer the snapshot its staged write was based on:
a publish checked against whatever main is now would silently drop the commits made in between
(measured in the spike). Refused or failed before the commit, the files it wrote are deleted.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import re
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from cdclake.config.maintenance import SMALL_FILE_BYTES
from cdclake.config.settings import Settings

if TYPE_CHECKING:
    from pyiceberg.catalog.sql import SqlCatalog
    from pyiceberg.io import FileIO
    from pyiceberg.table import Table

Identifier = tuple[str, str]  # (namespace, table name)
Move = tuple[int, int | None]  # (staged snapshot id, the main it was based on; None: no snapshot yet)
MAIN = "main"
WAP_ID = "wap.id"  # the summary property Iceberg gives a snapshot staged under spark.wap.id
WAP_ENABLED = "write.wap.enabled"
_KEEP_LOG = "write.metadata.previous-versions-max"
_KEEP_LOG_DEFAULT = 100  # Iceberg's default for the property above
DELETE_AFTER_COMMIT = "write.metadata.delete-after-commit.enabled"


class Published(NamedTuple):
    location: str  # the table's new metadata file
    snapshots: int  # how many snapshots it holds
    small_files: tuple[int, int] = (0, 0)  # :func:`small_files_since_rewrite` of its old main and its new


@dataclass(frozen=True)
class _Planned:
    ident: Identifier
    old: str  # the metadata location the row must still hold
    new: str  # the location written here
    io: FileIO
    snapshots: int
    dropped: tuple[str, ...] = ()  # metadata files the new log no longer names, deleted once committed
    small_files: tuple[int, int] = (0, 0)


def publish_tables(settings: Settings, moves: Mapping[str, Move], **hooks: Any) -> dict[str, Published]:
    """:func:`publish` for tables of the settings' namespace, by name."""
    from cdclake.lake.catalog import open_catalog

    done = publish(open_catalog(settings), {(settings.namespace, t): m for t, m in moves.items()}, **hooks)
    return {ident[1]: p for ident, p in done.items()}


def publish(
    catalog: SqlCatalog,
    moves: Mapping[Identifier, Move],
    before_swap: Callable[[], None] | None = None,
    clock: Callable[[], float] = time.time,
) -> dict[Identifier, Published]:
    """Move each table's ``main`` to its staged snapshot, all tables or none; their new metadata
    files. ``before_swap`` runs between writing the files and the transaction (tests inject a
    concurrent commit there)."""
    from pyiceberg.exceptions import CommitFailedException

    if not moves:
        return {}
    current = locations(catalog, list(moves))
    metas = {ident: read_metadata(file_io(catalog, loc), loc) for ident, loc in current.items()}
    # One timestamp for every table, never before a table's own last update (Iceberg refuses a
    # log that goes back in time).
    now_ms = max([int(clock() * 1000), *(int(m.get("last-updated-ms", 0)) for m in metas.values())])
    written: list[_Planned] = []
    committing = False
    try:
        for ident, move in moves.items():
            new = patched(metas[ident], current[ident], ident, move, now_ms)
            small = (small_files_since_rewrite(metas[ident]), small_files_since_rewrite(new))
            written.append(
                _write(catalog, ident, current[ident], new, dropped(metas[ident], current[ident], new), small)
            )
        if before_swap is not None:
            before_swap()
        with _session(catalog) as session:
            for p in written:
                _swap(catalog, session, p)
            committing = True  # from here the outcome is unknown if it fails: keep the files
            session.commit()
    except BaseException as exc:
        if not committing or isinstance(exc, CommitFailedException):
            _delete(written)
        raise
    for p in written:
        for gone in p.dropped:
            # Committed: nothing may fail the publish now. One left behind is an orphan the clean-up removes.
            with contextlib.suppress(Exception):
                p.io.delete(gone)
    return {p.ident: Published(p.new, p.snapshots, p.small_files) for p in written}


def dropped(meta: Mapping[str, Any], old: str, new: Mapping[str, Any]) -> tuple[str, ...]:
    """The metadata files that ``meta``'s log names and its successor ``new``'s does not (never
    ``old``, ``meta``'s own file, which a reader may have just found in the catalog),
    where the table asks for them to be deleted (``write.metadata.delete-after-commit.enabled``,
    as Iceberg Java's commits do): else every commit's file stays until the orphan clean-up."""
    if str((meta.get("properties") or {}).get(DELETE_AFTER_COMMIT, "false")).lower() != "true":
        return ()
    before = {e["metadata-file"] for e in meta.get("metadata-log", [])}
    return tuple(sorted(before - {e["metadata-file"] for e in new.get("metadata-log", [])} - {old}))


def staged_snapshot(table: Table, wap_id: str) -> Move | None:
    """The snapshot staged in ``table`` under ``wap_id`` and its parent; None if there is none.
    Two would mean the id was used for two writes, which stage side by side on the same main and
    cannot both be published: refused."""
    found = [
        s
        for s in table.metadata.snapshots
        if s.summary is not None and s.summary.additional_properties.get(WAP_ID) == wap_id
    ]
    if len(found) > 1:
        raise ValueError(f"{len(found)} snapshots staged under one write-audit-publish id {wap_id!r}")
    return (found[0].snapshot_id, found[0].parent_snapshot_id) if found else None


ADDED_FILES, REMOVED_FILES, ADDED_SIZE = "added-data-files", "deleted-data-files", "added-files-size"


def small_files_since_rewrite(meta: Mapping[str, Any], small_bytes: int = SMALL_FILE_BYTES) -> int:
    """The small data files ``main`` gained since its newest rewrite of data files (a ``replace``
    snapshot that removed some: compaction): per commit whose added files averaged under
    ``small_bytes``, the data files it added less those it removed (a copy-on-write MERGE replaces
    the files it changes). Read from the snapshots' summaries alone, no manifest; a summary
    without the sizes, or with a value that is not a number (another engine's), counts nothing:
    this count never fails a publish. Without a rewrite in its kept history, as far back as that
    goes (an expired ancestor ends the walk)."""
    by_id = {s.get("snapshot-id"): s for s in meta.get("snapshots", [])}
    snap, n, seen = by_id.get(main_of(meta)), 0, 0
    while snap is not None and seen <= len(by_id):  # the bound: a cycle in a corrupt file
        summary = snap.get("summary") or {}
        added, removed, size = (_count(summary, k) for k in (ADDED_FILES, REMOVED_FILES, ADDED_SIZE))
        if summary.get("operation") == "replace" and removed:
            break  # a rewrite of data files (a rewrite of manifests alone is a replace too)
        if added and size is not None and size < added * small_bytes:
            n += max(0, added - (removed or 0))
        snap, seen = by_id.get(snap.get("parent-snapshot-id")), seen + 1
    return n


def _count(summary: Mapping[str, Any], key: str) -> int | None:
    """A snapshot summary's count (Iceberg writes them as strings and leaves out a zero: 0 then,
    except for the size); None: not a number."""
    value = summary.get(key, None if key == ADDED_SIZE else 0)
    try:
        return None if value is None else int(value)
    except (TypeError, ValueError):
        return None


def main_of(meta: Mapping[str, Any]) -> int | None:
    """The snapshot ``main`` names in raw table metadata; None for a table without one."""
    ref = (meta.get("refs") or {}).get(MAIN)
    sid = ref.get("snapshot-id") if ref else meta.get("current-snapshot-id")
    return None if sid is None or sid == -1 else int(sid)


def patched(meta: dict[str, Any], old: str, ident: Identifier, move: Move, now_ms: int) -> dict[str, Any]:
    """``meta`` with ``main`` on the staged snapshot: the five fields a ref move changes, the
    rest as it is. Raises CommitFailedException when ``main`` is not the expected one, or the
    staged snapshot is gone (expired) or does not descend from it."""
    from pyiceberg.exceptions import CommitFailedException

    sid, expected = move
    name = ".".join(ident)
    main = main_of(meta)
    if main != expected:
        raise CommitFailedException(
            f"Requirement failed: {name}: branch main has changed: expected {expected}, is {main}"
        )
    line = _ancestry(meta, sid)
    if not line:
        raise CommitFailedException(f"{name}: snapshot {sid} is not in the table (expired?)")
    if expected is not None and expected not in line:
        raise CommitFailedException(f"{name}: snapshot {sid} does not descend from main {expected}")
    refs = dict(meta.get("refs") or {})
    refs[MAIN] = {**refs.get(MAIN, {}), "snapshot-id": sid, "type": "branch"}
    # At least one, as Iceberg Java keeps: the file just replaced stays named (and undeleted).
    keep = max(1, int((meta.get("properties") or {}).get(_KEEP_LOG, _KEEP_LOG_DEFAULT)))
    metadata_log = [*meta.get("metadata-log", []), {"timestamp-ms": meta["last-updated-ms"], "metadata-file": old}]
    # The snapshot's own time is when it became visible: the staged write's time is earlier than
    # its log entry, and a reader who travels to a snapshot's committed_at (`<t>.snapshots`,
    # `cdclake snapshots`) would otherwise land before it. Its timestamp is in this file alone.
    snapshots = [{**s, "timestamp-ms": now_ms} if s.get("snapshot-id") == sid else s for s in meta.get("snapshots", [])]
    return {
        **meta,
        "snapshots": snapshots,
        "refs": refs,
        "current-snapshot-id": sid,
        "last-updated-ms": now_ms,
        "snapshot-log": [*meta.get("snapshot-log", []), {"timestamp-ms": now_ms, "snapshot-id": sid}],
        "metadata-log": metadata_log[-keep:],
    }


def _ancestry(meta: Mapping[str, Any], sid: int) -> list[int]:
    by_id = {s["snapshot-id"]: s for s in meta.get("snapshots", [])}
    out: list[int] = []
    snap = by_id.get(sid)
    while snap is not None and len(out) <= len(by_id):  # the bound: a cycle in a corrupt file
        out.append(snap["snapshot-id"])
        snap = by_id.get(snap.get("parent-snapshot-id"))
    return out


def locations(catalog: SqlCatalog, idents: list[Identifier]) -> dict[Identifier, str]:
    """The tables' current metadata locations, in one read of the catalog rows."""
    from pyiceberg.catalog.sql import IcebergTables
    from pyiceberg.exceptions import NoSuchTableError
    from sqlalchemy import and_, or_, select

    t = IcebergTables
    wanted = or_(*(and_(t.table_namespace == ns, t.table_name == name) for ns, name in idents))
    with _session(catalog) as session:
        rows = session.execute(
            select(t.table_namespace, t.table_name, t.metadata_location).where(t.catalog_name == catalog.name, wanted)
        ).all()
    found = {(ns, name): loc for ns, name, loc in rows if loc}
    missing = [".".join(i) for i in idents if i not in found]
    if missing:
        raise NoSuchTableError(f"Tables do not exist: {', '.join(missing)}")
    return found


def _swap(catalog: SqlCatalog, session: Any, p: _Planned) -> None:
    ns, name = p.ident
    swap_row(session, catalog.name, ns, name, p.old, p.new)


def swap_row(session: Any, catalog_name: str, ns: str, name: str, old: str, new: str) -> None:
    """Point a table's catalog row from metadata ``old`` to ``new`` inside ``session``'s
    transaction, only if it still names ``old`` (SqlCatalog.commit_table's compare-and-swap);
    :class:`CommitFailedException` otherwise, and the caller's transaction rolls back whole. The
    REST catalog's multi-table commit makes its swaps with it too."""
    from pyiceberg.catalog.sql import IcebergTables as t
    from pyiceberg.exceptions import CommitFailedException
    from sqlalchemy import update

    result = session.execute(
        update(t)
        .where(
            t.catalog_name == catalog_name,
            t.table_namespace == ns,
            t.table_name == name,
            t.metadata_location == old,
        )
        .values(metadata_location=new, previous_metadata_location=old)
    )
    if result.rowcount < 1:
        raise CommitFailedException(f"Table has been updated by another process: {ns}.{name}")


def _session(catalog: SqlCatalog) -> Any:
    from sqlalchemy.orm import Session

    return Session(catalog.engine)


def file_io(catalog: SqlCatalog, location: str) -> FileIO:
    from pyiceberg.io import load_file_io

    return load_file_io(dict(catalog.properties), location)


def read_metadata(io: FileIO, location: str) -> dict[str, Any]:
    with io.new_input(location).open() as stream:
        data = stream.read()
    if data[:2] == b"\x1f\x8b":  # a .gz.metadata.json (write.metadata.compression-codec=gzip)
        data = gzip.decompress(data)
    meta: dict[str, Any] = json.loads(data)
    return meta


def _next_location(old: str) -> str:
    """The next version's name beside ``old``, as Iceberg names them: ``NNNNN-<uuid>.metadata.json``."""
    head, name = old.rsplit("/", 1)
    m = re.match(r"^(\d+)-.*?((?:\.gz)?\.metadata\.json)$", name)
    version, suffix = (int(m.group(1)) + 1, m.group(2)) if m else (0, ".metadata.json")
    return f"{head}/{version:05d}-{uuid.uuid4()}{suffix}"


def _write(
    catalog: SqlCatalog,
    ident: Identifier,
    old: str,
    meta: dict[str, Any],
    gone: tuple[str, ...] = (),
    small_files: tuple[int, int] = (0, 0),
) -> _Planned:
    from pyiceberg.table.metadata import TableMetadataUtil

    text = json.dumps(meta)
    TableMetadataUtil.parse_raw(text)  # still valid table metadata, or nothing is written
    new = _next_location(old)
    io = file_io(catalog, new)
    with io.new_output(new).create(overwrite=False) as stream:
        raw = text.encode()
        stream.write(gzip.compress(raw) if new.endswith(".gz.metadata.json") else raw)
    return _Planned(ident, old, new, io, len(meta.get("snapshots", [])), gone, small_files)


def _delete(written: list[_Planned]) -> None:
    """Files no catalog row will ever name; one left behind (this process died) is an orphan the
    orphan-file clean-up removes."""
    for p in written:
        with contextlib.suppress(OSError):
            p.io.delete(p.new)
