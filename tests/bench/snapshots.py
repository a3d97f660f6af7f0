"""Snapshot-count benchmark (not a test): `make bench-snapshots` or
    .venv/bin/python -m tests.bench.snapshots [--snapshots 0,500,2000,5000] [--at-most 0]

What a table's age in commits costs one micro-batch. Every commit rewrites, and every apply
reads, a metadata file that holds each unexpired snapshot (its summary and the apply's
watermark). Days of commits every few seconds are too slow to make here, so the table's
metadata is grown instead: copies of its newest watermark snapshot (new ids, no parent, older
times, the same manifest list) are added until it holds ``--snapshots`` of them, and then
``--applies`` micro-batches of 30 events over 30 staging objects run as
``tests.bench.microbatch --connect`` runs them, through a Spark Connect server started as
``cdclake up`` starts it. ``--at-most N`` sets CDCLAKE_SNAPSHOTS_AT_MOST (0: the default), so
the first apply after growing the table trims it. Reported per size: each apply's wall seconds
(the first apart: it may trim), the mean of the rest, CPU seconds (this process and the JVM),
the phases, and the metadata file's size. The table is checked against the reference model at
the end.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.bench.apply import cpu_seconds
from tests.bench.microbatch import TABLE, Stream, check, connect_server

EVENTS, OBJECTS = 30, 30


def grow(settings: Any, total: int) -> int:
    """Copies of the newest watermark snapshot added to the table's metadata until it holds
    ``total`` snapshots, published as a commit of the catalog row; the file's size in bytes."""
    from cdclake.lake import publish as p
    from cdclake.lake.catalog import open_catalog

    catalog = open_catalog(settings)
    ident = (settings.namespace, TABLE)
    old = p.locations(catalog, [ident])[ident]
    meta = p.read_metadata(p.file_io(catalog, old), old)
    snaps = meta["snapshots"]
    model = next(s for s in reversed(snaps) if "cdclake.watermark" in (s.get("summary") or {}))
    first = min(s["timestamp-ms"] for s in snaps) - 1000 * (total + 10)
    added = []
    for i in range(total - len(snaps)):
        s = copy.deepcopy(model)
        s.pop("parent-snapshot-id", None)
        added.append(s | {"snapshot-id": random.getrandbits(62), "timestamp-ms": first + 1000 * i})
    meta = {**meta, "snapshots": added + snaps}
    planned = p._write(catalog, ident, old, meta)
    with p._session(catalog) as session:
        p.swap_row(session, catalog.name, ident[0], ident[1], old, planned.new)
        session.commit()
    return len(json.dumps(meta))


def run(sizes: list[int], applies: int, warm: int, at_most: int) -> list[dict[str, Any]]:
    from cdclake.config.settings import load
    from spark_jobs.apply import apply_table
    from tests.support import stage

    home = Path(tempfile.mkdtemp(prefix="cdclake-snapshots-"))
    settings = load({"CDCLAKE_HOME": str(home), **({"CDCLAKE_SNAPSHOTS_AT_MOST": str(at_most)} if at_most else {})})
    os.environ.update(settings.as_env())
    out = []
    with connect_server(settings) as (spark, _):
        spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {settings.catalog_name}.{settings.namespace}")
        w = Stream()
        stage(settings, w.next(20_000, 2_000, seed=0))
        apply_table(spark, settings, TABLE, 1000)
        for i in range(warm):
            stage(settings, w.next(EVENTS, EVENTS // OBJECTS, seed=10_000 + i))
            apply_table(spark, settings, TABLE, 1000)
        for size in sizes:
            size_bytes = grow(settings, size) if size else 0
            rows = []
            for i in range(applies):
                stage(settings, w.next(EVENTS, EVENTS // OBJECTS, seed=size + i))
                t0, c0 = time.perf_counter(), cpu_seconds()
                r = apply_table(spark, settings, TABLE, 1000)
                rows.append({"wall": time.perf_counter() - t0, "cpu": cpu_seconds() - c0, "phases": r["phases"]})
            out.append({"size": size, "bytes": size_bytes, "applies": rows})
            print(f"[snapshots] {size}: {[round(r['wall'], 2) for r in rows]} s", flush=True)
        check(spark, settings, w.batches)
    return out


def report(results: list[dict[str, Any]]) -> None:
    print(f"\n{'snapshots':>10}{'MB':>7}{'first s':>9}{'wall s':>8}{'cpu s':>7}  phases (mean s, after the first)")
    for res in results:
        rest = res["applies"][1:]
        phases = {k: round(statistics.fmean(r["phases"].get(k, 0.0) for r in rest), 2) for k in rest[0]["phases"]}
        wall, cpu = (statistics.fmean(r[k] for r in rest) for k in ("wall", "cpu"))
        first = res["applies"][0]["wall"]
        print(f"{res['size']:>10}{res['bytes'] / 1e6:>7.1f}{first:>9.2f}{wall:>8.2f}{cpu:>7.2f}  {phases}")
    print("\nthe table matches the reference model")


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--snapshots", default="0,500,2000,5000", help="snapshots to grow the table to, in turn (0: as is)")
    ap.add_argument("--applies", type=int, default=6, help="micro-batches per size")
    ap.add_argument("--warm", type=int, default=20, help="untimed micro-batches first")
    ap.add_argument("--at-most", type=int, default=0, help="CDCLAKE_SNAPSHOTS_AT_MOST (0: the default)")
    a = ap.parse_args()
    report(run([int(x) for x in a.snapshots.split(",")], max(2, a.applies), a.warm, a.at_most))


if __name__ == "__main__":
    main()
