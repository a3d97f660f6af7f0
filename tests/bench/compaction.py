"""Compaction benchmark (not a test): `make bench-compaction` or
    .venv/bin/python -m tests.bench.compaction [--runs 50] [--events-per-run 200] [--scans 7]

``--runs`` small apply runs (merge-on-read, so updates leave delete files) make a table of many
small data and delete files; then ``iceberg_compaction``'s job (``spark_jobs.maintain.compact``)
rewrites it. Reported side by side in the same session: median wall time of a full-table Spark
SQL scan (``SELECT * ... collect``, plus a ``count(*)``-by-status aggregate) before and after,
file counts, and the ratio. Rows are checked against the reference model before and after.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from cdclake.config.settings import load
from cdclake.dev.reference import diff, expected_tables, rows_by_key
from cdclake.dev.workload import generate
from cdclake.lake.health import table_health
from cdclake.lake.spark import session, table_ident
from spark_jobs.maintain import compact
from tests.support import apply_all, stage


def median_s(fn: Any, n: int) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--events-per-run", type=int, default=200)
    ap.add_argument("--scans", type=int, default=7)
    args = ap.parse_args()
    home = Path(tempfile.mkdtemp(prefix="cdclake-bench-compaction-"))
    (home / "tables.toml").write_text('[defaults]\nmerge_mode = "merge-on-read"\n')
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    settings = load({"CDCLAKE_HOME": str(home), "CDCLAKE_TABLE_CONFIG": str(home / "tables.toml")})
    spark = session(settings, "cdclake-bench-compaction")
    spark.sparkContext.setLogLevel("ERROR")
    w = generate(
        events=args.runs * args.events_per_run,
        seed=11,
        tables=("orders",),
        batch_size=args.events_per_run,
        duplicate_every=0,
        keys_per_table=args.runs * args.events_per_run // 2,
    )
    t0 = time.perf_counter()
    for i, b in enumerate(w.batches, start=1):
        stage(settings, [b])
        apply_all(spark, settings)
        if i % 10 == 0:
            print(f"[bench] {i}/{len(w.batches)} apply runs ({time.perf_counter() - t0:.0f}s)", flush=True)
    ident = table_ident(settings, "orders")
    want = expected_tables(w.batches)["orders"]

    def scan() -> None:
        spark.table(ident).collect()

    def aggregate() -> None:
        spark.sql(f"SELECT status, count(*), sum(amount) FROM {ident} GROUP BY status").collect()

    before = table_health(settings, "orders")
    assert not diff(want, rows_by_key(spark.table(ident).collect())), "diverged before compaction"
    scan_before, agg_before = median_s(scan, args.scans), median_s(aggregate, args.scans)
    t0 = time.perf_counter()
    compact(spark, settings, "orders", min_input_files=2)
    compact_s = time.perf_counter() - t0
    after = table_health(settings, "orders")
    spark.catalog.refreshTable(ident)
    assert not diff(want, rows_by_key(spark.table(ident).collect())), "diverged after compaction"
    scan_after, agg_after = median_s(scan, args.scans), median_s(aggregate, args.scans)
    spark.stop()
    assert before is not None and after is not None
    print(f"\n{args.runs} apply runs, {len(want)} rows; compaction took {compact_s:.1f}s")
    print(f"{'':<28}{'before':>10}{'after':>10}{'before/after':>14}")
    print(f"{'data files':<28}{before.data_files:>10}{after.data_files:>10}")
    print(f"{'delete files':<28}{before.delete_files:>10}{after.delete_files:>10}")
    print(f"{'full scan (median s)':<28}{scan_before:>10.3f}{scan_after:>10.3f}{scan_before / scan_after:>14.2f}")
    print(f"{'aggregate (median s)':<28}{agg_before:>10.3f}{agg_after:>10.3f}{agg_before / agg_after:>14.2f}")


if __name__ == "__main__":
    main()
