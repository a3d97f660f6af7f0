"""``cdclake`` command line: demo, up, sql, tables, snapshots, rest, init, debezium."""

from __future__ import annotations

import argparse
import signal
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, NoReturn

from cdclake.cli import debezium_cmd
from cdclake.config.settings import Settings, SettingsError, load
from cdclake.contracts.watermark import EVENT_COUNTS, count_key
from cdclake.orchestration.airflow_api import AirflowError


def _sigterm(signum: int, frame: Any) -> NoReturn:
    # Turn SIGTERM into the same clean shutdown as Ctrl-C.
    raise KeyboardInterrupt


def post_workload(settings: Settings, batches: Sequence[dict[str, Any]], say: Any = print) -> list[dict[str, Any]]:
    """Send the workload through the producer client; returns the batches as landed.

    The workload's repeated batches (a producer retry) are re-sent by hand with the number they
    were acked under, to show the receiver answering ``duplicate`` instead of landing them twice.
    """
    import httpx

    from cdclake.client import Producer
    from cdclake.contracts.events import encode

    landed: list[dict[str, Any]] = []
    statuses: dict[str, int] = {}
    by_original: dict[int, dict[str, Any]] = {}
    source = batches[0]["source"]
    with Producer(settings.receiver_url, source, batch_size=10_000) as producer:
        for b in batches:
            if b["sequenceNumber"] in by_original:
                again = by_original[b["sequenceNumber"]]
                r = httpx.post(
                    f"{settings.receiver_url}/v1/batches",
                    content=encode(again),
                    headers={"content-type": "application/json"},
                    timeout=30,
                )
                status = r.json().get("status", r.json().get("reason"))
            else:
                ack = producer.send_events(b["events"])
                status = ack.status
                sent = {"source": source, "sequenceNumber": ack.sequence_number, "events": b["events"]}
                by_original[b["sequenceNumber"]] = sent
                landed.append(sent)
            statuses[status] = statuses.get(status, 0) + 1
    say("acks by status: " + ", ".join(f"{k} {v}" for k, v in sorted(statuses.items())))
    return landed


def follow_apply(stack: Any, since: datetime, timeout: float = 600.0, trigger_after_s: float = 30.0) -> str:
    """Follow cdc_apply until nothing landed is pending; ``failed`` if a run since ``since`` failed.

    The receiver's Asset event schedules the runs (queued while another run is active); a run is
    triggered over the REST API only if none is active or queued after ``trigger_after_s``.
    """
    from cdclake.lake.catalog import pending_tables

    client = stack.airflow
    t0 = time.monotonic()
    last = ""
    triggered = False
    while time.monotonic() - t0 < timeout:
        runs = client.json("GET", "/api/v2/dags/cdc_apply/dagRuns", params={"order_by": "-run_after", "limit": 10})
        recent = [r for r in runs["dag_runs"] if datetime.fromisoformat(r["run_after"].replace("Z", "+00:00")) >= since]
        if any(r["state"] == "failed" for r in recent):
            return "failed"
        active = [r for r in runs["dag_runs"] if r["state"] in ("queued", "running")]
        q = client.request("GET", "/api/v2/dags/cdc_apply/assets/queuedEvents")
        queued_by_asset = q.json().get("total_entries", 0) if q.status_code == 200 else 0
        pending = pending_tables(stack.settings)
        if not pending and not active:
            return "success"
        if not active and not queued_by_asset and not triggered and time.monotonic() - t0 > trigger_after_s:
            client.trigger("cdc_apply")
            triggered = True
        run = active[-1] if active else None
        line = f"pending staging objects {pending or 'none'}; " + (
            f"cdc_apply {run['run_type']} run {run['state']}" if run else "waiting for a run"
        )
        if queued_by_asset:
            line += " (an Asset event is queued: the next run starts when this one ends)"
        if line != last:
            stack.say(f"[{time.monotonic() - t0:5.0f}s] {line}")
            last = line
        time.sleep(2)
    raise TimeoutError(f"cdc_apply did not apply everything within {timeout:.0f}s")


def sql(args: argparse.Namespace, settings: Settings, spark: Any = None) -> int:
    """``cdclake sql``: statements from the arguments and ``-f``, else the interactive shell."""
    from cdclake.cli.query import QueryError, parse_as_of, query_session, readline_input, shell, statements_of

    as_of = parse_as_of(args.as_of) if args.as_of else None
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
        qs.fmt, qs.max_rows, qs.as_of = args.format, args.max_rows, as_of
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
                    + "; end statements with ';', quit with Ctrl-D"
                )
            return shell(qs, readline_input(settings) if interactive else input, sys.stdout, interactive)
        for stmt in statements:
            if not qs.show(stmt, sys.stdout, echo=len(statements) > 1):
                return 1
    return 0


def tables(settings: Settings, fmt: str) -> int:
    from cdclake.cli.query import render, tables_report

    render(tables_report(settings), fmt, sys.stdout)
    return 0


def snapshots(settings: Settings, table: str, fmt: str) -> int:
    from cdclake.cli.query import render, snapshots_report

    render(snapshots_report(settings, table), fmt, sys.stdout)
    return 0


def rest() -> int:
    # Imported here, not at the top: cdclake is the layer below the services (tests/project/test_import_graph.py
    # lists this one entry point), and no other command should load uvicorn, Starlette and pyiceberg.
    from restcatalog.__main__ import main as serve

    serve()
    return 0


def show(spark: Any, statements: Sequence[str], rows: int = 50) -> None:
    for stmt in statements:
        print(f"\nspark-sql> {stmt}")
        spark.sql(stmt).show(rows, truncate=False)


def check_against_reference(spark: Any, settings: Settings, acked: Sequence[dict[str, Any]]) -> list[str]:
    """Compare every table with the plain-Python reference model; one line per table."""
    from cdclake.dev.reference import diff, expected_tables, rows_by_key
    from cdclake.lake.spark import table_ident

    lines = []
    for table, want in sorted(expected_tables(acked).items()):
        got = rows_by_key(spark.table(table_ident(settings, table)).collect())
        problems = diff(want, got)
        verdict = "matches" if not problems else f"DIFFERS in {len(problems)} rows, e.g. {problems[0]}"
        lines.append(f"{table}: {len(got)} rows, {verdict} the reference model ({len(want)} rows)")
    return lines


def demo(settings: Settings, keep_running: bool) -> int:
    from cdclake.dev.stack import LocalStack
    from cdclake.dev.workload import generate
    from cdclake.lake.spark import session

    with LocalStack(settings) as stack:
        w = generate()
        unique = len({(b["source"], b["sequenceNumber"]) for b in w.batches})
        stack.say(
            f"sending {len(w.batches)} batches ({w.events} events, {len(w.batches) - unique} duplicate "
            f"batches, out-of-order events) over 3 tables to {settings.receiver_url}/v1/batches"
        )
        # Airflow must know the DAG (and so the Asset the receiver updates) before data lands.
        stack.airflow.wait_dag("cdc_apply")
        stack.airflow.unpause("cdc_apply")
        t0 = time.monotonic()
        since = datetime.now(UTC)
        acked = post_workload(settings, w.batches, stack.say)
        stack.say(f"{len(acked)} batches landed (durable in staging) in {time.monotonic() - t0:.1f}s")
        stack.say("the receiver's Asset event schedules cdc_apply; following it until nothing is pending")
        state = follow_apply(stack, since)
        if state != "success":
            stack.say(f"cdc_apply ended {state}; task logs: {stack.airflow_home / 'logs'}")
            return 1
        ns = f"{settings.catalog_name}.{settings.namespace}"
        stack.say("querying with Spark SQL")
        spark = session(settings, "cdclake-demo")
        spark.sparkContext.setLogLevel("ERROR")
        try:
            show(
                spark,
                [
                    f"SELECT 'customers' AS tbl, count(*) AS rows FROM {ns}.customers UNION ALL "
                    f"SELECT 'orders', count(*) FROM {ns}.orders UNION ALL "
                    f"SELECT 'products', count(*) FROM {ns}.products",
                    f"SELECT id, name, tier, balance, _cdc_seq, _cdc_ts FROM {ns}.customers ORDER BY id LIMIT 10",
                    f"SELECT order_id, status, amount, items FROM {ns}.orders ORDER BY order_id LIMIT 5",
                    "SELECT snapshot_id, "
                    + ", ".join(f"summary['{count_key(k)}'] AS {k}" for k in EVENT_COUNTS)
                    + f" FROM {ns}.orders.snapshots",
                    f"SELECT _cdc_seq, _cdc_operation, _cdc_outcome, status, amount FROM {ns}.orders__changes "
                    f"WHERE _cdc_row_id = '7' ORDER BY _cdc_seq",
                ],
            )
            verdicts = check_against_reference(spark, settings, acked)
        finally:
            spark.stop()
        for line in verdicts:
            stack.say(line)
        stack.say(login_hint(stack))
        if keep_running:
            stack.say("services keep running; Ctrl-C stops them all")
            _wait_forever(stack)
        else:
            stack.say("stopping services (run `make up` to keep them running and browse the UI)")
    return 0 if all("matches" in v for v in verdicts) else 1


def login_hint(stack: Any) -> str:
    # The password stays in its owner-only file: terminals and CI logs are read by others.
    url, path = stack.settings.airflow_url, stack.passwords_file
    return f'Airflow UI: {url}  (user admin; its password is the "admin" entry of {path})'


def _wait_forever(stack: Any) -> None:
    while True:
        stack._assert_running()
        time.sleep(2)


def up(settings: Settings) -> int:
    from cdclake.dev.stack import LocalStack

    with LocalStack(settings) as stack:
        stack.say(
            f"receiver: {settings.receiver_url}/v1/batches (batches), {settings.receiver_url}/v1/debezium "
            "(Debezium Server's HTTP sink: `cdclake debezium`)"
        )
        stack.say(f"Iceberg REST catalog: {stack.rest_url} (`cdclake sql --catalog rest`; engines: see the README)")
        stack.say(login_hint(stack))
        stack.say("Ctrl-C stops everything")
        _wait_forever(stack)
    return 0


SQL_HELP = """\
statements: each argument, and -f FILE (- for stdin), may hold several, separated by ';'.
Without statements: an interactive shell (statements end with ';'; quit, exit or Ctrl-D).

The session's current namespace is <catalog>.<namespace> (lake.cdc by default), so `orders`
means lake.cdc.orders; with --catalog rest the REST catalog server (`cdclake rest`,
http://CDCLAKE_REST_HOST:CDCLAKE_REST_PORT) is attached as catalog `rest` and `orders` means
rest.cdc.orders (CDCLAKE_REST_CREDENTIAL=<id>:<secret> when the server has a tokens file).
Spark: the Spark Connect server at CDCLAKE_SPARK_CONNECT_URL when one answers (`cdclake up`
runs one), else Spark in this process (~10 s to start).

--as-of SNAPSHOT_ID|TIME adds VERSION AS OF / TIMESTAMP AS OF after every table written
fully qualified (lake.cdc.orders, rest.cdc.orders) in a query (SELECT, WITH); metadata tables
(lake.cdc.orders.snapshots) and references with their own AS OF are left alone. TIME is ISO
8601 (2026-01-01, "2026-01-01 12:00:00.250", 2026-01-01T12:00:00+02:00), UTC without an
offset. A snapshot id belongs to one table: the statement must read only that table.

time travel in SQL (times are UTC):
  SELECT * FROM lake.cdc.orders VERSION AS OF 4348436197468765062
  SELECT * FROM lake.cdc.orders TIMESTAMP AS OF '2026-01-01 12:00:00' WHERE _cdc_row_id = '7'
  SELECT * FROM lake.cdc.orders.snapshots        -- also .history, .files, .manifests
"what changed in row K since T" (each change with the snapshot it came with): README, Time travel.
"""


# What the subcommands import and the `client` extra does not install (pyproject's `pipeline` extra).
PIPELINE_MODULES = frozenset(
    {"airflow", "pyspark", "pyiceberg", "pyarrow", "sqlalchemy", "boto3", "botocore", "starlette", "uvicorn"}
    | {"anyio", "pydantic", "psutil", "psycopg2", "pymysql", "tenacity"}
)


def main(argv: Sequence[str] | None = None, *, spark: Any = None, settings: Settings | None = None) -> int:
    """The command line. ``spark`` and ``settings`` let tests reuse a running session."""
    from cdclake.cli.query import CATALOGS, FORMATS

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
        "--max-rows",
        type=int,
        metavar="N",
        help="rows to print per statement (default 100 for table, all for csv/json; 0 all)",
    )
    t = sub.add_parser("tables", help="tables with rows, files, snapshots, last apply and freshness (no JVM)")
    t.add_argument("--format", choices=FORMATS, default="table")
    s = sub.add_parser("snapshots", help="a table's snapshots with the apply watermark and event counts (no JVM)")
    s.add_argument("table", help="orders, cdc.orders or lake.cdc.orders")
    s.add_argument("--format", choices=FORMATS, default="table")
    sub.add_parser("rest", help="serve the Iceberg REST catalog on CDCLAKE_REST_HOST:CDCLAKE_REST_PORT")
    i = sub.add_parser(
        "init",
        help="create/migrate buckets, the Iceberg catalog, producer tokens (CDCLAKE_TOKENS_FILE), "
        "and (--airflow) Airflow's DB",
    )
    i.add_argument("--airflow", action="store_true", help="also run `airflow db migrate` on CDCLAKE_AIRFLOW_DB_URL")
    debezium_cmd.add_parser(sub)
    args = p.parse_args(argv)
    signal.signal(signal.SIGTERM, _sigterm)
    try:
        settings = settings or load()
        if args.cmd == "demo":
            return demo(settings, args.keep_running)
        if args.cmd == "up":
            return up(settings)
        if args.cmd == "tables":
            return tables(settings, args.format)
        if args.cmd == "snapshots":
            return snapshots(settings, args.table, args.format)
        if args.cmd == "rest":
            return rest()
        if args.cmd == "debezium":
            return debezium_cmd.run(args, settings)
        if args.cmd == "init":
            from cdclake.lake.bootstrap import init

            init(settings, args.airflow, say=lambda m: print(f"[cdclake] {m}", flush=True))
            return 0
        return sql(args, settings, spark)
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
