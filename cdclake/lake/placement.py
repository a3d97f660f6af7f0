"""Where each table lives, and the rule that keeps tables apart.

A table's **roots** are its ``location`` and the value of each location-like property
(``write.data.path``, ``write.metadata.path``, ... :func:`is_location_property`): the places it
writes into. Its maintenance treats everything under them as its own: ``remove_orphan_files``
deletes what the table does not reference under its location, and a purge deletes what its
manifests list. So two live tables whose roots **overlap** — one inside the other's, either way
— can destroy each other's files. The rule: no table's roots overlap another live table's.
The REST catalog enforces it on create, register and location changes
(``restcatalog/overlaps.py``) and confines a purge to the dropped table's own roots; the
maintenance DAG skips orphan removal for a table that breaks it (one made before the rule).

Overlap is path-segment aware (``.../cdc/t`` and ``.../cdc/t2`` are apart), compares schemes
``s3``/``s3a``/``s3n`` as one, ignores letter case (a case-insensitive store would make two
spellings one place), and holds if it holds in any reading of either location: the literal text
(what FileIOs write) or a percent-decoding of it (what a tool that decodes URIs would use).

A catalog row whose metadata file cannot be read still holds its place: its roots are guessed
from where the metadata file is (the folder above ``metadata/``).
"""

from __future__ import annotations

import logging
import posixpath
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit

from cdclake.config.settings import Settings

if TYPE_CHECKING:
    from pyiceberg.catalog.sql import SqlCatalog
    from pyiceberg.table.metadata import TableMetadata

log = logging.getLogger("cdclake.lake.placement")

_S3 = {"s3", "s3a", "s3n"}
MAX_DECODES = 3
"""Deeper percent-encoding than this is not interpreted (the REST catalog refuses it)."""


def is_location_property(key: str) -> bool:
    """Table properties that name a place to write: Iceberg's ``write.data.path``,
    ``write.metadata.path``, ``write.object-storage.path``, ``write.folder-storage.path``, and
    any other ``*.path`` / ``*location`` key an engine may honour."""
    k = key.lower()
    return k.endswith(".path") or k.endswith("location")


def split(uri: str) -> tuple[str, str, str]:
    """``(scheme, netloc, path)``; no scheme is ``file``, and the S3 schemes are one."""
    parts = urlsplit(uri)
    scheme = (parts.scheme or "file").lower()
    return ("s3" if scheme in _S3 else scheme), parts.netloc, parts.path


def readings(path: str) -> list[str] | None:
    """The literal path and each percent-decoding of it until it stops changing; None if it
    is still changing after :data:`MAX_DECODES`."""
    out = [path]
    for _ in range(MAX_DECODES):
        decoded = unquote(out[-1])
        if decoded == out[-1]:
            return out
        out.append(decoded)
    return None if unquote(out[-1]) != out[-1] else out


def _places(uri: str) -> tuple[str, set[str]]:
    """``scheme://netloc`` and the normalized paths of every reading, without letter case."""
    try:
        scheme, netloc, path = split(uri)
    except ValueError:
        scheme, netloc, path = "file", "", uri
    found = readings(path) or [path]
    return f"{scheme}://{netloc}".casefold(), {posixpath.normpath(r or "/").casefold() for r in found}


def _nested(inner: str, outer: str) -> bool:
    return inner == outer or inner.startswith(outer.rstrip("/") + "/")


def inside(uri: str, root: str) -> bool:
    """Whether some reading of ``uri`` is ``root`` or below some reading of it."""
    (a_base, a_paths), (b_base, b_paths) = _places(uri), _places(root)
    return a_base == b_base and any(_nested(a, b) for a in a_paths for b in b_paths)


def overlap(a: str, b: str) -> bool:
    """Whether ``a`` and ``b`` name the same place, or one lies inside the other."""
    return inside(a, b) or inside(b, a)


@dataclass(frozen=True)
class Place:
    ident: tuple[str, ...]
    roots: tuple[str, ...]
    unreadable: str | None = None
    """Why the metadata could not be read; the roots are then guessed from its file's folder."""

    def holds(self, uri: str) -> bool:
        """Whether ``uri`` is under one of this table's roots."""
        return any(inside(uri, r) for r in self.roots)

    def overlaps(self, uri: str) -> bool:
        return any(overlap(uri, r) for r in self.roots)


def roots_of(location: str, properties: Mapping[str, str]) -> tuple[str, ...]:
    """A table's roots: its location and its location-like properties' values."""
    found = [location] + [v for k, v in sorted(properties.items()) if is_location_property(k) and v]
    return tuple(dict.fromkeys(r.rstrip("/") or r for r in found))


def guessed_roots(metadata_location: str) -> tuple[str, ...]:
    """Where a table whose metadata cannot be read lives: the folder its ``metadata/`` folder is
    in, or else the metadata file's own folder."""
    folder = metadata_location.rsplit("/", 1)[0]
    parent, _, last = folder.rpartition("/")
    return (parent if last == "metadata" and parent else folder,)


def clash(uri: str, others: Iterable[Place]) -> Place | None:
    """The first of ``others`` whose roots overlap ``uri``."""
    return next((p for p in others if p.overlaps(uri)), None)


def live_places(sql: SqlCatalog, roots: Callable[[str], tuple[str, ...]] | None = None) -> list[Place]:
    """Every table row of the catalog (all namespaces) with its roots, from its current metadata
    file (``roots``: a metadata file's roots; by default read through the catalog's FileIO)."""
    from pyiceberg.catalog.sql import IcebergTables
    from sqlalchemy import select
    from sqlalchemy.orm import Session

    roots = roots or metadata_roots(sql)
    stmt = select(IcebergTables.table_namespace, IcebergTables.table_name, IcebergTables.metadata_location).where(
        IcebergTables.catalog_name == sql.name
    )
    with Session(sql.engine) as session:
        rows = list(session.execute(stmt))
    out = []
    for namespace, name, metadata_location in rows:
        if not metadata_location:
            continue
        ident = (*namespace.split("."), name)
        try:
            out.append(Place(ident, roots(metadata_location)))
        except Exception as exc:  # lost or corrupt: the row still names where the table was
            why = f"{type(exc).__name__}: {exc}"
            log.warning("table %s: metadata unreadable (%s)", ".".join(ident), why)
            out.append(Place(ident, guessed_roots(metadata_location), why))
    return out


def metadata_roots(
    sql: SqlCatalog, read: Callable[[str], TableMetadata] | None = None
) -> Callable[[str], tuple[str, ...]]:
    """A metadata file's roots, read with ``read`` (default: the catalog's FileIO)."""
    from pyiceberg.io import load_file_io
    from pyiceberg.serializers import FromInputFile

    def default(location: str) -> TableMetadata:
        return FromInputFile.table_metadata(load_file_io(sql.properties, location).new_input(location))

    reader = read or default

    def roots(location: str) -> tuple[str, ...]:
        meta = reader(location)
        return roots_of(meta.location, meta.properties)

    return roots


def crowded(places: list[Place], namespace: tuple[str, ...]) -> dict[str, Place]:
    """The readable tables of ``namespace`` whose roots overlap another table's, by name, with
    the first such other: their orphan clean-up would take the other's files for orphans."""
    out = {}
    for p in places:
        if p.ident[:-1] != namespace or p.unreadable is not None:
            continue
        other = next((o for o in places if o is not p and any(o.overlaps(r) for r in p.roots)), None)
        if other is not None:
            out[p.ident[-1]] = other
    return out


def namespace_survey(settings: Settings) -> tuple[dict[str, str], dict[str, Place]]:
    """For the maintenance DAGs, over the pipeline's namespace: the tables whose metadata cannot
    be read (with why), and the readable ones whose places overlap another table's (with that
    other: :func:`crowded`). Every table of the catalog counts as another."""
    from cdclake.lake.catalog import open_catalog

    places = live_places(open_catalog(settings))
    ns = tuple(settings.namespace.split("."))
    unreadable = {p.ident[-1]: p.unreadable for p in places if p.ident[:-1] == ns and p.unreadable is not None}
    return unreadable, crowded(places, ns)
