"""Deletion-vector benchmark (not a test): `make bench-deletes` or
    .venv/bin/python -m tests.bench.deletes [--format-versions 2,3] [--runs 50] [--events-per-run 200] [--scans 5]

Iceberg format v2 (position-delete files) vs v3 (deletion vectors) under the apply's
merge-on-read, side by side in one in-process local[2] Spark session: the same ``--runs`` small
batches of the project's workload generator (inserts, updates, deletes) are applied, one apply
per table in turn (the order alternating), to one table per format version (the table option
``format_version``) and, unless ``--no-upgrade``, to a table made as v2 whose option turns to 3
half-way (the upgrade path: the apply raises the table's ``format-version``).

Reported per table: mean and p95 apply wall and CPU seconds (this process and the Spark JVM)
over every apply but the first (it creates the table), delete files and their bytes (v3: the
Puffin files holding the vectors), then, after the last apply, the median full-scan wall time
of a Spark SQL ``count(*)`` and of a full read (``collect``), interleaved between the tables;
then whether pyiceberg (``load_table(...).scan().to_arrow()``), DuckDB through the REST catalog
server and Spark through the REST catalog read the same rows as Spark, and whether the change
feed and watermark reads (``cdclake.lake.changes``) give the same as on v2. Every table is
checked against the reference model.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.bench.apply import cpu_seconds

TABLE = "orders"


@dataclasses.dataclass
class Variant:
    name: str
    settings: Any
    config: Path
    versions: tuple[int, int]  # format version before and after the upgrade point
    walls: list[float] = dataclasses.field(default_factory=list)
    cpus: list[float] = dataclasses.field(default_factory=list)
    at_upgrade: dict[str, Any] = dataclasses.field(default_factory=dict)

    def write_config(self, version: int) -> None:
        self.config.write_text(f'[defaults]\nmerge_mode = "merge-on-read"\nformat_version = {version}\n')


def p95(xs: list[float]) -> float:
    return statistics.quantiles(xs, n=20, method="inclusive")[-1] if len(xs) > 1 else xs[0]


def delete_files(settings: Any) -> dict[str, Any]:
    """Delete files of the current snapshot: entries, distinct files and their bytes, by format."""
    from cdclake.lake.catalog import load_table

    t = load_table(settings, TABLE)
    assert t is not None
    files = t.inspect.files().to_pylist()
    deletes = [f for f in files if f["content"] != 0]
    distinct = {f["file_path"]: f for f in deletes}
    formats = sorted({str(f["file_format"]) for f in deletes})
    return {
        "format_version": t.metadata.format_version,
        "data_files": sum(1 for f in files if f["content"] == 0),
        "delete_entries": len(deletes),
        "delete_files": len(distinct),
        "delete_bytes": sum(int(f["file_size_in_bytes"]) for f in distinct.values()),
        "formats": formats,
        "by_format": {fmt: sum(1 for f in distinct.values() if str(f["file_format"]) == fmt) for fmt in formats},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--format-versions", default="2,3", help="comma-separated; one table each")
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--events-per-run", type=int, default=200)
    ap.add_argument("--scans", type=int, default=5)
    ap.add_argument("--no-upgrade", action="store_true", help="leave out the v2 table upgraded half-way")
    args = ap.parse_args()

    from cdclake.config.settings import load
    from cdclake.dev.reference import diff, expected_tables, rows_by_key
    from cdclake.dev.workload import generate
    from cdclake.lake.catalog import load_table, table_watermark
    from cdclake.lake.changes import OPERATIONS, read_changes
    from cdclake.lake.spark import session, table_ident
    from tests.restcatalog.test_rest_engines import attach_rest, duckdb_connection, rows
    from tests.support import apply_all, stage
    from tests.support.rest import TOKENS, serve

    home = Path(tempfile.mkdtemp(prefix="cdclake-bench-deletes-"))
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"

    def settings_for(name: str, config: Path) -> Any:
        return load(
            {"CDCLAKE_HOME": str(home), "CDCLAKE_TABLE_CONFIG": str(config)},
            namespace=name,
            staging_dir=home / f"staging-{name}",
        )

    plan = [(f"v{v}", (v, v)) for v in (int(x) for x in args.format_versions.split(",") if x.strip())]
    if not args.no_upgrade:
        plan.append(("v2to3", (2, 3)))
    variants = []
    for name, versions in plan:
        config = home / f"tables-{name}.toml"
        v = Variant(name, settings_for(name, config), config, versions)
        v.write_config(versions[0])
        variants.append(v)

    spark = session(variants[0].settings, "cdclake-bench-deletes")
    spark.sparkContext.setLogLevel("ERROR")
    w = generate(
        events=args.runs * args.events_per_run,
        seed=11,
        tables=(TABLE,),
        batch_size=args.events_per_run,
        duplicate_every=0,
        keys_per_table=args.runs * args.events_per_run // 2,
    )
    half = len(w.batches) // 2
    t0 = time.perf_counter()
    for i, b in enumerate(w.batches):
        if i == half:
            for v in variants:
                if v.versions[0] != v.versions[1]:
                    v.at_upgrade = delete_files(v.settings)
                    v.write_config(v.versions[1])  # the next apply raises format-version
        order = variants[i % len(variants) :] + variants[: i % len(variants)]
        for v in order:
            stage(v.settings, [b])
            t1, c1 = time.perf_counter(), cpu_seconds()
            apply_all(spark, v.settings)
            v.walls.append(time.perf_counter() - t1)
            v.cpus.append(cpu_seconds() - c1)
        if (i + 1) % 10 == 0:
            print(f"[deletes] {i + 1}/{len(w.batches)} batches applied ({time.perf_counter() - t0:.0f}s)", flush=True)

    want = expected_tables(w.batches)[TABLE]
    idents = {v.name: table_ident(v.settings, TABLE) for v in variants}
    spark_rows: dict[str, list[Any]] = {}
    for v in variants:
        spark.catalog.refreshTable(idents[v.name])
        got = spark.table(idents[v.name]).collect()
        problems = diff(want, rows_by_key(got))
        if problems:
            raise SystemExit(f"{v.name} differs from the reference model: {problems[:3]}")
        spark_rows[v.name] = rows(got)

    counts: dict[str, list[float]] = {v.name: [] for v in variants}
    reads: dict[str, list[float]] = {v.name: [] for v in variants}
    for _ in range(args.scans):  # interleaved, so load from elsewhere falls on every table alike
        for v in variants:
            t1 = time.perf_counter()
            spark.sql(f"SELECT count(*) FROM {idents[v.name]}").collect()
            t2 = time.perf_counter()
            spark.table(idents[v.name]).collect()
            counts[v.name].append(t2 - t1)
            reads[v.name].append(time.perf_counter() - t2)

    files = {v.name: delete_files(v.settings) for v in variants}
    readers: dict[str, dict[str, str]] = {v.name: {} for v in variants}
    py_s: dict[str, float] = {}
    duck_s: dict[str, float] = {}
    tokens = home / "rest-tokens.toml"
    tokens.write_text(TOKENS)
    base = variants[0]
    feed0 = None
    for v in variants:
        out = readers[v.name]
        reference = spark_rows[v.name]
        try:
            t = load_table(v.settings, TABLE)
            assert t is not None
            t1 = time.perf_counter()
            arrow = t.scan().to_arrow()
            py_s[v.name] = time.perf_counter() - t1
            out["pyiceberg"] = "same rows" if rows(arrow.to_pylist()) == reference else "DIFFERENT rows"
        except Exception as exc:
            out["pyiceberg"] = f"fails: {type(exc).__name__}: {str(exc)[:160]}"
        try:
            wm = table_watermark(v.settings, TABLE)
            feed = [
                (c.key, c.operation, c.source, c.sequence)
                for c in read_changes(v.settings, TABLE, None, OPERATIONS, 10**7)
            ]
            if v is base:
                feed0 = (feed, wm is not None)
            same = feed0 is not None and (feed, wm is not None) == feed0
            out["change feed + watermark"] = f"{len(feed)} changes, " + (
                "same as " + base.name if same else "DIFFERENT"
            )
        except Exception as exc:
            out["change feed + watermark"] = f"fails: {type(exc).__name__}: {str(exc)[:160]}"
        rs = dataclasses.replace(v.settings, rest_tokens_file=tokens)
        with serve(rs) as (url, _):
            try:
                duck = duckdb_connection()
                duck.execute(f"ATTACH 'lake' AS lake (TYPE iceberg, ENDPOINT '{url}', TOKEN 'static-reader')")
                t1 = time.perf_counter()
                got = duck.execute(f"SELECT * FROM lake.{v.settings.namespace}.{TABLE}").to_arrow_table().to_pylist()
                duck_s[v.name] = time.perf_counter() - t1
                out["duckdb (REST)"] = (
                    "same rows" if rows(got) == reference else f"DIFFERENT rows ({len(got)} vs {len(reference)})"
                )
            except Exception as exc:
                out["duckdb (REST)"] = f"fails: {type(exc).__name__}: {str(exc)[:160]}"
            try:
                rc = attach_rest(spark, url)
                got = spark.sql(f"SELECT * FROM {rc}.{v.settings.namespace}.{TABLE}").collect()
                out["spark (REST)"] = "same rows" if rows(got) == reference else "DIFFERENT rows"
            except Exception as exc:
                out["spark (REST)"] = f"fails: {type(exc).__name__}: {str(exc)[:160]}"
    spark.stop()

    print(f"\n{args.runs} applies of {args.events_per_run} events, {len(want)} rows; mean/p95: applies 2..{args.runs}")
    names = [v.name for v in variants]
    print(f"{'':<30}" + "".join(f"{n:>14}" for n in names))

    def line(label: str, values: list[str]) -> None:
        print(f"{label:<30}" + "".join(f"{x:>14}" for x in values))

    steady = {v.name: (v.walls[1:], v.cpus[1:]) for v in variants}
    line("apply wall mean s", [f"{statistics.fmean(steady[n][0]):.2f}" for n in names])
    line("apply wall p95 s", [f"{p95(steady[n][0]):.2f}" for n in names])
    line("apply CPU mean s", [f"{statistics.fmean(steady[n][1]):.2f}" for n in names])
    line("apply CPU p95 s", [f"{p95(steady[n][1]):.2f}" for n in names])
    line("format version", [str(files[n]["format_version"]) for n in names])
    line("data files", [str(files[n]["data_files"]) for n in names])
    line("delete files", [str(files[n]["delete_files"]) for n in names])
    line("delete entries (DVs)", [str(files[n]["delete_entries"]) for n in names])
    line("delete bytes", [str(files[n]["delete_bytes"]) for n in names])
    line("count(*) median s", [f"{statistics.median(counts[n]):.3f}" for n in names])
    line("full read median s", [f"{statistics.median(reads[n]):.3f}" for n in names])
    line("pyiceberg to_arrow s", [f"{py_s[n]:.3f}" if n in py_s else "-" for n in names])
    line("duckdb (REST) read s", [f"{duck_s[n]:.3f}" if n in duck_s else "-" for n in names])
    for n in names:
        print(f"\n{n}: delete files by format {files[n]['by_format']}")
        for reader, result in readers[n].items():
            print(f"  {reader:<26}{result}")
    for v in variants:
        if v.at_upgrade:
            print(
                f"\n{v.name}: before the upgrade (after {half} applies) v{v.at_upgrade['format_version']}, "
                f"delete files by format {v.at_upgrade['by_format']}; after {args.runs}: "
                f"v{files[v.name]['format_version']}, {files[v.name]['by_format']}"
            )
    print("\nevery table matches the reference model")


if __name__ == "__main__":
    main()
