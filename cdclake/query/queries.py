"""Read-only queries over the lake's tables for the query API (``POST /v1/query``): one
statement, parameters bound by Spark, ``asOf`` for every table the statement reads, row and byte
caps, one deadline, and per-table read rights.

What a statement is and what it reads are taken from Spark's own plans (``EXPLAIN EXTENDED`` of
the statement as it will run), never from its text:
- it must be a read-only query (:mod:`cdclake.query.readonly`: an allow-list of plan nodes, no
  Java calls);
- every relation of its analyzed plan, and every scan of its physical plan, must be an Iceberg
  table of the lake's catalog the client may read (no files, other catalogs or sources);
- with ``asOf``, every table scan must read the snapshot current at that time (or the given
  snapshot id), else the statement is refused with the table it would read at another time.
The text is only rewritten to ask for the time travel: fully qualified names get the
``VERSION``/``TIMESTAMP AS OF`` clause, one-part names resolve to temporary views that carry it;
the rewritten statement is checked again before it runs.

These checks are one of two walls: the query API runs statements in sessions whose catalog is
the REST catalog with the client's read-only rights (:mod:`cdclake.query.session`).

pyspark and pyarrow are imported by the callers' sessions; this module needs neither at import.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import re
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cdclake.contracts.events import CHANGES_SUFFIX, HISTORY_SUFFIX
from cdclake.contracts.names import quote
from cdclake.query import cuts, readonly, relations
from cdclake.query.limits import deadline, fetch
from cdclake.query.readonly import Explained
from cdclake.query.statements import AsOf, Cut, QueryError, history_sql, tokens, with_as_of

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession

    from cdclake.config.settings import Settings

Scalar = str | int | float | bool | None
JAVA_CALLS = readonly.JAVA_CALLS
# Leaf scans a query may have besides the lake's Iceberg tables: literal rows and range().
HARMLESS_SCANS = ("LocalTableScan", "Scan OneRowRelation", "Range", "EmptyRelation")
AGGREGATE_PUSH_DOWN = "spark.sql.iceberg.aggregate-push-down.enabled"


class Refused(QueryError):
    """The statement is not run: not a query, reads what it may not, or not at ``asOf``."""


class Forbidden(Refused):
    """The client may not read a table the statement reads."""


@dataclass(frozen=True)
class Query:
    sql: str
    params: Mapping[str, Scalar] | Sequence[Scalar] = field(default_factory=dict)
    as_of: AsOf | None = None
    max_rows: int = 1000
    timeout_s: float = 60.0
    cancel: threading.Event | None = field(default=None, compare=False)
    """Set when the answer is no longer wanted (the client went away): the query's Spark jobs are
    interrupted and it ends with Cancelled."""
    cut: Cut | None = None
    """Read every table at one catalog state or source position (instead of ``as_of``)."""


@dataclass(frozen=True)
class Scan:
    table: str  # catalog.namespace.table[.metadata]
    snapshot_id: int | None

    @property
    def metadata(self) -> bool:
        """A metadata table (``lake.cdc.orders.snapshots``); the plan prints names unquoted."""
        return self.table.count(".") > 2 and self.table.rsplit(".", 1)[1].lower() in relations.METADATA_TABLES


@dataclass
class Answer:
    table: pa.Table  # at most max_rows rows
    truncated: bool
    scans: list[Scan]


_HEADER = re.compile(r"^\((\d+)\) (.+?)\s*$")
# Up to the fixed field after it: a table name may hold commas and spaces.
_ICEBERG = re.compile(r"IcebergScan\(table=(.+?), schemaId=(?:\d+|null), snapshotId=(\d+|null)")


def plan_scans(plan: str) -> tuple[list[Scan], list[str]]:
    """From ``EXPLAIN FORMATTED`` text: the Iceberg scans (table, snapshot) and the leaf scans of
    any other kind (their node names)."""
    scans: list[Scan] = []
    other: list[str] = []
    for node, details in plan_nodes(plan):
        if node.startswith("BatchScan "):
            found = _ICEBERG.search(details)
            if found is None:
                other.append(node)
            else:
                snap = found.group(2)
                scans.append(Scan(found.group(1), None if snap == "null" else int(snap)))
        elif ("Scan" in node or node.startswith("Range")) and not node.startswith(HARMLESS_SCANS):
            other.append(node)
    unique = list(dict.fromkeys(scans))
    return unique, other


# A physical plan line of EXPLAIN EXTENDED: the tree's drawing, a codegen stage ("*(1) "), the node.
_PHYSICAL = re.compile(r"^[ :]*(?:[+:]- )?(?:\*\(\d+\) )?(\S.*)$")


def physical_scans(lines: list[str]) -> tuple[list[Scan], list[str]]:
    """:func:`plan_scans` of the physical plan section of ``EXPLAIN EXTENDED``, where each scan
    is one line. A literal's text may add lines that read as scans: they are checked as scans
    (a refusal at worst), and cannot hide one."""
    scans: list[Scan] = []
    other: list[str] = []
    for line in lines:
        m = _PHYSICAL.match(line)
        if m is None:
            continue
        node = m.group(1)
        name = node.split(" ", 1)[0].split("[", 1)[0]
        if name == "BatchScan":
            found = _ICEBERG.search(node)
            if found is None:
                other.append(node.split("[", 1)[0])
            else:
                snap = found.group(2)
                scans.append(Scan(found.group(1), None if snap == "null" else int(snap)))
        elif ("Scan" in name or name == "Range") and not node.startswith(HARMLESS_SCANS):
            other.append(" ".join(node.split(" ", 2)[:2]).split("[", 1)[0])
    return list(dict.fromkeys(scans)), other


def plan_nodes(plan: str) -> Iterator[tuple[str, str]]:
    """The nodes of ``EXPLAIN FORMATTED`` text, each with the lines of its details."""
    node, details = "", []
    for line in [*plan.splitlines(), "(0) END"]:
        m = _HEADER.match(line.strip())
        if not m:
            details.append(line)
            continue
        if node:
            yield node, "\n".join(details)
        node, details = m.group(2), []


def error_line(exc: BaseException) -> str:
    """A Spark, Iceberg or JVM error as one line without a stack trace."""
    java = getattr(exc, "java_exception", None)  # py4j: an exception pyspark did not convert
    text = str(java.toString()) if java is not None else str(exc)
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), type(exc).__name__)
    line = re.sub(r"^\((?:[\w$]+\.)+[\w$]+\)\s*", "", line)  # Spark Connect: "(org.x.FooException) msg"
    line = re.sub(r"^(?:[a-z_$][\w$]*\.)+[A-Z][\w$]*(?:Exception|Error):\s*", "", line)  # Java: "org.x.Foo: msg"
    return line if len(line) <= 400 else line[:399] + "…"


@dataclass(frozen=True)
class Lake:
    """Where and what a statement may read."""

    catalog: str
    namespace: str
    may_read: Callable[[str, str], bool]  # (namespace, table) -> allowed
    snapshot_at: Callable[[str, AsOf], int | None]  # table -> its snapshot at that time (None: none then)
    pin: cuts.Pin | None = None
    """The snapshots of a cut of these tables (:func:`cdclake.query.cuts.pin_tables`); None: no
    catalog to pin with."""


def run(spark: SparkSession, query: Query, lake: Lake, max_bytes: int | None = None) -> Answer:
    """``query`` on ``spark``, or Refused/Forbidden/TimedOut/TooLarge/QueryError with a one-line
    reason. One deadline, ``query.timeout_s``, covers everything from the parse to the last row.
    It drops the temporary views it made before it returns."""
    with deadline(spark, query.timeout_s, query.cancel), explained(spark, query, lake) as (statement, ex, checked, at):
        scans = check_plan(*physical_scans(ex.physical), checked, at)
        args: Any = query.params
        df = spark.sql(statement, args=args).limit(query.max_rows + 1)
        table = fetch(spark, df, max_bytes)
    truncated = table.num_rows > query.max_rows
    return Answer(table.slice(0, query.max_rows) if truncated else table, truncated, scans)


def explain(spark: SparkSession, statement: str, args: Any) -> Explained:
    """``EXPLAIN EXTENDED`` of ``statement`` (Spark plans it and runs nothing), in its sections."""
    rows = spark.sql("EXPLAIN EXTENDED " + statement, args=args).collect()
    # A planning failure comes one line per row.
    return readonly.explained("\n".join(str(r[0]) for r in rows))


@contextlib.contextmanager
def explained(spark: SparkSession, query: Query, lake: Lake) -> Iterator[tuple[str, Explained, Lake, AsOf | None]]:
    """The statement as it will run (history views made, ``asOf`` asked for), Spark's plans of it,
    the lake to check them with and the ``asOf`` they must read at (a cut's: each table pinned at
    its snapshot of the cut, chosen once here); Refused unless Spark's parse of the statement is
    a read-only query, before anything else runs. The temporary views are dropped after."""
    # time_travel and check_plan both ask for a table's snapshot then: one catalog load each.
    lake = dataclasses.replace(lake, snapshot_at=functools.cache(lake.snapshot_at))
    args: Any = query.params
    spark.sql(f"USE {quote(lake.catalog)}.{quote(lake.namespace)}")
    # With push-down, Iceberg answers count(*), min and max from its manifests while Spark plans:
    # the plan then holds literal rows and no scan, and check_plan would not see the table read.
    spark.conf.set(AGGREGATE_PUSH_DOWN, "false")
    ex = explain(spark, query.sql, args)
    readonly.check_query(ex)
    statement, views, as_of = query.sql, [], query.as_of
    try:
        if query.cut is not None:
            as_of = cuts.pinned(lake.pin, query.cut, ex.text, lake.catalog, lake.namespace, lake.may_read)
        views += history_views(spark, statement, lake, as_of)
        if as_of is not None:
            statement = time_travel(spark, statement, lake, as_of, query.params, views)
        if views or statement != query.sql:
            ex = explain(spark, statement, args)
            readonly.check_query(ex)  # the rewritten text is Spark's to read again
        check_touched(spark, statement, args, lake, ex)
        yield statement, ex, lake, as_of
    finally:
        for name in views:
            spark.catalog.dropTempView(name)


def check_touched(spark: SparkSession, statement: str, args: Any, lake: Lake, ex: Explained) -> None:
    """Forbidden (Refused for another catalog) when the statement touches a table the client may
    not read, known or not, before any answer or error of Spark's can say something about it: the
    relations of the analyzed plan (:mod:`cdclake.query.relations`). A statement that failed
    analysis then raises Spark's error."""
    found = relations.touched(ex.text)
    assert found is not None  # readonly.explained refuses a text without an analyzed plan
    home = f"{lake.catalog}.{lake.namespace}".lower()
    for name in found.resolved + found.unresolved:
        t = relations.table_of(name, lake.catalog, lake.namespace)
        if t is None and name in found.resolved:
            raise Refused(f"the query reads {'.'.join(name)}: only the tables of {home} can be read here")
        if t is None or not lake.may_read(*t):
            shown_as = ".".join(t).lower() if t else ".".join(name).lower()
            raise Forbidden(f"this client may not read {shown_as}")
    if found.failed:
        planning_error(spark, statement, args, lake, ex.analysis_error or "")


def planning_error(spark: SparkSession, statement: str, args: Any, lake: Lake, printed: str) -> None:
    """Raise the analysis error EXPLAIN only printed (analysis gives it with its condition); the
    statement is a read-only query (checked before), so asking Spark to analyze it runs nothing.
    A table that is not there and that the client could not read if it were is Forbidden, as an
    existing one is: the answer does not tell a client which tables exist outside its rights."""
    try:
        spark.sql(statement, args=args).schema  # noqa: B018 - analysis, for its error
    except Exception as exc:
        condition = getattr(exc, "getCondition", lambda: None)()
        params: dict[str, str] = getattr(exc, "getMessageParameters", dict)() or {}
        relation = params.get("relationName", "")
        parts = [p.replace("``", "`") for p in re.findall(r"`((?:[^`]|``)*)`", relation)]
        ours = len(parts) < 3 or parts[-3].lower() == lake.catalog.lower()
        if condition == "TABLE_OR_VIEW_NOT_FOUND" and parts and ours:
            ns, table = (parts[-2] if len(parts) > 1 else lake.namespace).lower(), parts[-1].lower()
            if not lake.may_read(ns, table):
                raise Forbidden(f"this client may not read {ns}.{table}") from None
        raise
    raise QueryError(error_line(RuntimeError(printed or "Spark could not analyze the statement")))


def check_plan(scans: list[Scan], other: list[str], lake: Lake, as_of: AsOf | None) -> list[Scan]:
    """The plan's scans (:func:`physical_scans` or :func:`plan_scans`), if the statement may run
    as planned; else Refused or Forbidden."""
    home = f"{lake.catalog}.{lake.namespace}".lower()
    if other:
        raise Refused(f"the query reads {other[0].split(' [')[0]}: only the tables of {home} can be read here")
    prefix = home + "."
    for s in scans:
        if not s.table.lower().startswith(prefix) or len(s.table) == len(prefix):
            raise Refused(f"the query reads {s.table}: only the tables of {home} can be read here")
        # The plan prints the name unquoted: what follows the namespace is the table (dots and
        # all), less a metadata table's suffix. The analyzed plan's names (check_touched) are exact.
        table = s.table[len(prefix) :]
        table = table.rsplit(".", 1)[0] if s.metadata else table
        if not lake.may_read(lake.namespace, table):
            raise Forbidden(f"this client may not read {lake.namespace}.{table}")
        if as_of is None or s.metadata:
            continue  # a metadata table describes every snapshot: it has no time to travel to
        want = wanted(lake, table, as_of)
        if want is None:
            raise Refused(f"{as_of.heading()}: {lake.namespace}.{table} has no snapshot at that time")
        if s.snapshot_id != want:
            raise Refused(
                f"{as_of.heading()}: the query would read {table} at snapshot {s.snapshot_id}, not at "
                f"{want} (its snapshot then); name it {table} or {lake.catalog}.{lake.namespace}.{table}"
            )
    return scans


def wanted(lake: Lake, table: str, as_of: AsOf) -> int | None:
    """The snapshot of ``table`` a read at ``as_of`` must read (a pinned one, else the lake's)."""
    return as_of.snapshot_of(table) if as_of.pinned is not None else lake.snapshot_at(table, as_of)


def time_travel(
    spark: SparkSession, statement: str, lake: Lake, as_of: AsOf, params: Any = (), views: list[str] | None = None
) -> str:
    """``statement`` asking for ``as_of``: the clause after each fully qualified table, and each
    one-part name of a table a temporary view of it at that time (views come first when Spark
    resolves a one-part name; a text parameter may name one too, through ``IDENTIFIER(:p)``).
    :func:`check_plan` then checks what the plan really reads."""
    try:
        statement, _ = with_as_of(statement, [lake.catalog], lake.namespace, as_of)
    except QueryError as exc:
        if "reads no table" not in str(exc):
            raise
    shown = spark.sql(f"SHOW TABLES IN {quote(lake.catalog)}.{quote(lake.namespace)}").collect()
    names = {str(r["tableName"]).lower() for r in shown}
    words = names_in(statement)
    values = params.values() if isinstance(params, Mapping) else params
    words |= {v.lower() for v in values if isinstance(v, str)}
    for name in sorted(words & names):
        if wanted(lake, name, as_of) is None:
            continue  # nothing to read then: if the query reads it, check_plan says so
        source = f"{quote(lake.catalog)}.{quote(lake.namespace)}.{quote(name)}"
        spark.sql(f"CREATE OR REPLACE TEMPORARY VIEW {quote(name)} AS SELECT * FROM {source} {as_of.clause(name)}")
        if views is not None:
            views.append(name)
    return statement


def history_views(spark: SparkSession, statement: str, lake: Lake, as_of: AsOf | None = None) -> list[str]:
    """``<table>__history`` in ``statement``: a temporary view of that table's row history
    (:func:`cdclake.query.statements.history_sql`), when the table has a change history. The
    views made. A pinned ``as_of`` reads the change history at its pinned snapshot (the view's
    text is not the statement's, which the time-travel rewrite sees)."""
    made = []
    for name in sorted(w for w in names_in(statement) if w.endswith(HISTORY_SUFFIX) and len(w) > len(HISTORY_SUFFIX)):
        table = name.removesuffix(HISTORY_SUFFIX)
        if not lake.may_read(lake.namespace, table + CHANGES_SUFFIX):
            continue  # not even whether it exists: the name stays unresolved, and Forbidden
        if spark.catalog.tableExists(f"{quote(lake.catalog)}.{quote(lake.namespace)}.{quote(table + CHANGES_SUFFIX)}"):
            pinned = as_of.clause(table + CHANGES_SUFFIX) if as_of is not None and as_of.pinned is not None else None
            body = history_sql(lake.catalog, lake.namespace, table, pinned or "")
            spark.sql(f"CREATE OR REPLACE TEMPORARY VIEW {quote(name)} AS {body}")
            made.append(name)
    return made


def names_in(statement: str) -> set[str]:
    """Every word and quoted name of ``statement``, lower-cased: what may name a table."""
    return {t.strip("`").replace("``", "`").lower() for k, t in tokens(statement) if k in ("word", "quoted")}


def snapshot_at(settings: Settings, table: str, as_of: AsOf) -> int | None:
    """The id of ``table``'s snapshot at ``as_of`` (a time: the newest committed at or before it;
    an id: itself, if the table has it); None when there is none then, or no such table."""
    from cdclake.lake.catalog import load_table

    if as_of.pinned is not None:
        return as_of.snapshot_of(table)
    t = load_table(settings, table)
    if t is None:
        return None
    if as_of.snapshot_id is not None:
        return as_of.snapshot_id if t.snapshot_by_id(as_of.snapshot_id) is not None else None
    assert as_of.timestamp_ms is not None
    found = t.snapshot_as_of_timestamp(as_of.timestamp_ms)
    return found.snapshot_id if found is not None else None
