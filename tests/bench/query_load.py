"""Apply under query load (not a test): `make bench-query-load` or
    .venv/bin/python -m tests.bench.query_load [--events 4000] [--queries 8] [--repeats 3] [--rows 500000]

Issue 28: one micro-batch apply's wall time while the query API runs heavy statements, against
the same apply with no queries, in one run. The stack's servers as it starts them, on 127.0.0.1,
each in a session (and so an autogroup) of its own: the applies' Spark Connect server
(``connect_server_command``: local[2], the FAIR pools of cdclake.lake.scheduler), in mode
``separate`` the query API's own server beside it (``query_server_command``: local[2] at nice 19,
its autogroup too), and the REST catalog with the query API (``python -m restcatalog``, a tokens
file of one reader client per query thread). The lake: ``t``, the table the
applies write (20,000 rows from the workload generator, as tests/bench/microbatch.py), ``orders``
(--rows rows, --fanout orders per customer) and ``customers`` (one row per customer). The heavy
query joins ``orders`` with itself on the customer (--rows x --fanout pairs) and sums by region.

Per mode (fresh Connect servers each, on the same lake; --modes):
* ``separate``: the stack's default, the statements on the query server
  (CDCLAKE_QUERY_SPARK_CONNECT_URL), the applies alone on theirs;
* ``fair``: the statements on the applies' server (CDCLAKE_QUERY_SPARK_CONNECT_URL empty), as
  before the query server;
* ``fifo``: the same command plus ``--conf spark.scheduler.mode=FIFO`` (an override of this bench
  only): the pools are ignored, jobs take the task slots in the order they were submitted;
* ``fair-short``: as ``fair``, but the query sessions also split their shuffles finer
  (:data:`SHORT_TASKS`, added to cdclake.query.session's settings in the REST catalog's process
  by this bench only): shorter query tasks, each a shorter wait for an apply's stage.
Each mode: 2 warm-up applies and one heavy query alone, untimed; --repeats applies with no
queries; then --queries threads (one client each, so the per-client cap holds none of them back)
post the heavy query to ``POST /v1/query`` back to back, waiting out a 429's Retry-After; once the
server's cap is full and the JVM busy, --repeats applies again. Each apply is a fresh batch of
--events events in --objects staging objects, run as cdc_apply runs it on a Connect server
(``cdclake.launch.submit.run_on_connect`` of ``spark_jobs.apply``).

Reported per mode and phase: the apply's wall seconds (median of the repeats) and its ratio
loaded/unloaded (issue 28's goal: <= 1.5), the applies' Connect JVM's CPU seconds per apply
(/proc/<pid>/stat utime+stime over the apply) and the cores that is, the query JVM's CPU seconds
over the same apply (``separate``; shared modes: the one JVM), the 1-minute load average;
from Spark's event log (turned on in the server's command, tests/bench/sparklog.py), the apply's
Spark stages, the seconds they waited for a free task slot and their task seconds. Per mode: the
statements answered, the 429s (total cap and per-client cap apart), other failures, the heavy
query's time alone and under load, and its tasks' lengths under load (Spark does not preempt a
running task: that is what an apply's stage may wait for). The table is checked against the
reference model. CDCLAKE_QUERY_TIMEOUT_S is 600 s here: slow statements count as load, not 408s.
Per mode, each server's start-up (command to "Spark Connect server started") and its JVM's peak
resident memory (VmHWM) are reported too.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import itertools
import os
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cdclake.lake.scheduler import QUERY_POOL
from tests.bench import sparklog
from tests.bench.microbatch import BASE_ROWS, TABLE, Stream
from tests.bench.query import connect_server
from tests.bench.query_api_load import QueryLoad, rest_server
from tests.bench.rest import free_port

HEAVY = (
    "SELECT c.region, count(*) AS pairs, sum(a.amount * b.amount) AS total "
    "FROM orders a JOIN orders b ON a.customer = b.customer JOIN customers c ON c.customer = a.customer "
    "GROUP BY c.region ORDER BY c.region"
)
WARM_APPLIES = 2
SHORT_TASKS = {"spark.sql.shuffle.partitions": "64", "spark.sql.adaptive.advisoryPartitionSizeInBytes": "256k"}
MODES: dict[str, tuple[dict[str, str], dict[str, str]]] = {  # name -> (server's conf, query sessions' conf)
    "separate": ({}, {}),
    "fair": ({}, {}),
    "fifo": ({"spark.scheduler.mode": "FIFO"}, {}),
    "fair-short": ({}, SHORT_TASKS),
}
SEPARATE = {"separate"}
"""Modes whose statements run on the query API's own server."""


def jvm_cpu(pid: int) -> float:
    """utime + stime of the process, seconds (/proc/<pid>/stat fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mib(pid: int) -> float:
    """The process's peak resident memory (VmHWM), MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def jvm_cores(pid: int, seconds: float) -> float:
    c0 = jvm_cpu(pid)
    time.sleep(seconds)
    return (jvm_cpu(pid) - c0) / seconds


def make_lake(settings: Any, rows: int, fanout: int) -> None:
    """``orders`` and ``customers``, written through the Connect server (as bench-query does)."""
    from cdclake.lake.spark import connect_session, connect_token

    spark = connect_session(settings.spark_connect_url, connect_token(settings))
    ns = f"{settings.catalog_name}.{settings.namespace}"
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {ns}")
    customers = max(1, rows // fanout)
    spark.range(rows).selectExpr(
        "id AS order_id",
        f"concat('c', cast(id % {customers} as string)) AS customer",
        "id * 0.25 AS amount",
        "element_at(array('new', 'paid', 'sent', 'void'), cast(id % 4 as int) + 1) AS status",
    ).writeTo(f"{ns}.orders").using("iceberg").create()
    spark.range(customers).selectExpr(
        "concat('c', cast(id as string)) AS customer", "concat('region-', cast(id % 8 as string)) AS region"
    ).writeTo(f"{ns}.customers").using("iceberg").create()
    spark.stop()
    print(f"[load] orders: {rows:,} rows over {customers:,} customers", flush=True)


def scheduler_mode(settings: Any) -> str:
    from cdclake.lake.spark import connect_session, connect_token

    spark = connect_session(settings.spark_connect_url, connect_token(settings))
    try:
        return str(spark.conf.get("spark.scheduler.mode"))
    finally:
        spark.stop()


def one_apply(
    settings: Any, stream: Stream, events: int, objects: int, seed: int, pid: int, qpid: int
) -> dict[str, Any]:
    """Stage a fresh batch, then time its apply as cdc_apply runs it on the Connect server."""
    from cdclake.launch.submit import run_on_connect
    from tests.support import stage

    stage(settings, stream.next(events, max(1, events // objects), seed=seed))
    start, t0, c0, q0 = time.time(), time.perf_counter(), jvm_cpu(pid), jvm_cpu(qpid)
    with contextlib.redirect_stdout(io.StringIO()):  # the job's CDCLAKE_RESULT line
        r = run_on_connect(settings, "spark_jobs.apply", ["--table", TABLE])
    wall, cpu, qcpu = time.perf_counter() - t0, jvm_cpu(pid) - c0, jvm_cpu(qpid) - q0
    return {"wall": wall, "cpu": cpu, "qcpu": qcpu, "load": os.getloadavg()[0], "phases": r.get("phases") or {}} | {
        "window": (start, time.time())
    }


def from_event_log(res: dict[str, Any], folder: Path) -> None:
    """Each apply's Spark stages (its pool: "default"), how long they waited for a task slot and
    their task seconds; the query tasks' lengths while the load ran (Spark's event log)."""
    logged = sparklog.stages(folder)
    for a in res["unloaded"] + res["loaded"]:
        start, end = a["window"]
        mine = sparklog.window(logged, start, end, pool="default")
        a["stages"], a["wait"] = len(mine), sum(s.wait for s in mine)
        a["task_s"] = sum(s.task_seconds for s in mine)
    start, end = res["window"]
    res["query_tasks"] = sparklog.task_durations(logged, start, end, pool=QUERY_POOL)


def wait_full(load: QueryLoad, timeout: float = 120, ramp_s: float = 5.0) -> None:
    """Until a statement was turned away (the cap is full), then ``ramp_s`` for those admitted to
    reach their Spark jobs."""
    deadline = time.monotonic() + timeout
    while not any(k.startswith("429") for k in load.counts):
        if time.monotonic() > deadline:
            print(f"[load] !! the cap did not fill within {timeout:.0f}s: {dict(load.counts)}", flush=True)
            return
        time.sleep(0.2)
    time.sleep(ramp_s)


def settle(pid: int, timeout: float = 300) -> None:
    """Until the JVM is nearly idle (the statements it was running are cancelled or done)."""
    deadline = time.monotonic() + timeout
    while jvm_cores(pid, 2.0) > 0.3 and time.monotonic() < deadline:
        pass


def measure(
    settings: Any, mode: str, pids: tuple[int, int], stream: Stream, args: argparse.Namespace
) -> dict[str, Any]:
    """``pids``: the applies' server's and the query server's (the same in a shared mode)."""
    pid, qpid = pids
    seeds = itertools.count(1000 * (1 + len(stream.batches)))  # a fresh batch per apply
    tokens = [f"bench-q{i}" for i in range(args.queries)]
    for _ in range(WARM_APPLIES):
        one_apply(settings, stream, args.events, args.objects, next(seeds), pid, qpid)
    alone = QueryLoad(settings.rest_url, tokens[:1], HEAVY)
    kind, _ = alone.once()
    alone.close()
    if kind != "answered":
        raise SystemExit(f"the heavy query failed alone: {alone.errors}")
    print(f"[load] {mode}: the heavy query alone {alone.seconds[0]:.1f}s", flush=True)
    res: dict[str, Any] = {"mode": mode, "alone": alone.seconds[0]}

    def applies(phase: str) -> list[dict[str, Any]]:
        out = []
        for _ in range(args.repeats):
            out.append(one_apply(settings, stream, args.events, args.objects, next(seeds), pid, qpid))
            a = out[-1]
            print(
                f"[load] {mode} {phase}: apply {a['wall']:.2f}s, JVM {a['cpu']:.1f} CPU s, query JVM {a['qcpu']:.1f}",
                flush=True,
            )
        return out

    res["unloaded"] = applies("unloaded")
    load = QueryLoad(settings.rest_url, tokens, HEAVY)
    load.start()
    wait_full(load)
    t0 = time.time()
    res["loaded"] = applies("loaded")
    res["window"] = (t0, time.time())
    res["stop_s"] = load.close()
    settle(qpid)
    res["counts"], res["errors"] = dict(load.counts), sorted(set(load.errors))[:3]
    res["query_p50"] = statistics.median(load.seconds) if load.seconds else float("nan")
    print(f"[load] {mode}: statements {res['counts']}, stopped in {res['stop_s']:.1f}s", flush=True)
    return res


def setup(args: argparse.Namespace) -> tuple[Any, dict[str, str]]:
    from cdclake.config.settings import load
    from cdclake.dev.stack import free_port
    from cdclake.lake import bootstrap
    from cdclake.lake.spark import connect_token
    from cdclake.query.server import query_token

    home = Path(tempfile.mkdtemp(prefix="cdclake-bench-query-load-"))
    tokens = home / "rest-tokens.toml"
    tokens.write_text(
        "".join(f'[[client]]\nid = "q{i}"\naccess = "read"\ntoken = "bench-q{i}"\n\n' for i in range(args.queries))
    )
    env = {
        "CDCLAKE_HOME": str(home),
        "CDCLAKE_SPARK_CONNECT_URL": f"sc://127.0.0.1:{free_port()}",
        "CDCLAKE_REST_HOST": "127.0.0.1",
        "CDCLAKE_REST_PORT": str(free_port()),
        "CDCLAKE_REST_TOKENS_FILE": str(tokens),
        "CDCLAKE_QUERY_TIMEOUT_S": "600",
        "CDCLAKE_QUERY_SPARK_CONNECT_URL": "",  # the shared modes; ``separate`` names its server
    }
    os.environ.update(env)  # spark_jobs.apply's main reads its settings from the environment
    settings = load(env)
    connect_token(settings, create=True)
    query_token(settings, create=True)
    bootstrap.ensure_catalog(settings, lambda _: None)
    return settings, env


@contextlib.contextmanager
def servers(settings: Any, mode: str, conf: dict[str, str]) -> Iterator[tuple[Any, dict[str, Any]]]:
    """The mode's Spark Connect servers, each started alone and timed: ``(settings with the query
    server's URL or none, {"pids": (apply, query), "startup": {...}})``."""
    separate = mode in SEPARATE
    url = f"sc://127.0.0.1:{free_port()}" if separate else ""
    settings = dataclasses.replace(settings, query_spark_connect_url=url)
    info: dict[str, Any] = {"startup": {}}
    with contextlib.ExitStack() as stack:
        t0 = time.monotonic()
        proc = stack.enter_context(connect_server(settings, conf, own_session=True))
        info["startup"]["apply"] = time.monotonic() - t0
        qproc = proc
        if separate:
            t0 = time.monotonic()
            qproc = stack.enter_context(connect_server(settings, sparklog_conf(conf), "query", own_session=True))
            info["startup"]["query"] = time.monotonic() - t0
        info["pids"] = (proc.pid, qproc.pid)
        yield settings, info


def sparklog_conf(conf: dict[str, str]) -> dict[str, str]:
    """The event log of the server's command, for the query server too (its own file, same folder)."""
    return {k: v for k, v in conf.items() if k.startswith("spark.eventLog.")}


def run(args: argparse.Namespace) -> tuple[Any, list[dict[str, Any]]]:
    from cdclake.dev.reference import diff, expected_tables, rows_by_key
    from cdclake.lake.spark import connect_session, connect_token, table_ident
    from cdclake.launch.submit import run_on_connect
    from tests.support import stage

    settings, env = setup(args)
    stream, results = Stream(), []
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if unknown := [m for m in modes if m not in MODES]:
        raise SystemExit(f"unknown modes {unknown}: {', '.join(MODES)}")
    for i, mode in enumerate(modes):
        folder = settings.home / f"eventlog-{mode}"
        server_conf, query_conf = MODES[mode]
        conf = sparklog.conf(folder) | dict(kv.split("=", 1) for kv in args.conf) | server_conf
        with servers(settings, mode, conf) as (settings, info):
            pid, qpid = info["pids"]
            got = scheduler_mode(settings)
            started = ", ".join(f"{k} {v:.1f}s" for k, v in info["startup"].items())
            print(f"[load] {mode}: Connect servers {pid}, {qpid} (started: {started}), mode={got}", flush=True)
            if got != server_conf.get("spark.scheduler.mode", "FAIR"):
                raise SystemExit(f"{mode}: the server schedules {got}")
            if i == 0:
                make_lake(settings, args.rows, args.fanout)
                stage(settings, stream.next(BASE_ROWS, BASE_ROWS // 10, seed=0))
                with contextlib.redirect_stdout(io.StringIO()):
                    run_on_connect(settings, "spark_jobs.apply", ["--table", TABLE])
            rest_env = {**env, "CDCLAKE_QUERY_SPARK_CONNECT_URL": settings.query_spark_connect_url}
            with rest_server(settings, rest_env, query_conf) as rest:
                results.append(measure(settings, mode, (pid, qpid), stream, args))
                results[-1]["startup"] = info["startup"]
                results[-1]["rss"] = {"apply": peak_rss_mib(pid), "query": peak_rss_mib(qpid)}
                if rest.poll() is not None:  # e.g. killed from outside: the load stopped with it
                    raise SystemExit(f"{mode}: the REST catalog's server ended during the run ({rest.returncode})")
            if i == len(modes) - 1:
                spark = connect_session(settings.spark_connect_url, connect_token(settings))
                rows = rows_by_key(spark.table(table_ident(settings, TABLE)).collect())
                spark.stop()
                problems = diff(expected_tables(stream.batches)[TABLE], rows)
                if problems:
                    raise SystemExit(f"the table differs from the reference model: {problems[:3]}")
        from_event_log(results[-1], folder)  # complete once the server has stopped
    return settings, results


def median(rows: list[dict[str, Any]], key: str) -> float:
    return float(statistics.median(r[key] for r in rows))


def report(settings: Any, results: list[dict[str, Any]], args: argparse.Namespace) -> None:
    print(
        f"\n{args.events} events per apply, {args.repeats} applies per phase (medians); {args.queries} query "
        f"clients, caps in force: {settings.query_max_concurrent} statements at once "
        f"(CDCLAKE_QUERY_MAX_CONCURRENT), {settings.query_max_concurrent_per_client} per client"
    )
    head = (
        "wall s",
        "x unloaded",
        "JVM CPU s",
        "JVM cores",
        "query CPU s",
        "stages",
        "slot wait s",
        "task s",
        "load avg",
    )
    print(f"{'mode':<11}{'phase':<10}" + "".join(f"{h:>12}" for h in head))
    for r in results:
        base = median(r["unloaded"], "wall")
        for phase in ("unloaded", "loaded"):
            a = r[phase]
            wall, cpu = median(a, "wall"), median(a, "cpu")
            qcpu = median(a, "qcpu") if r["mode"] in SEPARATE else float("nan")  # shared: in JVM CPU s
            cells = (
                wall,
                wall / base,
                cpu,
                cpu / wall,
                qcpu,
                median(a, "stages"),
                median(a, "wait"),
                median(a, "task_s"),
            )
            load = statistics.fmean(x["load"] for x in a)
            print(f"{r['mode']:<11}{phase:<10}" + "".join(f"{v:>12.2f}" for v in cells) + f"{load:>12.1f}")
    qhead = ("answered", "429 total", "429 client", "failed", "alone s", "loaded p50 s", "task p50 s", "task max s")
    print("\nthe heavy query\n" + f"{'mode':<11}" + "".join(f"{h:>13}" for h in qhead))
    for r in results:
        c, q = r["counts"], r["query_tasks"]
        failed = sum(v for k, v in c.items() if not k.startswith(("answered", "429")))
        counts = (c.get("answered", 0), c.get("429 total cap", 0), c.get("429 per-client cap", 0), failed)
        times = (r["alone"], r["query_p50"], q["p50"], q["max"])
        print(f"{r['mode']:<11}" + "".join(f"{v:>13}" for v in counts) + "".join(f"{v:>13.1f}" for v in times))
        if r["errors"]:
            print(f"  !! {r['errors']}")
    print()
    for r in results:
        for phase in ("unloaded", "loaded"):
            names = list(r[phase][0]["phases"])
            shown = ", ".join(f"{n} {statistics.fmean(a['phases'].get(n, 0.0) for a in r[phase]):.2f}" for n in names)
            print(f"{r['mode']} {phase} apply phases (mean s): {shown}")
    for r in results:
        started = ", ".join(f"{k} {v:.1f} s" for k, v in r["startup"].items())
        rss = ", ".join(f"{k} {v:.0f} MiB" for k, v in r["rss"].items())
        print(f"{r['mode']}: Connect servers started in {started}; peak RSS {rss}")
    for r in results:
        ratio = median(r["loaded"], "wall") / median(r["unloaded"], "wall")
        verdict = "met" if ratio <= 1.5 else "NOT met"
        print(f"{r['mode']}: loaded/unloaded {ratio:.2f}x (goal, issue 28: <= 1.5x): {verdict}")
    print("the table matches the reference model")


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--events", type=int, default=4000, help="events per applied micro-batch")
    ap.add_argument("--objects", type=int, default=30, help="staging objects per micro-batch")
    ap.add_argument("--queries", type=int, default=8, help="query clients posting the heavy query")
    ap.add_argument("--repeats", type=int, default=3, help="timed applies per phase")
    ap.add_argument("--rows", type=int, default=500_000, help="rows of the queried table")
    ap.add_argument("--fanout", type=int, default=40, help="orders per customer (the self-join's fan-out)")
    ap.add_argument("--modes", default="separate,fair", help=f"of {', '.join(MODES)}, comma-separated")
    ap.add_argument(
        "--conf", action="append", default=[], help="a Spark setting of the Connect server: KEY=VALUE, repeatable"
    )
    args = ap.parse_args()
    settings, results = run(args)
    report(settings, results, args)


if __name__ == "__main__":
    main()
