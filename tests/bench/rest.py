"""REST catalog benchmark (not a test):
    .venv/bin/python -m tests.bench.rest [--loads 500] [--commits 200] [--threads 4]

The real server (``python -m restcatalog``, one uvicorn worker, a subprocess on 127.0.0.1) beside
the same SQL catalog used directly (pyiceberg ``SqlCatalog`` in this process), same run, same
database and warehouse, on small tables (3 snapshots, a few rows):

* load-table latency p50/p99: the raw ``GET .../tables/{t}`` (httpx, one keep-alive connection),
  pyiceberg ``RestCatalog.load_table`` (adds client-side parsing), ``SqlCatalog.load_table``;
* commit throughput, sequential: metadata-only commits (a property set: catalog cost alone) and
  one-row appends (adds the client's Parquet + manifest writes, equal on both sides);
* commit throughput with ``--threads`` clients at once, each on its own table (the server's
  throughput; commits on one SQLite catalog serialize on its write lock either way).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa

from cdclake.config.settings import load

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("v", pa.string())])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def server(home: Path) -> Iterator[str]:
    port = free_port()
    env = {**os.environ, "CDCLAKE_HOME": str(home), "CDCLAKE_REST_PORT": str(port)}
    proc = subprocess.Popen([sys.executable, "-m", "restcatalog"], env=env, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("python -m restcatalog did not start")
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def latencies(fn: Callable[[], Any], n: int) -> tuple[float, float]:
    for _ in range(min(20, n)):
        fn()
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1000)
    samples.sort()
    return statistics.median(samples), samples[min(len(samples) - 1, int(len(samples) * 0.99))]


def rate(fn: Callable[[int], Any], n: int, threads: int = 1) -> float:
    """Operations per second of ``fn(i)``, ``n`` per thread."""
    errors: list[BaseException] = []

    def work(offset: int) -> None:
        try:
            for i in range(n):
                fn(offset + i)
        except BaseException as exc:
            errors.append(exc)

    t0 = time.perf_counter()
    ts = [threading.Thread(target=work, args=(k * 1_000_000,)) for k in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if errors:
        raise errors[0]
    return n * threads / (time.perf_counter() - t0)


def small_table(cat: Any, ident: str) -> Any:
    t = cat.create_table(ident, schema=SCHEMA)
    for i in range(3):
        t.append(pa.table({"id": [i, i + 10], "v": ["a", "b"]}, schema=SCHEMA))
    return cat.load_table(ident)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--loads", type=int, default=500)
    ap.add_argument("--commits", type=int, default=200)
    ap.add_argument("--threads", type=int, default=4)
    args = ap.parse_args()

    from pyiceberg.catalog.rest import RestCatalog

    from cdclake.lake.catalog import open_catalog

    home = Path(tempfile.mkdtemp(prefix="cdclake-bench-rest-"))
    settings = load({"CDCLAKE_HOME": str(home)})
    results: list[tuple[str, float, float, str]] = []
    with server(home) as url:
        rest = RestCatalog("lake", uri=url)
        direct = open_catalog(settings)
        rest.create_namespace("bench")
        small_table(rest, "bench.t")
        small_table(rest, "bench.d")

        http = httpx.Client(base_url=url)
        raw50, raw99 = latencies(lambda: http.get("/v1/namespaces/bench/tables/t").raise_for_status(), args.loads)
        py50, py99 = latencies(lambda: rest.load_table("bench.t"), args.loads)
        sql50, sql99 = latencies(lambda: direct.load_table(("bench", "t")), args.loads)
        results.append(("load-table p50 ms (HTTP GET | SqlCatalog)", raw50, sql50, "ms"))
        results.append(("load-table p99 ms (HTTP GET | SqlCatalog)", raw99, sql99, "ms"))
        results.append(("load-table p50 ms (pyiceberg RestCatalog | SqlCatalog)", py50, sql50, "ms"))
        results.append(("load-table p99 ms (pyiceberg RestCatalog | SqlCatalog)", py99, sql99, "ms"))

        def set_prop(cat: Any, ident: Any) -> Callable[[int], Any]:
            return lambda i: cat.load_table(ident).transaction().set_properties(k=str(i)).commit_transaction()

        def append(cat: Any, ident: Any) -> Callable[[int], Any]:
            return lambda i: cat.load_table(ident).append(pa.table({"id": [i], "v": ["x"]}, schema=SCHEMA))

        n = args.commits
        results.append(
            (
                "commits/s, property set, 1 client",
                rate(set_prop(rest, "bench.t"), n),
                rate(set_prop(direct, ("bench", "d")), n),
                "/s",
            )
        )
        results.append(
            (
                "commits/s, 1-row append, 1 client",
                rate(append(rest, "bench.t"), n // 2),
                rate(append(direct, ("bench", "d")), n // 2),
                "/s",
            )
        )
        k = args.threads
        for i in range(k):
            small_table(rest, f"bench.r{i}")
            small_table(rest, f"bench.s{i}")
        per_thread = max(1, n // k)
        rest_clients = [RestCatalog("lake", uri=url) for _ in range(k)]
        rest_rate = rate(lambda i: set_prop(rest_clients[i // 1_000_000], f"bench.r{i // 1_000_000}")(i), per_thread, k)
        direct_rate = rate(lambda i: set_prop(direct, ("bench", f"s{i // 1_000_000}"))(i), per_thread, k)
        results.append((f"commits/s, property set, {k} clients x own table", rest_rate, direct_rate, "/s"))
        metrics = http.get("/metrics").text
        conflicts = [ln for ln in metrics.splitlines() if ln.startswith("cdclake_rest_commit_conflicts_total ")]

    print(f"\nREST catalog (one uvicorn worker) vs SqlCatalog direct; SQLite catalog at {home}")
    print(f"{'':58} {'REST':>10} {'direct':>10} {'REST/direct':>12}")
    for name, r, d, _unit in results:
        print(f"{name:58} {r:10.2f} {d:10.2f} {r / d:12.2f}")
    print("server-side 409s:", conflicts[0].split()[-1] if conflicts else "0")


if __name__ == "__main__":
    main()
