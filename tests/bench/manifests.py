"""Manifests and small files of a busy table (not a test): `make bench-manifests` or
    .venv/bin/python -m tests.bench.manifests [--applies 100] [--events 1000] [--objects 33] [--baseline 100]
        [--small-files]

A table applied pass after pass, as a draining ``cdc_apply`` task applies it, gains a manifest
(and the MERGE a delete manifest) with every commit until Iceberg merges them, at
``commit.manifest.min-count-to-merge`` of them. Two tables side by side in ONE warm Spark Connect
session (the default stack's apply), each in a namespace and staging folder of its own, get the
same micro-batches (the project's workload generator over 20,000 keys; which table goes first
alternates): one as cdclake makes it (:data:`spark_jobs.table.MERGE_MANIFESTS`), the baseline's
tables (the table and its side tables) created with the property at ``--baseline`` (Iceberg's
default: 100). Reported per block of 10 applies: wall seconds and the phases that scan the
tables; over all the applies: wall and CPU seconds (this process, the Connect server) and the
ratio; and each table's manifests at the end.
With ``--small-files`` the baseline is instead cdclake without the apply's compaction of small
files (:func:`spark_jobs.maintain.tidy`; CDCLAKE_SMALL_FILES_AT_MOST out of reach), its manifests
merged as cdclake merges them.
Both tables are checked against the reference model.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from spark_jobs.table import MIN_COUNT_TO_MERGE as PROPERTY
from tests.bench.apply import cpu_seconds
from tests.bench.microbatch import BASE_ROWS, TABLE, Stream, connect_server

BLOCK = 10
SCANS = ("history", "classify", "merge")


@contextmanager
def merged_at(count: int | None) -> Iterator[None]:
    """Tables the apply creates in the block (the table and each side table, whenever it is first
    written) get ``count`` for the property instead of cdclake's value (None: cdclake's); a table
    keeps what it was created with."""
    from spark_jobs import table

    if count is None:
        yield
        return
    given = [table.TABLE_PROPERTIES, table.CDC_TABLE_PROPERTIES, table.UNLESS_SET]
    try:
        for d in given:
            d[PROPERTY] = str(count)
        yield
    finally:
        for d in given:
            d[PROPERTY] = table.MERGE_MANIFESTS[PROPERTY]


def run(applies: int, events: int, objects: int, baseline: int, small_files: bool = False) -> dict[str, Any]:
    from cdclake.dev.reference import diff, expected_tables
    from cdclake.lake.catalog import load_table
    from cdclake.lake.spark import table_ident
    from spark_jobs.apply import apply_table
    from spark_jobs.pending import SIDE_TABLES
    from tests.support import fresh_settings, make_settings, stage, table_rows

    home = Path(tempfile.mkdtemp(prefix="cdclake-manifests-"))
    base = make_settings(home)
    os.environ.update(base.as_env())
    if small_files:
        other = "no small-file compaction"
        modes = {"cdclake": fresh_settings(home), other: fresh_settings(home, small_files_at_most=10**9)}
        counts: dict[str, int | None] = {"cdclake": None, other: None}  # None: cdclake's own
    else:
        other = f"merge at {baseline}"
        modes = {"cdclake": fresh_settings(home), other: fresh_settings(home)}
        counts = {"cdclake": None, other: baseline}
    streams = {m: Stream() for m in modes}
    rows: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    manifests: dict[str, str] = {}
    with connect_server(base) as (spark, _pid):
        for m, s in modes.items():
            spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {s.catalog_name}.{s.namespace}")
            stage(s, streams[m].next(BASE_ROWS, BASE_ROWS // 10, seed=0))
            with merged_at(counts[m]):
                apply_table(spark, s, TABLE, 1000)
        for i in range(applies):
            for m in list(modes) if i % 2 == 0 else list(modes)[::-1]:
                stage(modes[m], streams[m].next(events, max(1, events // objects), seed=10_000 + i))
                t0, c0 = time.perf_counter(), cpu_seconds()
                with merged_at(counts[m]):
                    r = apply_table(spark, modes[m], TABLE, 1000)
                wall, cpu = time.perf_counter() - t0, cpu_seconds() - c0
                rows[m].append({"wall": wall, "cpu": cpu, "phases": r["phases"], "tidied": r.get("tidied", {})})
            if i % BLOCK == BLOCK - 1:
                print(f"[manifests] {i + 1} applies each", flush=True)
        for m, s in modes.items():
            problems = diff(expected_tables(streams[m].batches)[TABLE], table_rows(spark, table_ident(s, TABLE)))
            if problems:
                raise SystemExit(f"{m}: the table differs from the reference model: {problems[:3]}")
            found = []
            for name in (TABLE, *(TABLE + suffix for suffix in SIDE_TABLES)):
                t = load_table(s, name)
                snap = t.current_snapshot() if t is not None else None
                if t is not None and snap is not None:
                    files = (snap.summary.additional_properties if snap.summary else {}).get("total-data-files")
                    found.append(f"{name} {len(snap.manifests(t.io))} manifests, {files} data files")
            manifests[m] = ", ".join(found)
    return {"rows": rows, "manifests": manifests}


def report(out: dict[str, Any]) -> None:
    rows = out["rows"]
    modes = list(rows)
    print(f"\nper block of {BLOCK} applies: wall s ({' / '.join(SCANS)} s)")
    print(f"{'applies':>9}" + "".join(f"{m:>34}" for m in modes))
    for b in range(0, len(rows[modes[0]]), BLOCK):
        cells = []
        for m in modes:
            blk = rows[m][b : b + BLOCK]
            scans = " / ".join(f"{statistics.fmean(r['phases'].get(p, 0.0) for r in blk):.2f}" for p in SCANS)
            cells.append(f"{statistics.fmean(r['wall'] for r in blk):.2f} ({scans})")
        print(f"{b + 1:>4}-{b + len(rows[modes[0]][b : b + BLOCK]):<4}" + "".join(f"{c:>34}" for c in cells))
    wall = {m: statistics.fmean(r["wall"] for r in rows[m]) for m in modes}
    cpu = {m: statistics.fmean(r["cpu"] for r in rows[m]) for m in modes}
    for m in modes:
        print(f"\n{m}: wall {wall[m]:.2f} s, CPU {cpu[m]:.2f} s per apply; at the end {out['manifests'][m]}")
        tidies = [(i + 1, t, how["seconds"]) for i, r in enumerate(rows[m]) for t, how in r["tidied"].items()]
        if tidies:
            print(f"  small files compacted {len(tidies)} times (apply, table, s): {tidies}")
    a, b = modes
    print(f"\n{a} / {b}: wall {wall[a] / wall[b]:.2f}x, CPU {cpu[a] / cpu[b]:.2f}x")
    print("both tables match the reference model")


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--applies", type=int, default=100, help="micro-batches applied to each table")
    ap.add_argument("--events", type=int, default=1000, help="events per micro-batch")
    ap.add_argument("--objects", type=int, default=33, help="staging objects per micro-batch")
    ap.add_argument("--baseline", type=int, default=100, help=f"the baseline table's {PROPERTY}")
    ap.add_argument("--small-files", action="store_true", help="baseline: no compaction of small files by the apply")
    args = ap.parse_args()
    report(run(args.applies, args.events, args.objects, args.baseline, args.small_files))


if __name__ == "__main__":
    main()
