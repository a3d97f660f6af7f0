"""Query API benchmark (not a test): `make bench-query` or
    .venv/bin/python -m tests.bench.query [--rows 1000000] [--repeat 30]

One table of --rows rows (key, amount, status), written through the project's Spark Connect
server (a subprocess on 127.0.0.1, as the stack runs it). Two queries, each --repeat times after
3 untimed ones, three ways in one run:
  (1) the query API: ``POST /v1/query`` on the REST catalog's server (uvicorn in this process),
      through the lake client: a new Spark Connect session per request, the plan checked first;
  (2) ``cdclake sql``'s path: one Spark Connect session kept open, ``spark.sql(...).toArrow()``;
  (3) DuckDB 1.5 through the project's REST catalog (the iceberg extension reads the files itself).
The point lookup is ``WHERE _cdc_row_id = <a random key>`` (a parameter in (1) and (3), bound the
same way in (2)); the aggregate is a GROUP BY over every row. Reports p50/p95 wall milliseconds
and the CPU seconds of the process tree (this process, the Connect server) per series.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.bench.apply import cpu_seconds

POINT = "SELECT * FROM {t} WHERE _cdc_row_id = {p}"
AGGREGATE = "SELECT status, count(*) AS n, sum(amount) AS total FROM {t} GROUP BY status ORDER BY status"


@contextmanager
def connect_server(
    settings: Any, conf: Mapping[str, str] | None = None, role: str = "apply", own_session: bool = False
) -> Iterator[subprocess.Popen[bytes]]:
    """The project's Spark Connect server (``connect_server_command``; ``role="query"``: the query
    API's own, ``query_server_command``) on ``settings``' URL, its process yielded once it
    listens; ``conf`` overrides the command's Spark settings (a later ``--conf`` of the same key
    wins in spark-submit). ``own_session``: started as the embedded stack starts its components,
    each in a session (and autogroup) of its own, the query server's at its niceness."""
    from cdclake.lake.spark import connect_server_command, connect_server_env
    from cdclake.query.server import lower_priority, query_server_command, query_server_environ

    query = role == "query"
    url = settings.query_spark_connect_url if query else settings.spark_connect_url
    host, port = "127.0.0.1", int(url.rsplit(":", 1)[1])
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "SPARK_LOCAL_IP": "127.0.0.1",
    }
    env = query_server_environ(settings, env) if query else {**env, **connect_server_env(settings)}
    log = settings.home / ("connect-query.log" if query else "connect.log")
    cmd = (query_server_command if query else connect_server_command)(settings, host, port)
    at = cmd.index("--class")
    cmd[at:at] = [arg for k, v in (conf or {}).items() for arg in ("--conf", f"{k}={v}")]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=own_session)
    if query and own_session:
        lower_priority(proc.pid, settings.query_spark_nice)
    try:
        deadline = time.monotonic() + 240
        while "Spark Connect server started" not in log.read_text(errors="replace"):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"Spark Connect did not start: {log.read_text()[-2000:]}")
            time.sleep(1)
        yield proc
    finally:
        proc.terminate()
        proc.wait(60)


def one_by_one(run: Callable[[str, str], Any], sql: str, keys: list[str]) -> Callable[[], Any]:
    """``run(sql, key)`` with the next key at each call."""
    pick = iter(keys)
    return lambda: run(sql, next(pick))


def series(name: str, run: Callable[[], Any], repeat: int) -> dict[str, float]:
    for _ in range(3):
        run()
    times = []
    c0 = cpu_seconds()
    for _ in range(repeat):
        t0 = time.perf_counter()
        run()
        times.append((time.perf_counter() - t0) * 1000)
    cpu = cpu_seconds() - c0
    times.sort()
    out = {"p50": statistics.median(times), "p95": times[max(0, int(len(times) * 0.95) - 1)], "cpu": cpu}
    print(f"[bench] {name:<44} p50 {out['p50']:8.1f} ms  p95 {out['p95']:8.1f} ms  CPU {cpu:6.1f} s", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=30)
    args = ap.parse_args()

    from cdclake.client import lake as lakeclient
    from cdclake.config.settings import load
    from cdclake.lake.spark import connect_session, connect_token
    from tests.bench.rest import free_port
    from tests.restcatalog.test_rest_engines import duckdb_connection
    from tests.support.rest import serve

    home = Path(tempfile.mkdtemp(prefix="cdclake-bench-query-"))
    os.environ["CDCLAKE_HOME"] = str(home)
    # The query API on the same server as the session of (2): both paths on one JVM.
    url = f"sc://127.0.0.1:{free_port()}"
    settings = load(
        {"CDCLAKE_HOME": str(home), "CDCLAKE_SPARK_CONNECT_URL": url, "CDCLAKE_QUERY_SPARK_CONNECT_URL": ""}
    )
    rng = random.Random(7)
    keys = [str(rng.randrange(args.rows)) for _ in range(args.repeat + 3)]
    with connect_server(settings):
        spark = connect_session(settings.spark_connect_url, connect_token(settings))
        ident = f"{settings.catalog_name}.{settings.namespace}.orders"
        spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {settings.catalog_name}.{settings.namespace}")
        spark.range(args.rows).selectExpr(
            "cast(id as string) AS _cdc_row_id",
            "id * 0.25 AS amount",
            "element_at(array('new', 'paid', 'sent', 'void'), cast(id % 4 as int) + 1) AS status",
        ).writeTo(ident).using("iceberg").create()
        print(f"[bench] {args.rows:,} rows in {ident}", flush=True)
        results: dict[str, dict[str, float]] = {}
        with serve(settings) as (url, _app), lakeclient.connect(url) as db:
            con = duckdb_connection()
            con.execute(f"ATTACH 'lake' AS lake (TYPE iceberg, ENDPOINT '{url}', AUTHORIZATION_TYPE 'none')")
            duck_table = f"lake.{settings.namespace}.orders"
            paths: dict[str, Callable[[str, str], Any]] = {
                "(1) query API": lambda sql, k: db.query(sql.format(t="orders", p=":k"), params={"k": k}),
                "(2) cdclake sql's session": lambda sql, k: spark.sql(
                    sql.format(t=ident, p=":k"), args={"k": k}
                ).toArrow(),
                "(3) DuckDB via the REST catalog": lambda sql, k: con.execute(
                    sql.format(t=duck_table, p="?"), [k] if "{p}" in sql else []
                ).fetchall(),
            }
            for case, sql in (("point lookup", POINT), ("aggregate over every row", AGGREGATE)):
                for path, run in paths.items():
                    results[f"{path}, {case}"] = series(f"{path}: {case}", one_by_one(run, sql, keys), args.repeat)
        spark.stop()
    print("\nseries                                          p50 ms   p95 ms   CPU s")
    for name, r in results.items():
        print(f"{name:<46}{r['p50']:>8.1f}{r['p95']:>9.1f}{r['cpu']:>8.1f}")


if __name__ == "__main__":
    main()
