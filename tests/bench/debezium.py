"""Debezium Server's HTTP sink into the receiver, measured (a benchmark, not a test)::

    .venv/bin/python -m tests.bench.debezium [--rows 20000]

Per sink setting: seconds from starting Debezium Server until it answers /q/health and until its
first (snapshot) event landed, and events/s of one ``--rows``-row INSERT transaction from its commit until the
last row landed, with the receiver's request count and bytes per event (its /metrics).
Retries are Debezium's defaults (5 attempts 1 s apart, as measured in docs/benchmarks.md), not the
recommended ones: they matter only when the receiver refuses, here its rate limit in the
one-event-per-request case.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from pathlib import Path

import httpx

from cdclake.config.settings import load
from cdclake.dev.stack import free_port
from tests.support.debezium_server import LogicalPostgres, Pipeline, fail_fast_sink, missing

# name, rows (None: --rows), sink settings
CASES: list[tuple[str, int | None, dict[str, object]]] = [
    ("one event per request (Debezium's default)", 300, {"batch": False}),
    ("batch.max-size=200, schemas", None, {"batch_max_size": 200}),
    ("batch.max-size=1000, schemas", None, {"batch_max_size": 1000}),
    ("batch.max-size=1000, schemas.enable=false", None, {"batch_max_size": 1000, "schemas": False}),
]


def metric(text: str, name: str) -> float:
    return sum(float(m) for m in re.findall(rf"^{name}(?:{{[^}}]*}})? ([0-9.e+]+)$", text, re.M))


def one(pg: LogicalPostgres, root: Path, i: int, rows: int, sink: dict[str, object]) -> str:
    db = f"bench{i}"
    pg.create_db(db)
    pg.sql("CREATE TABLE items (id int PRIMARY KEY, n int, name text, at timestamptz)", db)
    pg.sql("CREATE TABLE marks (id int PRIMARY KEY)", db)
    pg.sql("INSERT INTO items VALUES (0, 0, 'first', now())", db)
    settings = load({"CDCLAKE_HOME": str(root / db)}, receiver_port=free_port())
    p = Pipeline(root, settings, pg.database(db, ["items", "marks"]), fail_fast_sink(settings.receiver_url, **sink), db)
    p.start()
    try:
        base = len(p.staged().get("items", []))
        t0 = time.monotonic()
        pg.sql(f"INSERT INTO items SELECT g, g, 'name ' || g, now() FROM generate_series(1, {rows}) g", db)
        done = p.wait_for("items", base + rows, timeout=600)
        dt = time.monotonic() - t0
        m = httpx.get(settings.receiver_url + "/metrics", timeout=5).text
        requests, nbytes = metric(m, "cdclake_receiver_batches_total"), metric(m, "cdclake_receiver_bytes_total")
        events = len(p.staged().get("items", []))
        first = "-" if p.first_landed_s is None else f"{p.first_landed_s:.1f}s"
        rate = f"{rows / dt:,.0f}" if done else f"stalled ({events - base} of {rows}; {p.failures(1)})"
        return (
            f"healthy after {p.debezium.started_s:.1f}s, first event landed after {first}, "
            f"{rows:,} rows in {dt:.1f}s = {rate} events/s, {requests:.0f} requests, "
            f"{nbytes / max(events, 1):,.0f} bytes/event"
        )
    finally:
        p.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=20_000)
    args = ap.parse_args()
    if why := missing():
        sys.exit(why)
    root = Path(tempfile.mkdtemp(prefix="cdclake-bench-debezium-"))
    pg = LogicalPostgres().start()
    try:
        for i, (name, rows, sink) in enumerate(CASES):
            print(f"{name}: {one(pg, root, i, rows or args.rows, sink)}", flush=True)
    finally:
        pg.stop()


if __name__ == "__main__":
    main()
