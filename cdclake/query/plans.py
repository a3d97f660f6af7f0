"""The query API's plan (``POST /v1/query/plan``): Spark's plan of a statement as it would run,
and for each Iceberg table it scans the data files that Iceberg's pruning keeps.

The statement goes through the same checks as one that runs (:mod:`cdclake.query.queries`: one
query, ``asOf``, what the plan reads, the client's rights) and is not run. Spark Connect does not
show the files Iceberg plans, so they are planned again with pyiceberg on the snapshot the plan
reads, with the filters Spark pushed to Iceberg read back from the plan's text
(:mod:`cdclake.query.filters`). When that text cannot be read back safely, every data file of the
snapshot is listed and the answer says why: the listing may hold more files than Iceberg reads
(runtime filters, say), never fewer.

pyspark and pyiceberg are imported by the callers' sessions and inside the functions.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cdclake.query import filters, limits, queries
from cdclake.query.statements import AsOf

if TYPE_CHECKING:
    from pyiceberg.expressions import BooleanExpression
    from pyiceberg.manifest import DataFile
    from pyiceberg.schema import Schema
    from pyiceberg.table import Table
    from pyspark.sql import SparkSession

_HEADER = re.compile(r"^\((\d+)\) (.+?)\s*$")
_SCAN = re.compile(
    r"IcebergScan\(table=([^,\s]+), schemaId=(\d+|null), snapshotId=(\d+|null), branch=[^,]*, filters=(.*)", re.DOTALL
)
_TAIL = ", runtimeFilters="


@dataclass(frozen=True)
class ScanText:
    """One Iceberg table scan as the plan prints it; ``filters`` None when the text of the
    filters cannot be told from the rest (a value holding ``, runtimeFilters=``)."""

    table: str
    schema_id: int | None
    snapshot_id: int | None
    filters: str | None


@dataclass
class ScanFiles:
    table: str
    snapshot_id: int | None
    filters: str | None
    pruned: bool  # the filters took part in the listing (else every file of the snapshot)
    reason: str | None  # what of the filters was not used, and why
    files: list[dict[str, Any]] = field(default_factory=list)
    files_total: int = 0
    bytes_total: int = 0

    def as_json(self) -> dict[str, Any]:
        partitions = list({repr(sorted(f["partition"].items())): f["partition"] for f in self.files}.values())
        return {
            "table": self.table,
            "snapshotId": self.snapshot_id,
            "filters": self.filters,
            "pruned": self.pruned,
            "reason": self.reason,
            "files": self.files,
            "partitions": partitions,
            "totals": {
                "filesKept": len(self.files),
                "filesInSnapshot": self.files_total,
                "bytesKept": sum(f["fileSizeBytes"] for f in self.files),
                "bytesInSnapshot": self.bytes_total,
            },
        }


@dataclass
class Planned:
    plan: str  # EXPLAIN FORMATTED of the statement as it would run
    scans: list[ScanFiles]


def scan_texts(plan: str) -> list[ScanText]:
    """Every distinct Iceberg scan of an ``EXPLAIN FORMATTED`` text (a table read twice with
    different filters is two)."""
    out: list[ScanText] = []
    for node, details in queries.plan_nodes(plan):
        found = _SCAN.search(details) if node.startswith("BatchScan ") else None
        if found is None:
            continue
        table, schema, snap, rest = found.groups()
        rest = rest.rstrip()
        text = rest[: rest.index(_TAIL)] if rest.count(_TAIL) == 1 and rest.endswith(")") else None
        out.append(ScanText(table, _int(schema), _int(snap), text))
    return list(dict.fromkeys(out))


def _int(text: str) -> int | None:
    return None if text == "null" else int(text)


def plan(spark: SparkSession, query: queries.Query, lake: queries.Lake, load: Callable[[str], Table | None]) -> Planned:
    """The plan of ``query`` and the files each Iceberg scan keeps; Refused/Forbidden as
    :func:`cdclake.query.queries.run` would be, TimedOut past ``query.timeout_s``. ``load``:
    the lake's table of that name (pyiceberg). The session is left as it was found."""
    deadline = time.monotonic() + query.timeout_s
    with limits.deadline(spark, query.timeout_s, query.cancel):
        text, checked, as_of = explained(spark, query, lake)
    allowed = {(s.table, s.snapshot_id) for s in queries.check_plan(*queries.plan_scans(text), checked, as_of)}
    scans = []
    for scan in scan_texts(text):
        if (scan.table, scan.snapshot_id) not in allowed:
            continue  # not a scan check_plan saw (its text inside a value): nothing to list
        _in_time(deadline, query.timeout_s)
        scans.append(scan_files(scan, load(scan.table.split(".")[2])))
    _in_time(deadline, query.timeout_s)
    return Planned(text, scans)


def _in_time(deadline: float, timeout_s: float) -> None:
    if time.monotonic() > deadline:
        raise limits.TimedOut(f"planning the query took longer than its timeout of {timeout_s:g} s")


def explained(spark: SparkSession, query: queries.Query, lake: queries.Lake) -> tuple[str, queries.Lake, AsOf | None]:
    """``EXPLAIN FORMATTED`` of the statement as :func:`cdclake.query.queries.run` would run it
    (once :func:`cdclake.query.queries.explained` has found it a read-only query the client may
    run), the lake to check its scans with and the ``asOf`` they must read at."""
    args: Any = query.params
    with queries.explained(spark, query, lake) as (statement, _, checked, as_of):
        row = spark.sql("EXPLAIN FORMATTED " + statement, args=args).first()
        return (str(row[0]) if row else ""), checked, as_of


def scan_files(scan: ScanText, table: Table | None) -> ScanFiles:
    """The data files of ``scan``'s snapshot that its filters keep (all of them when the
    filters cannot be read back)."""
    from pyiceberg.expressions import AlwaysTrue

    out = ScanFiles(scan.table, scan.snapshot_id, scan.filters, pruned=False, reason=None)
    if scan.table.count(".") > 2:
        out.reason = "a metadata table: it reads the table's metadata, not its data files"
        return out
    if table is None or scan.snapshot_id is None or table.snapshot_by_id(scan.snapshot_id) is None:
        out.reason = "no snapshot to read: no data files"
        return out
    everything = snapshot_files(table, scan.snapshot_id)
    out.files_total = len(everything)
    out.bytes_total = sum(f.file_size_in_bytes for f in everything)
    row_filter, out.reason = row_filter_of(scan, table)
    kept, out.pruned = everything, row_filter == AlwaysTrue()
    if row_filter is not None and not out.pruned:
        try:
            planned = table.scan(row_filter=row_filter, snapshot_id=scan.snapshot_id).plan_files()
            paths = {t.file.file_path for t in planned}
            kept, out.pruned = [f for f in everything if f.file_path in paths], True
        except Exception as exc:  # pyiceberg may not plan what Iceberg does (equality deletes, say)
            out.reason = f"pyiceberg could not plan the scan: {queries.error_line(exc)}"
    out.files = [file_json(table, f) for f in kept]
    return out


def row_filter_of(scan: ScanText, table: Table) -> tuple[BooleanExpression | None, str | None]:
    """The pyiceberg filter for the scan (None: keep every file) and what of it was not used."""
    from pyiceberg.expressions import AlwaysTrue

    if scan.filters is None:
        return None, "filters not understood: their text cannot be told from the rest of the scan's"
    if not scan.filters:
        return AlwaysTrue(), None
    schema = table.schemas().get(scan.schema_id) if scan.schema_id is not None else table.schema()
    if schema is None:
        return None, f"filters not understood: schema {scan.schema_id} is not in the table's metadata"
    try:
        expr, ignored = filters.expression(scan.filters, columns(schema, table.schema()), schema_names(schema))
    except filters.NotUnderstood as exc:
        return None, f"filters not understood: {exc}"
    if ignored and expr == AlwaysTrue():
        return None, "filters not understood: " + "; ".join(ignored)
    return expr, ("not used (read as true): " + "; ".join(ignored)) if ignored else None


def schema_names(schema: Schema) -> list[str]:
    from pyiceberg.schema import index_by_name

    return list(index_by_name(schema))


def columns(scan_schema: Schema, current: Schema) -> dict[str, filters.Column]:
    """The scan's column names whose field the current schema holds with the same type, by the
    current name (pyiceberg binds a scan's filter to the current schema)."""
    from pyiceberg.schema import index_by_name

    out = {}
    for name, field_id in index_by_name(scan_schema).items():
        now = current.find_column_name(field_id)
        if now is None:
            continue
        then_type, now_type = scan_schema.find_type(field_id), current.find_type(field_id)
        if then_type == now_type and then_type.is_primitive:
            out[name] = filters.Column(now, now_type)
    return out


def snapshot_files(table: Table, snapshot_id: int) -> list[DataFile]:
    """Every live data file of the snapshot, from its manifests (no filter)."""
    from pyiceberg.manifest import ManifestContent

    snapshot = table.snapshot_by_id(snapshot_id)
    assert snapshot is not None
    out = []
    for manifest in snapshot.manifests(table.io):
        if manifest.content == ManifestContent.DATA:
            out += [e.data_file for e in manifest.fetch_manifest_entry(table.io, discard_deleted=True)]
    return out


def file_json(table: Table, f: DataFile) -> dict[str, Any]:
    return {
        "path": f.file_path,
        "partition": partition_json(table, f),
        "recordCount": f.record_count,
        "fileSizeBytes": f.file_size_in_bytes,
    }


def partition_json(table: Table, f: DataFile) -> dict[str, Any]:
    """Partition field -> value: text, booleans and the integers of integer columns and buckets
    as they are; dates, times, decimals, bytes and the time transforms in Iceberg's human form
    (``2026-01-02``, as partition paths show them)."""
    from pyiceberg.transforms import BucketTransform, IdentityTransform, TruncateTransform
    from pyiceberg.types import IntegerType, LongType

    spec, schema = table.specs()[f.spec_id], table.schema()
    out: dict[str, Any] = {}
    for i, pf in enumerate(spec.fields):
        value, source = f.partition[i], schema.find_type(pf.source_id)
        as_is = value is None or isinstance(value, bool | str) or isinstance(pf.transform, BucketTransform)
        as_is |= (
            isinstance(value, int)
            and isinstance(pf.transform, IdentityTransform | TruncateTransform)
            and (isinstance(source, IntegerType | LongType))
        )
        out[pf.name] = value if as_is else pf.transform.to_human_string(source, value)
    return out
