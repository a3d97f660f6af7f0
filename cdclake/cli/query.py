"""``cdclake sql``: Spark sessions for queries (the running Spark Connect server when one
answers, else an in-process session), the statements run on them, and the shell.
Statements and ``--as-of`` are :mod:`cdclake.query.statements`, printing is :mod:`cdclake.cli.output`,
``cdclake tables``/``snapshots`` are :mod:`cdclake.cli.reports`.

pyspark, pyiceberg and httpx are imported inside functions: ``cdclake`` imports stay light.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import socket
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import IO, Any
from urllib.parse import urlsplit

from cdclake.cli.output import TABLE_ROWS, Result, render
from cdclake.config.settings import Settings
from cdclake.lake.spark import quiet_pyspark
from cdclake.query import queries
from cdclake.query.queries import error_line
from cdclake.query.readonly import NotAQuery
from cdclake.query.statements import AsOf, Cut, QueryError, split_statements

CATALOGS = ("jdbc", "rest")
REST_CATALOG = "rest"
"""Spark name of the REST catalog that ``--catalog rest`` attaches (as in docs/querying.md, "Query
engines over the REST catalog")."""


# The two documented time-travel questions (docs/querying.md, "Time travel"); tests run these very texts.
# CHANGES_SINCE reads every apply in the ancestry (each snapshot carrying a watermark) in Spark SQL,
# for a user to paste into any engine: it cannot call cdclake.contracts.watermark.newest_carrying,
# which finds only the newest one (what the reports and expiry need).
ROW_AT = """\
SELECT * FROM {catalog}.{namespace}.{table} TIMESTAMP AS OF '{at}'
WHERE _cdc_row_id = '{key}'"""

CHANGES_SINCE = """\
WITH applies AS (
  SELECT h.snapshot_id, h.made_current_at AS committed_at,
         lag(h.made_current_at) OVER (ORDER BY h.made_current_at) AS previous_apply_at
  FROM {catalog}.{namespace}.{table}.history h
  JOIN {catalog}.{namespace}.{table}.snapshots s ON s.snapshot_id = h.snapshot_id
  WHERE h.is_current_ancestor AND s.summary['cdclake.watermark'] IS NOT NULL
)
SELECT a.snapshot_id, a.committed_at AS applied_at, c.*
FROM {catalog}.{namespace}.{table}__changes c
JOIN applies a
  ON c._cdc_committed_at <= a.committed_at
 AND (a.previous_apply_at IS NULL OR c._cdc_committed_at > a.previous_apply_at)
WHERE c._cdc_row_id = '{key}' AND a.committed_at > TIMESTAMP '{at}'
ORDER BY a.committed_at, c._cdc_order, c._cdc_seq"""


def connect_answers(url: str, timeout: float = 0.5) -> bool:
    """Whether something listens at the ``sc://host:port`` of a Spark Connect server."""
    parts = urlsplit(url)
    if not url or not parts.hostname:
        return False
    try:
        with socket.create_connection((parts.hostname, parts.port or 15002), timeout=timeout):
            return True
    except OSError:
        return False


def rest_conf(settings: Settings, name: str = REST_CATALOG) -> dict[str, str]:
    """Spark properties of a catalog ``name`` on the REST catalog server. With a tokens file on the
    server, ``CDCLAKE_REST_CREDENTIAL=<client id>:<secret>`` supplies the client credentials."""
    url = settings.rest_url
    c = f"spark.sql.catalog.{name}"
    # cache-enabled: as the JDBC catalog's (cdclake.lake.spark.catalog_conf), every statement sees
    # the newest commit.
    conf = {
        c: "org.apache.iceberg.spark.SparkCatalog",
        f"{c}.type": "rest",
        f"{c}.uri": url,
        f"{c}.cache-enabled": "false",
    }
    credential = os.environ.get("CDCLAKE_REST_CREDENTIAL", "")
    if credential:
        conf |= {
            f"{c}.credential": credential,
            f"{c}.oauth2-server-uri": f"{url}/v1/oauth/tokens",
            f"{c}.scope": "catalog",
        }
    return conf


def check_rest(settings: Settings) -> None:
    """A clear error, before any Spark starts, when no REST catalog answers."""
    import httpx

    url = settings.rest_url
    try:
        r = httpx.get(f"{url}/v1/config", timeout=5, trust_env=False)
    except httpx.HTTPError:
        raise QueryError(
            f"no REST catalog answers at {url}; start it with `cdclake rest` (or set CDCLAKE_REST_HOST/_PORT)"
        ) from None
    if r.status_code == 401 and not os.environ.get("CDCLAKE_REST_CREDENTIAL"):
        raise QueryError(f"the REST catalog at {url} wants a token: set CDCLAKE_REST_CREDENTIAL=<client id>:<secret>")


@dataclass
class QuerySession:
    spark: Any
    settings: Settings
    catalog: str
    """Spark name of the catalog in use: the JDBC catalog's name, or :data:`REST_CATALOG`."""
    kind: str
    """``connect``, ``local`` (a JVM in this process) or ``given`` (a caller's session)."""
    max_rows: int | None = None
    fmt: str = "table"
    as_of: AsOf | None = None
    cut: Cut | None = None
    """``--consistent`` / ``--as-of-position``: every table of a query at one cut."""
    say: Callable[[str], None] = dataclasses.field(default=lambda msg: print(f"[cdclake] {msg}", file=sys.stderr))

    def lake(self) -> queries.Lake:
        """The query engine's view of the lake, without read rights (the CLI reads what its
        catalog lets it)."""
        from cdclake.query.cuts import pin_tables
        from cdclake.query.queries import snapshot_at

        at = functools.partial(snapshot_at, self.settings)
        pin = functools.partial(pin_tables, self.settings)
        return queries.Lake(self.catalog, self.settings.namespace, lambda *_: True, at, pin)

    def run(self, statement: str) -> Result:
        """Run one statement; a failure raises :class:`QueryError` with Spark's message in one line.
        ``<table>__history`` names the row history, as in the query API. With ``as_of``, the
        query runs as the query API runs it (:func:`cdclake.query.queries.explained`): one-part
        and qualified names read at that time, and Spark's plan checked to read every table then.
        With ``cut``, the same with each table at its snapshot of the cut."""
        try:
            if self.as_of is None and self.cut is None:
                queries.history_views(self.spark, statement, self.lake())
                return self.fetch(statement)
            query = queries.Query(statement, as_of=self.as_of, cut=self.cut)
            with queries.explained(self.spark, query, self.lake()) as (stmt, ex, lake, at):
                scans = queries.check_plan(*queries.physical_scans(ex.physical), lake, at)
                read = ", ".join(f"{s.table}@{s.snapshot_id}" for s in scans if not s.metadata)
                self.say(f"as of {at.describe() if at else ''}: {read}")
                return self.fetch(stmt)
        except NotAQuery as exc:
            flag = (
                "--as-of" if self.cut is None else ("--consistent" if self.cut.source is None else "--as-of-position")
            )
            raise QueryError(f"{flag} applies to queries: {exc}") from None
        except QueryError:
            raise
        except Exception as exc:  # Spark, Iceberg, the JVM or the Connect channel: one line
            raise QueryError(error_line(exc)) from None

    def fetch(self, statement: str) -> Result:
        limit = self.max_rows if self.max_rows is not None else (TABLE_ROWS if self.fmt == "table" else 0)
        df = self.spark.sql(statement)
        columns = list(df.columns)
        if not columns:
            return Result([], [])
        table = (df.limit(limit + 1) if limit else df).toArrow()
        values = [table.column(i).to_pylist() for i in range(table.num_columns)]
        rows = list(zip(*values, strict=True)) if values else []
        more = bool(limit) and len(rows) > limit
        return Result(columns, rows[:limit] if more else rows, more)

    def show(self, statement: str, out: IO[str], echo: bool = False) -> bool:
        """Run and print one statement; an error is printed as one line. True if it succeeded."""
        try:
            result = self.run(statement)
        except QueryError as exc:
            self.say(f"error: {exc}")
            return False
        if echo and self.fmt == "table":
            out.write(f"\nspark-sql> {statement}\n")
        render(result, self.fmt, out)
        out.flush()
        return True

    def cancel(self) -> None:
        with contextlib.suppress(Exception):
            if self.kind == "connect":
                self.spark.interruptAll()
            else:
                self.spark.sparkContext.cancelAllJobs()


@contextlib.contextmanager
def query_session(
    settings: Settings,
    catalog: str = "jdbc",
    spark: Any = None,
    say: Callable[[str], None] | None = None,
) -> Iterator[QuerySession]:
    """A Spark session for queries, its current namespace ``<catalog>.<namespace>``.

    ``spark`` given: used as is (and its current namespace restored at the end). Else the Spark
    Connect server at ``settings.spark_connect_url`` when one answers (a session costs ms), else
    a Spark in this process (a JVM start: seconds). ``catalog="rest"`` attaches the REST catalog server
    as Spark catalog ``rest`` (``spark.conf.set`` at runtime: catalogs load on first use).
    """
    if catalog not in CATALOGS:
        raise QueryError(f"--catalog must be one of {', '.join(CATALOGS)}, got {catalog!r}")
    say = say or (lambda msg: print(f"[cdclake] {msg}", file=sys.stderr))
    if catalog == "rest":
        check_rest(settings)
    quiet_pyspark()
    kind = "given"
    restore: tuple[str, str] | None = None
    if spark is not None:
        restore = (spark.catalog.currentCatalog(), spark.catalog.currentDatabase())
    else:
        spark, kind = _open_spark(settings, say)
    try:
        name = settings.catalog_name
        if catalog == "rest":
            name = REST_CATALOG
            for key, value in rest_conf(settings, name).items():
                spark.conf.set(key, value)
        try:
            spark.sql(f"USE `{name}`.`{settings.namespace}`")
        except Exception as exc:  # e.g. no namespace yet: fully qualified names still work
            say(f"note: USE {name}.{settings.namespace}: {error_line(exc)}")
        yield QuerySession(spark, settings, name, kind, say=say)
    finally:
        if restore is not None:
            with contextlib.suppress(Exception):
                spark.catalog.setCurrentCatalog(restore[0])
                if restore[1]:
                    spark.catalog.setCurrentDatabase(restore[1])
        elif kind in ("connect", "local"):
            with contextlib.suppress(Exception):
                spark.stop()


def _open_spark(settings: Settings, say: Callable[[str], None]) -> tuple[Any, str]:
    url = settings.spark_connect_url
    if connect_answers(url):
        remote: Any = None
        try:
            from cdclake.lake.spark import connect_session, connect_token

            remote = connect_session(url, connect_token(settings))
            remote.version  # noqa: B018 - one round trip: is it a Spark Connect server?
            return remote, "connect"
        except Exception as exc:
            if remote is not None:
                with contextlib.suppress(Exception):
                    remote.stop()
            say(f"Spark Connect at {url} did not answer ({error_line(exc)}); starting Spark in this process")
    else:
        say(f"no Spark Connect server at {url or '(CDCLAKE_SPARK_CONNECT_URL empty)'}; starting Spark in this process")
    from cdclake.lake.spark import session

    t0 = time.monotonic()
    spark = session(settings, "cdclake-sql")
    spark.sparkContext.setLogLevel("ERROR")
    say(f"Spark started in {time.monotonic() - t0:.0f}s")
    return spark, "local"


def shell(qs: QuerySession, read: Callable[[str], str], out: IO[str], interactive: bool) -> int:
    """Read ``;``-terminated statements until ``quit``, ``exit``, ``\\q`` or end of input; run each
    as it completes. Non-interactive input: 1 if any statement failed."""
    buffer = ""
    failed = False
    while True:
        prompt = ("cdclake> " if not buffer else "    ...> ") if interactive else ""
        try:
            line = read(prompt)
        except EOFError:
            if interactive:
                out.write("\n")
            if buffer:  # the last statement of piped input may lack its ';'
                failed |= not qs.show(buffer.strip(), out)
            break
        except KeyboardInterrupt:
            out.write("\n")
            buffer = ""
            continue
        if not buffer and line.strip().rstrip(";").strip().lower() in ("quit", "exit", "\\q"):
            break
        done, buffer = split_statements(buffer + line + "\n")
        for stmt in done:
            try:
                failed |= not qs.show(stmt, out)
            except KeyboardInterrupt:
                qs.cancel()
                qs.say("cancelled")
                failed = True
    return 1 if failed and not interactive else 0


def readline_input(settings: Settings) -> Callable[[str], str]:
    """``input`` with line editing and a history file (``$CDCLAKE_HOME/sql_history``) on a terminal."""
    try:
        import atexit
        import readline
    except ImportError:
        return input
    path = settings.home / "sql_history"
    with contextlib.suppress(OSError):
        readline.read_history_file(path)
    readline.set_history_length(1000)

    def save() -> None:
        with contextlib.suppress(OSError):
            path.parent.mkdir(parents=True, exist_ok=True)
            readline.write_history_file(path)

    atexit.register(save)
    return input
