"""``cdclake`` command line: demo, up, sql, tables, snapshots, quarantine, rest, init, debezium."""

from __future__ import annotations

import argparse
import signal
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from cdclake.cli import debezium_cmd, holds_cmd, quarantine_cmd
from cdclake.config.settings import Settings, SettingsError, load
from cdclake.orchestration.airflow_api import AirflowError

if TYPE_CHECKING:
    from cdclake.query.statements import Cut


def _sigterm(signum: int, frame: Any) -> NoReturn:
    # Turn SIGTERM into the same clean shutdown as Ctrl-C.
    raise KeyboardInterrupt


def sql(args: argparse.Namespace, settings: Settings, spark: Any = None) -> int:
    """``cdclake sql``: statements from the arguments and ``-f``, else the interactive shell."""
    from cdclake.cli.query import query_session, readline_input, shell
    from cdclake.query.statements import QueryError, parse_as_of, statements_of

    as_of = parse_as_of(args.as_of) if args.as_of else None
    cut = cut_of(args)
    if cut is not None and as_of is not None:
        raise QueryError(f"--as-of and --{'consistent' if cut.source is None else 'as-of-position'} cannot be combined")
    if args.max_rows is not None and args.max_rows < 0:
        raise QueryError("--max-rows must be >= 0 (0: all rows)")
    statements = [s for text in args.statement for s in statements_of(text)]
    if args.file:
        try:
            text = sys.stdin.read() if args.file == "-" else open(args.file, encoding="utf-8").read()  # noqa: SIM115
        except OSError as exc:
            raise QueryError(f"-f {args.file}: {exc.strerror}") from None
        statements += statements_of(text)
        if not statements:
            raise QueryError(f"-f {args.file}: no statement in it")
    with query_session(settings, args.catalog, spark) as qs:
        qs.fmt, qs.max_rows, qs.as_of, qs.cut = args.format, args.max_rows, as_of, cut
        if not statements:
            interactive = sys.stdin.isatty()
            if interactive:
                where = {
                    "connect": f"Spark Connect {settings.spark_connect_url}",
                    "local": "Spark in this process",
                }.get(qs.kind, "Spark")
                qs.say(
                    f"{where}, catalog {qs.catalog} ({args.catalog}), namespace {settings.namespace}"
                    + (f", as of {as_of.describe()}" if as_of else "")
                    + (f", {cut.label()}" if cut else "")
                    + "; end statements with ';', quit with Ctrl-D"
                )
            return shell(qs, readline_input(settings) if interactive else input, sys.stdout, interactive)
        for stmt in statements:
            if not qs.show(stmt, sys.stdout, echo=len(statements) > 1):
                return 1
    return 0


def cut_of(args: argparse.Namespace) -> Cut | None:
    """``--consistent`` or ``--as-of-position SOURCE=POSITION`` (not both) as a cut."""
    from cdclake.lake.positions import key
    from cdclake.query.statements import Cut, QueryError

    consistent, at = getattr(args, "consistent", False), getattr(args, "as_of_position", None)
    if consistent and at:
        raise QueryError("--consistent and --as-of-position cannot be combined (a position is one cut already)")
    if consistent:
        return Cut()
    if not at:
        return None
    source, eq, position = at.partition("=")
    if not (eq and source.strip() and position.strip()):
        raise QueryError(f"--as-of-position wants SOURCE=POSITION (pg=0/16B3748), got {at!r}")
    position = position.strip()
    if key(position) is None and any(key(p) is None for p in position.split(",")):
        raise QueryError(f"--as-of-position: {position!r} is not an LSN, integer, GTID (set) or binlog file:offset")
    return Cut(source.strip(), position)


def tables(settings: Settings, fmt: str) -> int:
    from cdclake.cli.output import render
    from cdclake.cli.reports import tables_report

    render(tables_report(settings), fmt, sys.stdout)
    return 0


def snapshots(settings: Settings, table: str, fmt: str) -> int:
    from cdclake.cli.output import render
    from cdclake.cli.reports import snapshots_report

    render(snapshots_report(settings, table), fmt, sys.stdout)
    return 0


def init(args: argparse.Namespace, settings: Settings) -> int:
    from cdclake.lake.bootstrap import init as bootstrap

    bootstrap(settings, args.airflow, say=lambda m: print(f"[cdclake] {m}", flush=True))
    return 0


def rest() -> int:
    # Imported here, not at the top: cdclake is the layer below the services (tests/project/test_import_graph.py
    # lists this one entry point), and no other command should load uvicorn, Starlette and pyiceberg.
    from restcatalog.__main__ import main as serve

    serve()
    return 0


def demo(args: argparse.Namespace, settings: Settings) -> int:
    from cdclake.config.private import owner_only
    from cdclake.dev.demo import demo as run

    with owner_only():  # the stack's state is the owner's alone (so are the supervisor's files)
        return run(settings, args.keep_running)


def up(settings: Settings) -> int:
    from cdclake.config.private import owner_only
    from cdclake.dev.demo import login_hint, wait_forever
    from cdclake.dev.stack import LocalStack

    with owner_only(), LocalStack(settings) as stack:  # the stack's state is the owner's alone
        stack.say(
            f"receiver: {settings.receiver_url}/v1/batches (batches), {settings.receiver_url}/v1/debezium "
            "(Debezium Server's HTTP sink: `cdclake debezium`)"
        )
        stack.say(f"Iceberg REST catalog: {stack.rest_url} (`cdclake sql --catalog rest`; engines: docs/querying.md)")
        stack.say(login_hint(stack))
        stack.say("Ctrl-C stops everything")
        wait_forever(stack)
    return 0


def status(settings: Settings, fmt: str) -> int:
    """The supervisor's view of the running stack (cdclake.dev.supervise); 1 when none runs."""
    from cdclake.cli.output import Result, render
    from cdclake.dev.supervise import alive, read_status

    doc = read_status(settings.home / "logs")
    if doc is None:
        print(f"[cdclake] no stack is running from {settings.home} (`cdclake up` starts one)", file=sys.stderr)
        return 1
    rows = []
    for name, c in sorted(doc["components"].items()):
        state = c["state"] if alive(c["pid"]) or c["state"] == "restarting" else "down"
        up_s = int(time.time() - c["since"])
        rows.append((name, c["pid"], state, c["restarts"], c["lastExit"] or "", up_s))
    render(Result(["component", "pid", "state", "restarts", "last_exit", "up_s"], rows), fmt, sys.stdout)
    return 0


SQL_HELP = """\
statements: each argument, and -f FILE (- for stdin), may hold several, separated by ';'.
Without statements: an interactive shell (statements end with ';'; quit, exit or Ctrl-D).

The session's current namespace is <catalog>.<namespace> (lake.cdc by default), so `orders`
means lake.cdc.orders; with --catalog rest the REST catalog server (`cdclake rest`,
http://CDCLAKE_REST_HOST:CDCLAKE_REST_PORT) is attached as catalog `rest` and `orders` means
rest.cdc.orders (CDCLAKE_REST_CREDENTIAL=<id>:<secret> when the server has a tokens file).
Spark: the Spark Connect server at CDCLAKE_SPARK_CONNECT_URL when one answers (`cdclake up`
runs one), else Spark in this process (a JVM start: seconds).

--as-of SNAPSHOT_ID|TIME reads every table of a query (SELECT, WITH) as of then, as the query
API's asOf: VERSION AS OF / TIMESTAMP AS OF after fully qualified names (lake.cdc.orders), a
temporary view at that time for one-part names (orders); Spark's plan is then checked to read
each table at its snapshot then, else the query is an error (never an answer mixing times).
Metadata tables (lake.cdc.orders.snapshots) and references with their own AS OF are left
alone. TIME is ISO 8601 (2026-01-01, "2026-01-01 12:00:00.250", 2026-01-01T12:00:00+02:00),
UTC without an offset. A snapshot id belongs to one table: the statement must read only that
table.

--consistent reads every table of a query at one catalog state, read once per query (all of a
consistent publish or none of it), the same way: VERSION AS OF each table's snapshot, then the
plan checked. --as-of-position SOURCE=POSITION picks, per table, the newest snapshot whose
cdclake.source-position.SOURCE is at or before POSITION (an LSN 0/16B3748 or integer, a GTID
0-1-12, a binlog file:offset); a table with none is an error.

time travel in SQL (times are UTC):
  SELECT * FROM lake.cdc.orders VERSION AS OF 4348436197468765062
  SELECT * FROM lake.cdc.orders TIMESTAMP AS OF '2026-01-01 12:00:00' WHERE _cdc_row_id = '7'
  SELECT * FROM lake.cdc.orders.snapshots        -- also .history, .files, .manifests
"what changed in row K since T" (each change with the snapshot it came with): docs/querying.md, "Time travel".
"""


# What the subcommands import and the `client` extra does not install (pyproject's `pipeline` extra).
PIPELINE_MODULES = frozenset(
    {"airflow", "pyspark", "pyiceberg", "pyarrow", "sqlalchemy", "boto3", "botocore", "starlette", "uvicorn"}
    | {"anyio", "pydantic", "psutil", "psycopg2", "pymysql", "tenacity", "prometheus_client"}
)


def parser() -> argparse.ArgumentParser:
    """The command line's parser: its subcommands and their options."""
    from cdclake.cli.output import FORMATS
    from cdclake.cli.query import CATALOGS

    p = argparse.ArgumentParser(prog="cdclake", description="CDC events into Apache Iceberg via Airflow + Spark")
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("demo", help="start everything, send sample CDC, apply it, show it with Spark SQL")
    d.add_argument("--keep-running", action="store_true", help="leave services up until Ctrl-C")
    sub.add_parser("up", help="start receiver, REST catalog, Spark Connect and Airflow on 127.0.0.1 until Ctrl-C")
    q = sub.add_parser(
        "sql",
        help="run Spark SQL (statements, a file, or an interactive shell)",
        epilog=SQL_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    q.add_argument("statement", nargs="*", help="SQL statement(s)")
    q.add_argument("-f", "--file", help="read statements from FILE (- for stdin)")
    q.add_argument("--catalog", choices=CATALOGS, default="jdbc", help="the JDBC catalog (default) or the REST server")
    q.add_argument("--format", choices=FORMATS, default="table", help="output format (default table)")
    q.add_argument("--as-of", metavar="SNAPSHOT_ID|TIME", help="read the tables as of a snapshot or time")
    q.add_argument(
        "--consistent", action="store_true", help="read every table of a query at one catalog state (the newest)"
    )
    q.add_argument(
        "--as-of-position",
        metavar="SOURCE=POSITION",
        help="read every table at its newest snapshot at or before a source position (pg=0/16B3748)",
    )
    q.add_argument(
        "--max-rows",
        type=int,
        metavar="N",
        help="rows to print per statement (default 100 for table, all for csv/json; 0 all)",
    )
    t = sub.add_parser("tables", help="tables: rows, files, last apply, freshness by event and commit time (no JVM)")
    t.add_argument("--format", choices=FORMATS, default="table")
    s = sub.add_parser("snapshots", help="a table's snapshots with the apply watermark and event counts (no JVM)")
    s.add_argument("table", help="orders, cdc.orders or lake.cdc.orders")
    s.add_argument("--format", choices=FORMATS, default="table")
    quarantine_cmd.add_parser(sub)
    holds_cmd.add_parser(sub)
    sub.add_parser("rest", help="serve the Iceberg REST catalog on CDCLAKE_REST_HOST:CDCLAKE_REST_PORT")
    st = sub.add_parser("status", help="each component of the running `cdclake up`/`demo` stack: pid, state, restarts")
    st.add_argument("--format", choices=FORMATS, default="table")
    i = sub.add_parser(
        "init",
        help="create/migrate buckets, the Iceberg catalog, producer tokens (CDCLAKE_TOKENS_FILE), "
        "and (--airflow) Airflow's DB",
    )
    i.add_argument("--airflow", action="store_true", help="also run `airflow db migrate` on CDCLAKE_AIRFLOW_DB_URL")
    debezium_cmd.add_parser(sub)
    return p


Command = Callable[[argparse.Namespace, Settings, Any], int]
COMMANDS: dict[str, Command] = {
    "demo": lambda args, settings, spark: demo(args, settings),
    "up": lambda args, settings, spark: up(settings),
    "sql": sql,
    "tables": lambda args, settings, spark: tables(settings, args.format),
    "snapshots": lambda args, settings, spark: snapshots(settings, args.table, args.format),
    "quarantine": quarantine_cmd.run,
    "holds": lambda args, settings, spark: holds_cmd.run(args, settings),
    "rest": lambda args, settings, spark: rest(),
    "status": lambda args, settings, spark: status(settings, args.format),
    "init": lambda args, settings, spark: init(args, settings),
    "debezium": lambda args, settings, spark: debezium_cmd.run(args, settings),
}
"""Subcommand -> what runs it, given the parsed arguments, the settings and a test's Spark session."""


def main(argv: Sequence[str] | None = None, *, spark: Any = None, settings: Settings | None = None) -> int:
    """The command line. ``spark`` and ``settings`` let tests reuse a running session."""
    args = parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _sigterm)
    try:
        settings = settings or load()
        return COMMANDS[args.cmd](args, settings, spark)
    except KeyboardInterrupt:
        stopped = "; all services stopped" if args.cmd in ("demo", "up") else ""
        print(f"\n[cdclake] interrupted{stopped}", file=sys.stderr)
        return 130
    except (RuntimeError, SettingsError, AirflowError) as exc:
        print(f"[cdclake] error: {exc}", file=sys.stderr)
        return 1
    except ModuleNotFoundError as exc:
        # An install of the producer SDK alone (`pip install "cdclake[client]"`) has the command
        # but not what its subcommands run on.
        if (exc.name or "").split(".")[0] not in PIPELINE_MODULES:
            raise
        print(
            f"[cdclake] error: `cdclake {args.cmd}` needs the pipeline's packages ({exc.name} is not installed): "
            'pip install "cdclake[pipeline]"',
            file=sys.stderr,
        )
        return 1


if __name__ == "__main__":
    sys.exit(main())
