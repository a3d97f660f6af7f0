"""One large UPDATE in PostgreSQL, through Debezium Server and the receiver into Iceberg, until
Spark SQL shows it (a benchmark, not a test; issue 14)::

    .venv/bin/python -m tests.bench.debezium_update [--rows 100000]

The sink has the recommended settings of ``cdclake debezium`` (schemas on, batches of 1024) and,
side by side in the same run, the same UPDATE with ``cdclake debezium --discover --no-schemas``
(no schemas, batches of 1024, the source's types from the table config) and, as the baseline,
``schemas.enable=false`` with batches of 1000 and no configured types (the fastest setting
measured in docs/benchmarks.md, but without the source's types).
Per setting, seconds from the UPDATE's commit until every change landed in staging (and the
receiver's events/s), then one apply of the table (Spark, in this process, as a ``cdc_apply``
task runs it; Airflow's scheduling share is what ``make bench-freshness`` measures), then
until a Spark SQL query sees the new values; and CPU seconds of Debezium Server's JVM, the
receiver and this process (Spark's driver and executors run in it, local mode).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from cdclake.config.settings import Settings, load
from cdclake.debezium.config import RETRY_INTERVAL_MS, key_toml
from cdclake.debezium.discover import discover
from cdclake.dev.stack import free_port
from tests.support.debezium_server import LogicalPostgres, Pipeline, fail_fast_sink, missing

CASES: list[tuple[str, dict[str, object]]] = [
    # The recommended retry pause too (the harness' is 1 s): a 429 from the rate limit costs it.
    ("recommended: schemas on, batch.max-size=1024, retry pause 5 s", {"retry_interval_ms": RETRY_INTERVAL_MS}),
    ("--discover --no-schemas: batch.max-size=1024, types from the table config", {"schemas": False, "discover": True}),
    ("baseline: schemas.enable=false, batch.max-size=1000", {"batch_max_size": 1000, "schemas": False}),
    (
        "--discover --no-schemas, batch.max-size=1000: types from the table config",
        {"schemas": False, "discover": True, "batch_max_size": 1000},
    ),
]


def cpu(pid: int) -> float:
    try:
        p = psutil.Process(pid)
        times = [p.cpu_times(), *(c.cpu_times() for c in p.children(recursive=True))]
        return float(sum(t.user + t.system for t in times))
    except psutil.NoSuchProcess:
        return 0.0


def visible(spark: Any, settings: Settings, rows: int) -> bool:
    table = f"{settings.catalog_name}.{settings.namespace}.items"
    spark.sql(f"REFRESH TABLE {table}")
    got = spark.sql(f"SELECT count(*) AS c FROM {table} WHERE n < 0").first()
    return got is not None and got["c"] == rows


def one(spark: Any, pg: LogicalPostgres, root: Path, i: int, rows: int, sink: dict[str, object]) -> str:
    from spark_jobs.apply import apply_table

    db = f"upd{i}"
    pg.create_db(db)
    pg.sql("CREATE TABLE items (id int PRIMARY KEY, n int, price numeric(12,2), at timestamptz)", db)
    pg.sql("CREATE TABLE marks (id int PRIMARY KEY)", db)
    pg.sql(f"INSERT INTO items SELECT g, g, g / 100.0, now() FROM generate_series(1, {rows}) g", db)
    # The Spark session's catalog, a namespace and staging folder of this case's own.
    home = root / "spark"
    sink = dict(sink)
    database = pg.database(db, ["items", "marks"])
    config = None
    if sink.pop("discover", False):
        found = discover(database)
        config = root / f"{db}.toml"
        config.write_text(key_toml(database, found.keys, found.types))
    settings = load(
        {"CDCLAKE_HOME": str(home)},
        receiver_port=free_port(),
        namespace=db,
        staging_dir=home / db,
        table_config=config,
    )
    p = Pipeline(root, settings, database, fail_fast_sink(settings.receiver_url, **sink), db)
    p.start()
    try:
        if not p.wait_for("items", rows, timeout=900):
            return f"snapshot stalled: {p.failures(1)}"
        apply_table(spark, settings, "items", 100_000)  # the snapshot: the table as it was
        assert p.debezium.proc is not None and p.receiver.proc is not None
        cpu0 = (cpu(p.debezium.proc.pid), cpu(p.receiver.pid), psutil.Process().cpu_times())
        t0 = time.monotonic()
        pg.sql("UPDATE items SET n = -n, price = price + 1, at = now()", db)
        if not p.wait_for("items", 2 * rows, timeout=900):
            return f"stalled after the UPDATE: {p.failures(1)}"
        landed = time.monotonic() - t0
        result = apply_table(spark, settings, "items", 100_000)
        applied = time.monotonic() - t0
        while not visible(spark, settings, rows):
            time.sleep(0.2)
        seen = time.monotonic() - t0
        fields = spark.table(f"{settings.catalog_name}.{settings.namespace}.items").schema.fields
        types = {f.name: f.dataType.simpleString() for f in fields}
        me = psutil.Process().cpu_times()
        own = me.user + me.system - cpu0[2].user - cpu0[2].system
        dbz, rcv = cpu(p.debezium.proc.pid) - cpu0[0], cpu(p.receiver.pid) - cpu0[1]
        return (
            f"landed {landed:.1f}s ({rows / landed:,.0f} events/s), applied {applied:.1f}s "
            f"(apply {applied - landed:.1f}s, {result.get('applied')} applied), visible {seen:.1f}s; "
            f"CPU s: Debezium {dbz:.1f}, receiver {rcv:.1f}, Spark+bench {own:.1f}; "
            f"price {types['price']}, at {types['at']}; apply phases {result.get('phases')}"
        )
    finally:
        p.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--cases", default="", help="comma-separated case numbers (1-based) to run; empty: all")
    args = ap.parse_args()
    chosen = {int(c) - 1 for c in args.cases.split(",") if c.strip()} or set(range(len(CASES)))
    if why := missing():
        sys.exit(why)
    from cdclake.lake.spark import session

    root = Path(tempfile.mkdtemp(prefix="cdclake-bench-debezium-update-"))
    pg = LogicalPostgres().start()
    spark = session(load({"CDCLAKE_HOME": str(root / "spark")}), app_name="bench-debezium-update")
    try:
        print(f"{args.rows:,}-row UPDATE; load average before: {psutil.getloadavg()[0]:.1f}", flush=True)
        for i, (name, sink) in enumerate(CASES):
            if i not in chosen:
                continue
            print(f"{name}: {one(spark, pg, root, i, args.rows, sink)}", flush=True)
    finally:
        spark.stop()
        pg.stop()


if __name__ == "__main__":
    main()
