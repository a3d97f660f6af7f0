"""``DELETE .../tables/{t}?purgeRequested=true``: drop the table and delete its files, only its own.

A purge deletes what the dropped table's metadata names (data and delete files, manifests,
manifest lists, metadata files), as pyiceberg's ``MetastoreCatalog.purge_table`` does, but only
a file that is

* inside the warehouse (manifests are written by clients: they may name any path),
* under one of the dropped table's own roots (its location, its ``write.*.path`` properties:
  :mod:`cdclake.lake.placement`): a file it names elsewhere was not made for it,
* and under no root of any table still in the catalog: one that shares the dropped table's
  files (a table registered over the same metadata before :mod:`restcatalog.overlaps` refused
  that, or one made by another writer) keeps them.

A table whose metadata cannot be read is dropped and nothing is deleted: what it owned is not
known. The roots of the others are read after the row is gone and under the placement lock, so
no table takes the place while its files are deleted.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Protocol

from pyiceberg.catalog import MANIFEST, MANIFEST_LIST, METADATA, PREVIOUS_METADATA, delete_data_files, delete_files
from pyiceberg.io import FileIO, InputFile, OutputFile, load_file_io
from pyiceberg.manifest import ManifestFile
from pyiceberg.typedef import Identifier

from cdclake.lake.placement import Place, roots_of
from restcatalog import locations

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from pyiceberg.catalog.sql import SqlCatalog

log = logging.getLogger("restcatalog")


class ConfinedIO(FileIO):
    """Deletes only inside the warehouse, under ``own`` roots and under none of ``others``'."""

    def __init__(self, inner: FileIO, warehouse: str, own: Place, others: list[Place]) -> None:
        super().__init__(inner.properties)
        self._inner = inner
        self._warehouse = warehouse
        self._own = own
        self._others = others
        self.skipped = 0

    def new_input(self, location: str) -> InputFile:
        return self._inner.new_input(location)

    def new_output(self, location: str) -> OutputFile:
        return self._inner.new_output(location)

    def may_delete(self, path: str) -> bool:
        inside_own = any(locations.within(path, root) for root in self._own.roots)
        return locations.within(path, self._warehouse) and inside_own and not any(p.holds(path) for p in self._others)

    def delete(self, location: str | InputFile | OutputFile) -> None:
        path = location if isinstance(location, str) else location.location
        if not self.may_delete(path):
            self.skipped += 1
            log.warning("purge keeps a file that is not the dropped table's alone", extra={"path": path})
            return
        self._inner.delete(location)


class Purging(Protocol):
    """What a purge needs of :class:`restcatalog.catalog.Catalog` (which calls it)."""

    @property
    def sql(self) -> SqlCatalog: ...
    @property
    def placing(self) -> AbstractContextManager[Any]: ...
    @property
    def warehouse(self) -> str: ...
    def places(self, *skip: Identifier) -> list[Place]: ...


def purge(catalog: Purging, ident: Identifier) -> None:
    sql = catalog.sql
    with catalog.placing:
        try:
            table = sql.load_table(ident)
        except (OSError, ValueError) as exc:
            log.warning(
                "purge drops a table whose metadata is unreadable; deletes nothing", extra={"reason": repr(exc)}
            )
            sql.drop_table(ident)
            return
        sql.drop_table(ident)
        meta = table.metadata
        own = Place(ident, roots_of(meta.location, meta.properties))
        inner = load_file_io(sql.properties, table.metadata_location)
        io = ConfinedIO(inner, catalog.warehouse, own, catalog.places())
        manifests: list[ManifestFile] = []
        lists: set[str] = set()
        for snapshot in meta.snapshots:
            manifests += snapshot.manifests(io)
            lists.add(snapshot.manifest_list)
        delete_data_files(io, manifests)
        delete_files(io, {m.manifest_path for m in manifests}, MANIFEST)
        delete_files(io, lists, MANIFEST_LIST)
        delete_files(io, {e.metadata_file for e in meta.metadata_log}, PREVIOUS_METADATA)
        delete_files(io, {table.metadata_location}, METADATA)
    if io.skipped:
        log.info("purge kept files", extra={"table": ".".join(ident), "kept": io.skipped})
