"""``cdclake sql``, ``cdclake tables`` and ``cdclake snapshots``: statement splitting, time
travel (``--as-of``), result formatting (aligned table, CSV, JSON lines), Spark sessions for
queries (the running Spark Connect server when one answers, else an in-process session), and the
pyiceberg reports (no JVM) of tables and snapshots.

pyspark, pyiceberg and httpx are imported inside functions: ``cdclake`` imports stay light.
"""

from __future__ import annotations

import base64
import contextlib
import csv
import dataclasses
import json
import logging
import math
import os
import re
import socket
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import IO, Any
from urllib.parse import urlsplit

from cdclake.config.settings import Settings
from cdclake.contracts.watermark import EVENT_COUNTS, SUMMARY_KEY, counts_of

FORMATS = ("table", "csv", "json")
CATALOGS = ("jdbc", "rest")
REST_CATALOG = "rest"
"""Spark name of the REST catalog that ``--catalog rest`` attaches (as in the README, "Query engines")."""
TABLE_ROWS = 100
"""Default ``--max-rows`` of the table format; CSV and JSON print every row by default."""
MAX_CELL = 60
"""Longer values are cut to this many characters (ending in ``…``) in the table format."""
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

# The two documented time-travel questions (README "Time travel"); tests run these very texts.
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


class QueryError(RuntimeError):
    """A statement, option or table the user must fix; the message is one line."""


# ---------------------------------------------------------------- statements


_TOKEN = re.compile(
    r"""(?P<ws>\s+)
    |(?P<comment>--[^\n]*|/\*.*?\*/)
    |(?P<string>'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")
    |(?P<quoted>`(?:[^`]|``)*`)
    |(?P<word>\w+)
    |(?P<open>['"`]|/\*)
    |(?P<punct>.)""",
    re.S | re.X,
)
_QUIET = ("ws", "comment")


def tokens(text: str) -> list[tuple[str, str]]:
    """SQL text as ``(kind, text)`` tokens; an unterminated string or comment is one ``open``
    token running to the end."""
    out: list[tuple[str, str]] = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        assert m is not None and m.lastgroup is not None  # ``punct`` matches any character
        if m.lastgroup == "open":
            out.append(("open", text[pos:]))
            break
        out.append((m.lastgroup, m.group()))
        pos = m.end()
    return out


def split_statements(text: str) -> tuple[list[str], str]:
    """The ``;``-terminated statements of ``text`` (stripped) and the unterminated rest as written
    ("" if it is only blanks and comments). Semicolons inside strings, quoted names and comments do not end a
    statement."""
    done: list[str] = []
    current: list[tuple[str, str]] = []
    for kind, tok in tokens(text):
        if kind == "punct" and tok == ";":
            if any(k not in _QUIET for k, _ in current):
                done.append("".join(t for _, t in current).strip())
            current = []
        else:
            current.append((kind, tok))
    rest = "".join(t for _, t in current) if any(k not in _QUIET for k, _ in current) else ""
    return done, rest


def statements_of(text: str) -> list[str]:
    """Every statement of a file or argument; the last one needs no ``;``."""
    done, rest = split_statements(text)
    return [*done, rest.strip()] if rest else done


# ---------------------------------------------------------------- time travel


@dataclass(frozen=True)
class AsOf:
    """``--as-of``: a snapshot id (digits) or a point in time (epoch milliseconds)."""

    snapshot_id: int | None = None
    timestamp_ms: int | None = None

    def clause(self) -> str:
        if self.snapshot_id is not None:
            return f"VERSION AS OF {self.snapshot_id}"
        # Epoch milliseconds, not a string: a string literal is read in the session time zone.
        return f"TIMESTAMP AS OF timestamp_millis({self.timestamp_ms})"

    def describe(self) -> str:
        if self.snapshot_id is not None:
            return f"snapshot {self.snapshot_id}"
        assert self.timestamp_ms is not None
        return (EPOCH + timedelta(milliseconds=self.timestamp_ms)).isoformat(timespec="milliseconds")


def parse_as_of(text: str) -> AsOf:
    """Digits: a snapshot id. Otherwise an ISO 8601 time (``2026-01-01``, ``2026-01-01 12:00:00``,
    ``2026-01-01T12:00:00.250+02:00``, ``...Z``); without an offset it is UTC."""
    t = text.strip()
    if re.fullmatch(r"-?\d+", t):
        return AsOf(snapshot_id=int(t))
    try:
        when = datetime.fromisoformat(t)
    except ValueError:
        raise QueryError(
            f"--as-of {text!r} is neither a snapshot id (digits) nor an ISO 8601 time such as 2026-01-01T12:00:00Z"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return AsOf(timestamp_ms=(when - EPOCH) // timedelta(milliseconds=1))


def _name(tok: tuple[str, str]) -> str | None:
    kind, text = tok
    if kind == "word":
        return text.lower()
    if kind == "quoted":
        return text[1:-1].replace("``", "`").lower()
    return None


def with_as_of(statement: str, catalogs: Sequence[str], namespace: str, as_of: AsOf) -> tuple[str, list[str]]:
    """``statement`` with ``as_of``'s clause after every table written ``<catalog>.<namespace>.<table>``
    (``catalogs``: the names that may stand first), and the tables so read.

    Only queries (SELECT, WITH, FROM) are rewritten. A reference followed by ``.`` (a metadata
    table such as ``orders.snapshots``, or a column) or already carrying ``VERSION``/``TIMESTAMP``/
    ``FOR ... AS OF`` is left alone. A snapshot id belongs to one table, so with an id the
    statement must read exactly one table.
    """
    toks = tokens(statement)
    sig = [i for i, (k, _) in enumerate(toks) if k not in _QUIET]
    first = toks[sig[0]][1].upper() if sig else ""
    if first not in ("SELECT", "WITH", "FROM", "("):
        raise QueryError(f"--as-of applies to queries (SELECT, WITH, FROM), not to {first or 'an empty'} statement")
    cats = {c.lower() for c in catalogs}
    ns = namespace.lower()
    dot = ("punct", ".")
    after: dict[int, str] = {}
    read: list[str] = []
    for j in range(len(sig) - 4):
        a, d1, b, d2, c = (toks[i] for i in sig[j : j + 5])
        if _name(a) not in cats or d1 != dot or _name(b) != ns or d2 != dot or _name(c) is None:
            continue
        if j > 0 and toks[sig[j - 1]] == dot:
            continue  # part of a longer name
        nxt = toks[sig[j + 5]] if j + 5 < len(sig) else ("", "")
        if nxt == dot or (nxt[0] == "word" and nxt[1].upper() in ("VERSION", "TIMESTAMP", "FOR")):
            continue
        after[sig[j + 4]] = as_of.clause()
        name = f"{_name(a)}.{ns}.{_name(c)}"
        if name not in read:
            read.append(name)
    if not read:
        raise QueryError(
            f"--as-of: the statement reads no table written {catalogs[0]}.{namespace}.<table>; "
            "name the tables fully qualified"
        )
    if as_of.snapshot_id is not None and len({r.split(".")[-1] for r in read}) > 1:
        raise QueryError(
            f"--as-of {as_of.snapshot_id}: a snapshot id belongs to one table, but the statement reads "
            f"{', '.join(read)}; use a time, or VERSION AS OF in the SQL"
        )
    out = []
    for i, (_, text) in enumerate(toks):
        out.append(text)
        if i in after:
            out.append(" " + after[i])
    return "".join(out), read


# ---------------------------------------------------------------- output


@dataclass
class Result:
    columns: list[str]
    rows: list[tuple[Any, ...]]
    more: bool = False
    """More rows than ``rows`` exist (``--max-rows`` cut them)."""


def _jsonable(v: Any) -> Any:
    if v is None or isinstance(v, bool | int | str):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else str(v)
    if isinstance(v, Decimal):
        return float(v)
    if isinstance(v, datetime):
        return v.isoformat()
    if isinstance(v, date):
        return v.isoformat()
    if isinstance(v, timedelta):
        return round(v.total_seconds(), 3)
    if isinstance(v, bytes | bytearray):
        return base64.b64encode(v).decode()
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        if v and all(isinstance(x, tuple) and len(x) == 2 for x in v):  # an Arrow map: (key, value) pairs
            return {str(k): _jsonable(x) for k, x in v}
        return [_jsonable(x) for x in v]
    if hasattr(v, "asDict"):
        return _jsonable(v.asDict(recursive=True))
    return str(v)


def _human_duration(d: timedelta) -> str:
    s = int(d.total_seconds())
    sign, s = ("-", -s) if s < 0 else ("", s)
    days, s = divmod(s, 86400)
    hours, s = divmod(s, 3600)
    minutes, s = divmod(s, 60)
    if days:
        return f"{sign}{days}d {hours:02d}h"
    if hours:
        return f"{sign}{hours}h {minutes:02d}m"
    if minutes:
        return f"{sign}{minutes}m {s:02d}s"
    return f"{sign}{s}s"


def _time_text(v: datetime) -> str:
    if v.tzinfo is not None:
        v = v.astimezone(UTC).replace(tzinfo=None)
    text = v.isoformat(sep=" ", timespec="microseconds" if v.microsecond % 1000 else "milliseconds")
    return text.removesuffix(".000")


def text_value(v: Any, null: str = "NULL") -> str:
    """One value as text: times in UTC (``2026-01-01 12:00:00.250``), nested values as JSON."""
    if v is None:
        return null
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, datetime):
        return _time_text(v)
    if isinstance(v, timedelta):
        return _human_duration(v)
    if isinstance(v, str):
        return v
    if isinstance(v, int | float | Decimal | date):
        return str(v)
    return json.dumps(_jsonable(v), separators=(",", ":"), ensure_ascii=False)


def _csv_value(v: Any) -> Any:
    # Machine-readable: ISO 8601 times with their offset, durations in seconds.
    return _jsonable(v) if isinstance(v, datetime | timedelta) else text_value(v, null="")


def _cell(v: Any) -> str:
    text = text_value(v).replace("\r", "\\r").replace("\n", "\\n").replace("\t", " ")
    return text if len(text) <= MAX_CELL else text[: MAX_CELL - 1] + "…"


def _numeric(v: Any) -> bool:
    return isinstance(v, int | float | Decimal) and not isinstance(v, bool)


def render(result: Result, fmt: str, out: IO[str]) -> None:
    """``table``: aligned columns, long values cut, a row-count footer. ``csv``: a header line,
    empty for NULL, nested values as JSON. ``json``: one object per line (JSON lines)."""
    if fmt == "csv":
        if not result.columns:
            return
        w = csv.writer(out, lineterminator="\n")
        w.writerow(result.columns)
        for row in result.rows:
            w.writerow([_csv_value(v) for v in row])
        return
    if fmt == "json":
        for row in result.rows:
            out.write(
                json.dumps({c: _jsonable(v) for c, v in zip(result.columns, row, strict=True)}, ensure_ascii=False)
            )
            out.write("\n")
        return
    if not result.columns:
        out.write("OK\n")
        return
    cells = [[_cell(v) for v in row] for row in result.rows]
    widths = [max([len(c), *(len(r[i]) for r in cells)]) for i, c in enumerate(result.columns)]
    right = [any(_numeric(row[i]) for row in result.rows) for i in range(len(result.columns))]
    out.write(" | ".join(c.ljust(w) for c, w in zip(result.columns, widths, strict=True)).rstrip() + "\n")
    out.write("-+-".join("-" * w for w in widths) + "\n")
    for r in cells:
        line = " | ".join(c.rjust(w) if rt else c.ljust(w) for c, w, rt in zip(r, widths, right, strict=True))
        out.write(line.rstrip() + "\n")
    n = len(result.rows)
    if result.more:
        out.write(f"(first {n} rows; --max-rows N shows more, 0 all)\n")
    else:
        out.write(f"({n} row{'' if n == 1 else 's'})\n")


# ---------------------------------------------------------------- Spark


def error_line(exc: BaseException) -> str:
    """A Spark, Iceberg or JVM error as one line without a stack trace."""
    java = getattr(exc, "java_exception", None)  # py4j: an exception pyspark did not convert
    text = str(java.toString()) if java is not None else str(exc)
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), type(exc).__name__)
    line = re.sub(r"^\((?:[\w$]+\.)+[\w$]+\)\s*", "", line)  # Spark Connect: "(org.x.FooException) msg"
    line = re.sub(r"^(?:[a-z_$][\w$]*\.)+[A-Z][\w$]*(?:Exception|Error):\s*", "", line)  # Java: "org.x.Foo: msg"
    return line if len(line) <= 400 else line[:399] + "…"


def _quiet_pyspark() -> None:
    # pyspark logs every SQL error with its JVM stack trace as JSON on stderr; the CLI prints one line.
    from pyspark.logger import PySparkLogger

    for name in ("SQLQueryContextLogger", "DataFrameQueryContextLogger"):
        PySparkLogger.getLogger(name).setLevel(logging.CRITICAL)


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


def rest_url(settings: Settings) -> str:
    host = "127.0.0.1" if settings.rest_host in ("0.0.0.0", "::", "") else settings.rest_host
    return f"http://{host}:{settings.rest_port}"


def rest_conf(settings: Settings, name: str = REST_CATALOG) -> dict[str, str]:
    """Spark properties of a catalog ``name`` on the REST catalog server. With a tokens file on the
    server, ``CDCLAKE_REST_CREDENTIAL=<client id>:<secret>`` supplies the client credentials."""
    url = rest_url(settings)
    c = f"spark.sql.catalog.{name}"
    conf = {c: "org.apache.iceberg.spark.SparkCatalog", f"{c}.type": "rest", f"{c}.uri": url}
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

    url = rest_url(settings)
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
    say: Callable[[str], None] = dataclasses.field(default=lambda msg: print(f"[cdclake] {msg}", file=sys.stderr))

    def prepare(self, statement: str) -> str:
        if self.as_of is None:
            return statement
        stmt, read = with_as_of(
            statement, [self.catalog, self.settings.catalog_name], self.settings.namespace, self.as_of
        )
        self.say(f"as of {self.as_of.describe()}: {', '.join(read)}")
        return stmt

    def run(self, statement: str) -> Result:
        """Run one statement; a failure raises :class:`QueryError` with Spark's message in one line."""
        stmt = self.prepare(statement)
        limit = self.max_rows if self.max_rows is not None else (TABLE_ROWS if self.fmt == "table" else 0)
        try:
            df = self.spark.sql(stmt)
            columns = list(df.columns)
            if not columns:
                return Result([], [])
            table = (df.limit(limit + 1) if limit else df).toArrow()
        except Exception as exc:  # Spark, Iceberg, the JVM or the Connect channel: one line
            raise QueryError(error_line(exc)) from None
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
    a Spark in this process (~10 s to start). ``catalog="rest"`` attaches the REST catalog server
    as Spark catalog ``rest`` (``spark.conf.set`` at runtime: catalogs load on first use).
    """
    if catalog not in CATALOGS:
        raise QueryError(f"--catalog must be one of {', '.join(CATALOGS)}, got {catalog!r}")
    say = say or (lambda msg: print(f"[cdclake] {msg}", file=sys.stderr))
    if catalog == "rest":
        check_rest(settings)
    _quiet_pyspark()
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
        say(f"no Spark Connect server at {url or '(CDCLAKE_SPARK_CONNECT_URL empty)'}; starting Spark (~10 s)")
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


# ---------------------------------------------------------------- pyiceberg reports (no JVM)


def _ms_time(ms: int | None) -> datetime | None:
    return None if ms is None else EPOCH + timedelta(milliseconds=ms)


def last_applied_ms(table: Any) -> int | None:
    """Commit time of the newest snapshot in the current ancestry that carries the apply watermark."""
    from pyiceberg.table.snapshots import ancestors_of

    current = table.current_snapshot()
    if current is None:
        return None
    for snap in ancestors_of(current, table.metadata):
        if snap.summary is not None and SUMMARY_KEY in snap.summary.additional_properties:
            return int(snap.timestamp_ms)
    return None


def live_rows(table: Any, fallback: int) -> int:
    """Rows a reader sees: the current snapshot's records minus its position deletes (what
    merge-on-read MERGE and DELETE write), from the summary totals; ``fallback`` without them."""
    snap = table.current_snapshot()
    props = snap.summary.additional_properties if snap is not None and snap.summary is not None else {}
    try:
        return int(props["total-records"]) - int(props.get("total-position-deletes", 0))
    except (KeyError, ValueError):
        return fallback


def tables_report(settings: Settings, now: datetime | None = None) -> Result:
    """Every table of the namespace (side tables included): live rows, data and delete files,
    snapshots, last apply (commit time of the newest snapshot with the apply watermark),
    valid-through (the newest ``_cdc_ts`` in the data files) and freshness (now - valid-through)."""
    from cdclake.lake.catalog import load_table
    from cdclake.lake.health import all_tables, table_health

    now = now or datetime.now(UTC)
    columns = ["table", "rows", "data_files", "delete_files", "snapshots", "last_applied", "valid_through", "freshness"]
    rows = []
    for name in all_tables(settings):
        h = table_health(settings, name)
        t = load_table(settings, name)
        if h is None or t is None:
            continue  # dropped meanwhile
        valid = _ms_time(h.valid_through_ms)
        rows.append(
            (
                name,
                live_rows(t, h.rows),
                h.data_files,
                h.delete_files,
                h.snapshots,
                _ms_time(last_applied_ms(t)),
                valid,
                None if valid is None else now - valid,
            )
        )
    return Result(columns, rows)


def resolve_table(settings: Settings, name: str) -> str:
    """``orders``, ``cdc.orders`` or ``lake.cdc.orders`` -> ``orders``."""
    parts = [p.strip("`").lower() for p in name.split(".")]
    ok = (
        len(parts) <= 3
        and all(parts)
        and (len(parts) < 3 or parts[0] == settings.catalog_name.lower())
        and (len(parts) < 2 or parts[-2] == settings.namespace.lower())
    )
    if not ok:
        raise QueryError(
            f"{name!r}: name a table as <table>, {settings.namespace}.<table> or "
            f"{settings.catalog_name}.{settings.namespace}.<table>"
        )
    return parts[-1]


def snapshots_report(settings: Settings, table: str) -> Result:
    """Every snapshot of a table, oldest first, with its apply watermark flag and the
    ``cdclake.events-*`` accounting of the apply that made it."""
    from pyiceberg.table.snapshots import ancestors_of

    from cdclake.lake.catalog import load_table
    from cdclake.lake.health import all_tables

    name = resolve_table(settings, table)
    t = load_table(settings, name)
    if t is None:
        known = ", ".join(all_tables(settings)) or "none yet"
        raise QueryError(f"no table {settings.catalog_name}.{settings.namespace}.{name} (tables: {known})")
    current = t.current_snapshot()
    on_main = {s.snapshot_id for s in ancestors_of(current, t.metadata)} if current is not None else set()
    columns = [
        "snapshot_id",
        "parent_id",
        "committed_at",
        "operation",
        "current_ancestor",
        "watermark",
        *EVENT_COUNTS,
    ]
    rows = []
    for s in sorted(t.metadata.snapshots, key=lambda s: (s.timestamp_ms, s.sequence_number or 0)):
        props = dict(s.summary.additional_properties) if s.summary is not None else {}
        counts = counts_of(props)
        rows.append(
            (
                s.snapshot_id,
                s.parent_snapshot_id,
                _ms_time(s.timestamp_ms),
                s.summary.operation.value if s.summary is not None else None,
                s.snapshot_id in on_main,
                SUMMARY_KEY in props,
                *counts,
            )
        )
    return Result(columns, rows)
