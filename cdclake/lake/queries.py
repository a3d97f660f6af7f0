"""Read-only queries over the lake's tables for the query API (``POST /v1/query``): one
statement, parameters bound by Spark, ``asOf`` for every table the statement reads, row caps,
timeouts and per-table read rights.

What a statement reads is taken from Spark's own plan (``EXPLAIN FORMATTED`` of the statement as
it will run), not from its text: a table named through a parameter (``IDENTIFIER(:t)``), a view
or a two-part name is found the same way. From the plan:
- every scan must be an Iceberg table of the lake's catalog the client may read (no files,
  ``read_files``, JDBC or other catalogs);
- with ``asOf``, every table scan must read the snapshot current at that time (or the given
  snapshot id), else the statement is refused with the table it would read at another time;
- functions that call Java (``reflect``, ``java_method``) are refused.
The text is only rewritten to ask for the time travel: fully qualified names get the
``VERSION``/``TIMESTAMP AS OF`` clause, one-part names resolve to temporary views that carry it.

pyspark and pyarrow are imported by the callers' sessions; this module needs neither at import.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cdclake.contracts.events import CHANGES_SUFFIX, HISTORY_SUFFIX
from cdclake.contracts.names import quote
from cdclake.lake import relations
from cdclake.lake.statements import AsOf, QueryError, history_sql, split_statements, tokens, with_as_of

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession

Scalar = str | int | float | bool | None
QUERY_STARTS = ("SELECT", "WITH", "FROM", "VALUES", "TABLE", "(")
JAVA_CALLS = ("reflect", "java_method", "try_reflect")
# Leaf scans a query may have besides the lake's Iceberg tables: literal rows and range().
HARMLESS_SCANS = ("LocalTableScan", "Scan OneRowRelation", "Range", "EmptyRelation")
AGGREGATE_PUSH_DOWN = "spark.sql.iceberg.aggregate-push-down.enabled"
PLANNING_FAILED = "Error occurred during query planning"  # EXPLAIN prints an analysis error


class Refused(QueryError):
    """The statement is not run: not a query, reads what it may not, or not at ``asOf``."""


class Forbidden(Refused):
    """The client may not read a table the statement reads."""


class TimedOut(QueryError):
    pass


class Cancelled(QueryError):
    pass


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


def check_statement(sql: str) -> str:
    """The one query of ``sql`` (a trailing ``;`` allowed), or Refused."""
    done, rest = split_statements(sql)
    parts = [*done, *([rest.strip()] if rest else [])]
    if len(parts) != 1:
        raise Refused(f"one statement per query, got {len(parts)}")
    words = [t for k, t in tokens(parts[0]) if k not in ("ws", "comment")]
    first = words[0].upper() if words else ""
    if first not in QUERY_STARTS:
        raise Refused(f"only queries (SELECT, WITH, FROM, VALUES, TABLE) run here, not {first or 'an empty'} statement")
    called = {w.lower() for w, nxt in itertools.pairwise(words) if nxt == "("}
    if bad := sorted(called & set(JAVA_CALLS)):
        raise Refused(f"function {bad[0]} calls Java methods and is not allowed here")
    return parts[0]


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


def java_calls(plan: str) -> list[str]:
    return sorted({f for f in JAVA_CALLS if re.search(rf"\b{f}\(", plan)})


@dataclass(frozen=True)
class Lake:
    """Where and what a statement may read."""

    catalog: str
    namespace: str
    may_read: Callable[[str, str], bool]  # (namespace, table) -> allowed
    snapshot_at: Callable[[str, AsOf], int | None]  # table -> its snapshot at that time (None: none then)


def run(spark: SparkSession, query: Query, lake: Lake) -> Answer:
    """``query`` on ``spark``, or Refused/Forbidden/TimedOut/QueryError with a one-line reason.
    It sets the session's current namespace and drops the temporary views it made before it
    returns: the session can answer the next query (restcatalog.query keeps a pool of them)."""
    with explained(spark, query, lake) as (statement, plan, checked):
        scans = check_plan(plan, checked, query.as_of)
        args: Any = query.params
        df = spark.sql(statement, args=args).limit(query.max_rows + 1)
        table = collect(spark, df.toArrow, query.timeout_s, query.cancel)
    truncated = table.num_rows > query.max_rows
    return Answer(table.slice(0, query.max_rows) if truncated else table, truncated, scans)


@contextlib.contextmanager
def explained(spark: SparkSession, query: Query, lake: Lake) -> Iterator[tuple[str, str, Lake]]:
    """The statement as it will run (history views made, ``asOf`` asked for), its ``EXPLAIN
    FORMATTED`` plan and the lake to check it with; the temporary views dropped after."""
    statement = check_statement(query.sql)
    # time_travel and check_plan both ask for a table's snapshot then: one catalog load each.
    lake = dataclasses.replace(lake, snapshot_at=functools.cache(lake.snapshot_at))
    spark.sql(f"USE {quote(lake.catalog)}.{quote(lake.namespace)}")
    # With push-down, Iceberg answers count(*), min and max from its manifests while Spark plans:
    # the plan then holds literal rows and no scan, and check_plan would not see the table read.
    spark.conf.set(AGGREGATE_PUSH_DOWN, "false")
    views: list[str] = []
    try:
        views += history_views(spark, statement, lake)
        if query.as_of is not None:
            statement = time_travel(spark, statement, lake, query.as_of, query.params, views)
        args: Any = query.params
        check_touched(spark, statement, args, lake)
        row = spark.sql("EXPLAIN FORMATTED " + statement, args=args).first()
        plan = str(row[0]) if row else ""
        if plan.startswith(PLANNING_FAILED):
            planning_error(spark, statement, args, lake, plan)
        yield statement, plan, lake
    finally:
        for name in views:
            spark.catalog.dropTempView(name)


def check_touched(spark: SparkSession, statement: str, args: Any, lake: Lake) -> None:
    """Forbidden (Refused for another catalog) when the statement touches a table the client may
    not read, known or not, before any answer or error of Spark's can say something about it: the
    relations of the analyzed plan (:mod:`cdclake.lake.relations`); when EXPLAIN could not show
    one, any word of the statement naming such a table. A statement that failed analysis then
    raises Spark's error."""
    row = spark.sql("EXPLAIN EXTENDED " + statement, args=args).first()
    found = relations.touched(str(row[0]) if row else "")
    if found is None:
        shown = spark.sql(f"SHOW TABLES IN {quote(lake.catalog)}.{quote(lake.namespace)}").collect()
        for word in sorted(names_in(statement) & {str(r["tableName"]).lower() for r in shown}):
            if not lake.may_read(lake.namespace, word):
                raise Forbidden(f"this client may not read {lake.namespace}.{word}")
        return
    home = f"{lake.catalog}.{lake.namespace}".lower()
    for name in found.resolved + found.unresolved:
        t = relations.table_of(name, lake.catalog, lake.namespace)
        if t is None and name in found.resolved:
            raise Refused(f"the query reads {'.'.join(name)}: only the tables of {home} can be read here")
        if t is None or not lake.may_read(*t):
            shown_as = ".".join(t).lower() if t else ".".join(name).lower()
            raise Forbidden(f"this client may not read {shown_as}")
    if found.failed:
        planning_error(spark, statement, args, lake, "")


def planning_error(spark: SparkSession, statement: str, args: Any, lake: Lake, plan: str) -> None:
    """Raise the error EXPLAIN only printed (analysis gives it with its condition). A table that is
    not there and that the client could not read if it were is Forbidden, as an existing one is:
    the answer does not tell a client which tables exist outside its rights."""
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
    raise QueryError(error_line(RuntimeError(plan.removeprefix(PLANNING_FAILED).lstrip(": \n") or plan)))


def check_plan(plan: str, lake: Lake, as_of: AsOf | None) -> list[Scan]:
    """The plan's scans, if the statement may run as planned; else Refused or Forbidden."""
    scans, other = plan_scans(plan)
    home = f"{lake.catalog}.{lake.namespace}".lower()
    if other:
        raise Refused(f"the query reads {other[0].split(' [')[0]}: only the tables of {home} can be read here")
    if calls := java_calls(plan):
        raise Refused(f"function {calls[0]} calls Java methods and is not allowed here")
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
        want = lake.snapshot_at(table, as_of)
        if want is None:
            raise Refused(f"asOf {as_of.describe()}: {lake.namespace}.{table} has no snapshot at that time")
        if s.snapshot_id != want:
            raise Refused(
                f"asOf {as_of.describe()}: the query would read {table} at snapshot {s.snapshot_id}, not at "
                f"{want} (its snapshot then); name it {table} or {lake.catalog}.{lake.namespace}.{table}"
            )
    return scans


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
        if lake.snapshot_at(name, as_of) is None:
            continue  # nothing to read then: if the query reads it, check_plan says so
        source = f"{quote(lake.catalog)}.{quote(lake.namespace)}.{quote(name)}"
        spark.sql(f"CREATE OR REPLACE TEMPORARY VIEW {quote(name)} AS SELECT * FROM {source} {as_of.clause()}")
        if views is not None:
            views.append(name)
    return statement


def history_views(spark: SparkSession, statement: str, lake: Lake) -> list[str]:
    """``<table>__history`` in ``statement``: a temporary view of that table's row history
    (:func:`cdclake.lake.statements.history_sql`), when the table has a change history. The
    views made."""
    made = []
    for name in sorted(w for w in names_in(statement) if w.endswith(HISTORY_SUFFIX) and len(w) > len(HISTORY_SUFFIX)):
        table = name.removesuffix(HISTORY_SUFFIX)
        if not lake.may_read(lake.namespace, table + CHANGES_SUFFIX):
            continue  # not even whether it exists: the name stays unresolved, and Forbidden
        if spark.catalog.tableExists(f"{quote(lake.catalog)}.{quote(lake.namespace)}.{quote(table + CHANGES_SUFFIX)}"):
            body = history_sql(lake.catalog, lake.namespace, table)
            spark.sql(f"CREATE OR REPLACE TEMPORARY VIEW {quote(name)} AS {body}")
            made.append(name)
    return made


def names_in(statement: str) -> set[str]:
    """Every word and quoted name of ``statement``, lower-cased: what may name a table."""
    return {t.strip("`").replace("``", "`").lower() for k, t in tokens(statement) if k in ("word", "quoted")}


def collect(
    spark: SparkSession, fetch: Callable[[], pa.Table], timeout_s: float, cancel: threading.Event | None = None
) -> pa.Table:
    """``fetch()``, its Spark jobs interrupted after ``timeout_s`` (TimedOut) or once ``cancel``
    is set (Cancelled)."""
    tag = f"cdclake-query-{uuid.uuid4().hex}"
    fired: list[QueryError] = []
    done = threading.Event()

    def interrupt(why: QueryError) -> None:
        fired.append(why)
        spark.interruptTag(tag)

    def watch() -> None:
        # One wait for both: the deadline, and the caller's cancel (checked every 0.1 s).
        deadline = time.monotonic() + timeout_s
        while not done.wait(min(0.1, max(0.0, deadline - time.monotonic()))):
            if cancel is not None and cancel.is_set():
                return interrupt(Cancelled("the query was cancelled: its client went away"))
            if time.monotonic() >= deadline:
                return interrupt(
                    TimedOut(f"the query ran longer than its timeout of {timeout_s:g} s and was cancelled")
                )

    spark.addTag(tag)
    watcher = threading.Thread(target=watch, name=tag, daemon=True)
    watcher.start()
    try:
        return fetch()
    except Exception:
        if fired:
            raise fired[0] from None
        raise
    finally:
        done.set()
        spark.removeTag(tag)
