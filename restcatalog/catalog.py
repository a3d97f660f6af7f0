"""The SQL catalog the pipeline writes, as the REST handlers need it.

Every metadata rule is pyiceberg's: requirements are checked by ``TableRequirement.validate``,
updates applied by ``update_table_metadata`` (both through ``_update_and_stage_table``), files
written by ``_write_metadata``. What is added here: a cache of parsed metadata files, commits of
several tables in one database transaction, confinement of server-side writes and deletes
to the warehouse, and the rule that keeps tables' places apart (:mod:`restcatalog.overlaps`).
"""

from __future__ import annotations

import gzip
import logging
import threading
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from pyiceberg.catalog import Catalog as PyCatalog
from pyiceberg.catalog.sql import IcebergTables, SqlCatalog
from pyiceberg.exceptions import CommitFailedException, NoSuchTableError, TableAlreadyExistsError
from pyiceberg.io import FileIO, load_file_io
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC
from pyiceberg.serializers import Compressor
from pyiceberg.table import CommitTableRequest, Table
from pyiceberg.table.metadata import TableMetadata, TableMetadataUtil, new_table_metadata
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER
from pyiceberg.table.update import AssertCreate
from pyiceberg.typedef import Identifier
from pyiceberg.utils.config import Config
from sqlalchemy import Engine, insert
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from cdclake.config.settings import Settings
from cdclake.lake.catalog import io_properties
from cdclake.lake.placement import Place, live_places, metadata_roots, roots_of
from cdclake.lake.publish import swap_row
from restcatalog import locations, names, overlaps, purge
from restcatalog.errors import IcebergError, bad_request, no_such_namespace, no_such_table
from restcatalog.models import CreateTableRequest

log = logging.getLogger("restcatalog")

# Table properties that make pyiceberg import a class named by the client, in this process.
FORBIDDEN_PROPERTIES = ("py-io-impl", "write.py-location-provider.impl")


@dataclass(frozen=True)
class Loaded:
    """A metadata file: its location (None for a staged create), parsed, and as JSON."""

    location: str | None
    metadata: TableMetadata
    raw: bytes


def serialize(metadata: TableMetadata) -> bytes:
    # As pyiceberg's ToOutputFile writes it, so a cached entry equals the file on disk.
    exclude_none = not Config().get_bool("legacy-current-snapshot-id")
    return metadata.model_dump_json(exclude_none=exclude_none).encode()


class MetadataCache:
    """Parsed metadata files by location. A metadata file is never rewritten (a commit writes a
    new one), so an entry never goes stale; the bound keeps memory flat."""

    def __init__(self, size: int = 256) -> None:
        self._size = size
        self._entries: OrderedDict[str, Loaded] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, location: str, io: FileIO) -> Loaded:
        with self._lock:
            hit = self._entries.get(location)
            if hit is not None:
                self._entries.move_to_end(location)
                return hit
        with io.new_input(location).open() as stream:
            raw = stream.read()
        if location.endswith(".gz.metadata.json"):
            raw = gzip.decompress(raw)
        entry = Loaded(location, TableMetadataUtil.parse_raw(raw.decode()), raw)
        self.put(entry)
        return entry

    def put(self, entry: Loaded) -> None:
        assert entry.location is not None
        with self._lock:
            self._entries[entry.location] = entry
            self._entries.move_to_end(entry.location)
            while len(self._entries) > self._size:
                self._entries.popitem(last=False)


class _CachingSqlCatalog(SqlCatalog):
    """pyiceberg's SqlCatalog, reading metadata files through the cache: a load is then one
    SELECT, and a commit parses no more than the metadata it produces."""

    def __init__(self, name: str, cache: MetadataCache, **properties: str) -> None:
        self.cache = cache
        super().__init__(name, **properties)

    def _convert_orm_to_iceberg(self, orm_table: IcebergTables) -> Table:
        location = orm_table.metadata_location
        if not location:
            raise NoSuchTableError(f"Table {orm_table.table_namespace}.{orm_table.table_name} has no metadata location")
        entry = self.cache.get(location, load_file_io(self.properties, location))
        return Table(
            identifier=(*PyCatalog.identifier_to_tuple(orm_table.table_namespace), orm_table.table_name),
            metadata=entry.metadata,
            metadata_location=location,
            io=self._load_file_io(entry.metadata.properties, location),
            catalog=self,
        )


def _check_properties(props: dict[str, str], before: dict[str, str] | None = None) -> None:
    for key in FORBIDDEN_PROPERTIES:
        if key in props and (before is None or before.get(key) != props[key]):
            raise bad_request(f"table property {key!r} may not be set through the REST catalog")


@dataclass
class _Staged:
    ident: Identifier
    current: Table | None
    location: str
    metadata: TableMetadata
    io: FileIO
    changed: bool
    raw: bytes = b""
    taken: list[tuple[str, str]] = field(default_factory=list)
    """The places this change takes (:func:`restcatalog.overlaps.fields`): new or moved."""


class Catalog:
    def __init__(self, settings: Settings) -> None:
        self.warehouse = settings.warehouse
        self.cache = MetadataCache()
        self.placing = threading.Lock()
        """Held from the check that a place is free to the write that takes it (:mod:`restcatalog.overlaps`)."""
        props = {"uri": settings.catalog_db_url, "warehouse": settings.warehouse, "schema_version": "v1"}
        props.update(io_properties(settings))
        # The same name, database and warehouse as cdclake.lake.catalog.open_catalog and Spark's
        # JdbcCatalog: the same rows of iceberg_tables.
        self.sql = _CachingSqlCatalog(settings.catalog_name, self.cache, **props)
        # Not through the metadata cache: a survey of every table would evict the hot entries.
        self.roots = overlaps.KnownRoots(metadata_roots(self.sql))
        if self.sql.engine.dialect.name == "sqlite":
            _use_wal(self.sql.engine)

    def close(self) -> None:
        self.sql.close()

    # -- tables

    def load(self, ident: Identifier) -> Loaded:
        table = self.sql.load_table(ident)
        return self.cache.get(table.metadata_location, table.io)

    def places(self, *skip: Identifier) -> list[Place]:
        """Every table of the catalog but ``skip``, with its roots."""
        return [p for p in live_places(self.sql, self.roots) if p.ident not in skip]

    def create(self, ns: Identifier, req: CreateTableRequest) -> Loaded:
        name = names.table(req.name)
        ident = (*ns, name)
        if not self.sql.namespace_exists(ns):
            raise no_such_namespace(f"Namespace does not exist: {'.'.join(ns)}")
        _check_properties(req.properties)
        locations.require_properties(req.properties, self.warehouse)
        # The location the table gets: the given one, else one made of the names.
        location = self.sql._resolve_table_location(req.location, ".".join(ns), name)
        locations.require(location, self.warehouse, "location")
        spec = req.partition_spec or UNPARTITIONED_PARTITION_SPEC
        order = req.write_order or UNSORTED_SORT_ORDER
        taken = overlaps.fields(location, req.properties)
        if req.stage_create:
            if self.sql.table_exists(ident):
                raise TableAlreadyExistsError(f"Table {'.'.join(ident)} already exists")
            # Nothing is written yet: the create commit checks again, under the lock.
            overlaps.require_apart(taken, self.places(ident))
            # new_table_metadata pops format-version from the dict it is given.
            metadata = new_table_metadata(req.table_schema, spec, order, location, dict(req.properties))
            return Loaded(None, metadata, serialize(metadata))
        with self.placing:
            # Not the table itself: a name taken is SqlCatalog's 409, not a place taken.
            overlaps.require_apart(taken, self.places(ident))
            table = self.sql.create_table(ident, req.table_schema, req.location, spec, order, dict(req.properties))
        return self.cache.get(table.metadata_location, table.io)

    def register(self, ident: Identifier, metadata_location: str, overwrite: bool) -> Loaded:
        if overwrite:
            raise NotImplementedError("register with overwrite=true is not supported by this catalog")
        locations.require(metadata_location, self.warehouse, "metadata-location")
        if not self.sql.namespace_exists(ident[:-1]):
            raise no_such_namespace(f"Namespace does not exist: {'.'.join(ident[:-1])}")
        try:
            # Read before inserting the row: a table row with an unreadable file would fail every load.
            entry = self.cache.get(metadata_location, load_file_io(self.sql.properties, metadata_location))
        except (OSError, ValueError) as exc:
            raise bad_request(f"cannot read table metadata at {metadata_location!r}: {exc}") from None
        # The file's own places to write count as given by the client: it may have written them.
        locations.require(entry.metadata.location, self.warehouse, "location")
        locations.require_properties(entry.metadata.properties, self.warehouse)
        with self.placing:
            others = self.places(ident)
            overlaps.require_unclaimed(metadata_location, others)
            overlaps.require_apart(overlaps.fields(entry.metadata.location, entry.metadata.properties), others)
            table = self.sql.register_table(ident, metadata_location)
        return self.cache.get(table.metadata_location, table.io)

    def drop(self, ident: Identifier, purge_files: bool) -> None:
        if purge_files:
            purge.purge(self, ident)
        else:
            self.sql.drop_table(ident)

    def commit(self, changes: Iterable[CommitTableRequest]) -> list[Loaded]:
        """Apply the changes of one or more tables atomically: every table's compare-and-swap of
        its metadata location runs in one database transaction, so all land or none."""
        staged: list[_Staged] = []
        for change in changes:
            ident = (*names.namespace(change.identifier.namespace.root), names.table(change.identifier.name))
            if any(s.ident == ident for s in staged):
                raise bad_request(f"table {'.'.join(ident)} appears twice in one commit")
            staged.append(self._stage(ident, change))
        if any(s.taken for s in staged):
            with self.placing:
                self._require_apart(staged)
                self._land(staged)
        else:
            self._land(staged)
        out = []
        for s in staged:
            if s.changed:
                entry = Loaded(s.location, s.metadata, s.raw)
                self.cache.put(entry)
                out.append(entry)
            else:
                out.append(self.cache.get(s.location, s.io))
        return out

    def _require_apart(self, staged: list[_Staged]) -> None:
        """Each place a change takes, against every other table as it will be once the commit
        lands: the catalog's, with this commit's tables as staged."""
        idents = [s.ident for s in staged]
        after = [
            *self.places(*idents),
            *(Place(s.ident, roots_of(s.metadata.location, s.metadata.properties)) for s in staged),
        ]
        for s in staged:
            overlaps.require_apart(s.taken, [p for p in after if p.ident != s.ident])

    def _land(self, staged: list[_Staged]) -> None:
        """Write the changed tables' metadata files and swap their rows, all or none."""
        written: list[_Staged] = []
        try:
            for s in staged:
                if s.changed:
                    # What pyiceberg's ToOutputFile writes (see serialize), serialized once for
                    # both the file and the cache.
                    s.raw = serialize(s.metadata)
                    with s.io.new_output(s.location).create(overwrite=False) as stream:
                        stream.write(Compressor.get_compressor(s.location).bytes_compressor()(s.raw))
                    written.append(s)
            if written:
                self._swap(written)
        except CommitFailedException:
            # Known not to have landed: nothing will ever name these files.
            for s in written:
                try:
                    s.io.delete(s.location)
                except Exception:
                    log.warning("could not delete an unused metadata file", extra={"path": s.location})
            raise

    def _stage(self, ident: Identifier, change: CommitTableRequest) -> _Staged:
        try:
            current: Table | None = self.sql.load_table(ident)
        except NoSuchTableError:
            current = None
        if current is None:
            if not any(isinstance(r, AssertCreate) for r in change.requirements):
                raise no_such_table(f"Table does not exist: {'.'.join(ident)}")
            if not self.sql.namespace_exists(ident[:-1]):
                raise no_such_namespace(f"Namespace does not exist: {'.'.join(ident[:-1])}")
        try:
            st = self.sql._update_and_stage_table(current, ident, change.requirements, change.updates)
        except (CommitFailedException, IcebergError):
            raise
        except Exception as exc:
            # Staging is a pure function of the current metadata and the request: if it throws,
            # this request cannot apply to this table (a snapshot id reused, a spec naming a
            # missing column, ...).
            log.info("commit rejected", extra={"table": ".".join(ident), "reason": repr(exc)})
            raise bad_request(f"cannot apply updates to {'.'.join(ident)}: {type(exc).__name__}: {exc}") from None
        if current is not None and st.metadata == current.metadata:
            return _Staged(ident, current, current.metadata_location, current.metadata, current.io, False)
        before = current.metadata if current else None
        _check_properties(st.metadata.properties, before.properties if before else None)
        # set-location and set-properties updates, checked on the metadata they produce.
        locations.require_properties(st.metadata.properties, self.warehouse, before.properties if before else None)
        if before is None or st.metadata.location != before.location:
            locations.require(st.metadata.location, self.warehouse, "location")
        locations.require(st.metadata_location, self.warehouse, "metadata location")
        taken = overlaps.fields(
            st.metadata.location,
            st.metadata.properties,
            before.location if before else None,
            before.properties if before else None,
        )
        return _Staged(ident, current, st.metadata_location, st.metadata, st.io, True, taken=taken)

    def _swap(self, staged: list[_Staged]) -> None:
        sql = self.sql
        with Session(sql.engine) as session:
            for s in staged:
                ns, name = ".".join(s.ident[:-1]), s.ident[-1]
                if s.current is None:
                    try:
                        session.execute(insert(IcebergTables).values(**sql._create_table_row(ns, name, s.location)))
                        session.flush()
                    except IntegrityError:
                        raise CommitFailedException(f"Table {ns}.{name} was created concurrently") from None
                    continue
                # The same compare-and-swap as SqlCatalog.commit_table: the row moves only if it
                # still names the metadata this commit was staged on.
                swap_row(session, sql.name, ns, name, s.current.metadata_location, s.location)
            session.commit()

    # -- partitions

    def partitions(self, ident: Identifier, snapshot_id: int | None) -> tuple[int | None, list[dict[str, Any]]]:
        """Per-partition counts and sizes of a snapshot (default: the current one)."""
        table = self.sql.load_table(ident)
        snapshot = table.current_snapshot() if snapshot_id is None else table.snapshot_by_id(snapshot_id)
        if snapshot is None:
            if snapshot_id is not None:
                raise bad_request(f"table {'.'.join(ident)} has no snapshot {snapshot_id}")
            return None, []
        rows = table.inspect.partitions(snapshot_id=snapshot.snapshot_id).to_pylist()
        return snapshot.snapshot_id, rows


def _use_wal(engine: Engine) -> None:
    """Switch a SQLite catalog to write-ahead logging (a property of the database file, kept).

    With the default rollback journal every commit costs three fsyncs (journal, database,
    journal delete; docs/benchmarks.md, "SQLite catalog commits"). A WAL commit
    is one fsync of the log (synchronous stays FULL: as durable), and readers (loads) no longer
    wait for a writer. sqlite-jdbc (Spark) and pyiceberg both read WAL databases unchanged."""
    with engine.connect() as conn:
        mode = conn.exec_driver_sql("PRAGMA journal_mode").scalar()
        if str(mode).lower() != "wal":
            mode = conn.exec_driver_sql("PRAGMA journal_mode=WAL").scalar()
            log.info("catalog database switched to WAL", extra={"journal_mode": mode})


def client_config(settings: Settings) -> dict[str, str]:
    """Non-secret FileIO hints for clients (the ``config`` of a loaded table): where the object
    store is. Credentials stay with each client."""
    if not settings.warehouse_on_s3:
        return {}
    out = {"s3.region": settings.s3_region, "client.region": settings.s3_region}
    if settings.s3_endpoint:
        out["s3.endpoint"] = settings.s3_endpoint
    out["s3.path-style-access"] = str(settings.s3_path_style).lower()
    return out
