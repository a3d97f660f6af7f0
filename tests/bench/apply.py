"""Apply benchmark (not a test): `make bench` or
    .venv/bin/python -m tests.bench.apply --events 1000000 --keys 300000 --base-rows 1000000

One CDC workload (70/25/5 insert/update/delete, 10% duplicates, some out of order) against a
table that already holds --base-rows rows, applied by
  (a) our Spark job (spark_jobs.apply.apply_table, in-process local[2] session; with --warm, after
      an untimed apply of a batch of the same shape, as in the long-lived Spark Connect server),
  (b) pyiceberg on the same deduplicated changes: delete the changed keys, append the new rows,
  (c) the floor: the same final state computed by pyarrow in one process, written as Parquet,
  (d) DuckDB on the same deduplicated changes, through the project's REST catalog: in one DuckDB
      transaction, DELETE the changed keys and INSERT the new rows (DuckDB 1.5's MERGE INTO an
      Iceberg table takes a single UPDATE/DELETE action, so an upsert with deletes cannot be one MERGE),
  (e) DuckDB from the staged objects, timed whole: read the JSON, keep each key's newest event,
      then (d)'s transaction. The same input as (a), not its rules (see DUCKDB_LATEST).
(a) reads objects landed with their receipts, which record their JSON types (as the receiver
does); --no-receipts stages them without, so the apply infers the types (a pass over them).
Reports wall seconds, events/s and the ratios, and peak RSS of each process tree.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj
import pyarrow.parquet as pq

from cdclake import staging
from cdclake.config.settings import load
from cdclake.contracts import jsontypes

T0_MS = 1_767_225_600_000


@contextmanager
def peak_rss() -> Iterator[dict[str, float]]:
    """Peak RSS (MiB) of this process and its children (the Spark JVM), sampled every 0.2 s."""
    out = {"peak_mib": 0.0}
    stop = threading.Event()
    me = psutil.Process()

    def sample() -> None:
        while not stop.is_set():
            total = 0
            for p in [me, *me.children(recursive=True)]:
                with contextlib.suppress(psutil.NoSuchProcess):
                    total += p.memory_info().rss
            out["peak_mib"] = max(out["peak_mib"], total / 2**20)
            stop.wait(0.2)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    try:
        yield out
    finally:
        stop.set()
        t.join()


def base_rows(n: int) -> pa.Table:
    ids = pa.array(range(n), pa.int64())
    return pa.table(
        {
            "_cdc_row_id": pc.cast(ids, pa.string()),
            "id": ids,
            "name": pc.binary_join_element_wise("name-", pc.cast(ids, pa.string()), ""),
            "amount": pc.multiply(pc.cast(ids, pa.float64()), 0.5),
            "status": pa.array(["base"] * n),
            "_cdc_seq": pa.array([0] * n, pa.int64()),
            "_cdc_ts": pa.array([T0_MS * 1000] * n, pa.timestamp("us", tz="UTC")),
            "_cdc_source": pa.array(["base"] * n),
        }
    )


def workload(events: int, keys: int, base: int, seed: int = 1) -> list[dict[str, Any]]:
    """Events in arrival order: 70/25/5 insert/update/delete, 10% re-sent, 2% moved later."""
    rng = random.Random(seed)
    out = []
    next_new = base
    for seq in range(1, events + 1):
        r = rng.random()
        if r < 0.70:
            key, op = next_new, "INSERT"
            next_new += 1
        else:
            key = rng.randrange(0, min(next_new, base + keys))
            op = "UPDATE" if r < 0.95 else "DELETE"
        ev: dict[str, Any] = {
            "source": "bench",
            "batchSequence": seq // 10_000,
            "sequence": seq,
            "timestamp": T0_MS + seq,
            "operation": op,
            "rowId": str(key),
        }
        if op != "DELETE":
            ev["after"] = {"id": key, "name": f"name-{key}", "amount": seq * 0.25 + 0.5, "status": op.lower()}
        out.append(ev)
    out += [out[rng.randrange(len(out))] for _ in range(events // 10)]  # duplicates
    for _ in range(events // 50):  # out of order
        i, j = rng.randrange(len(out)), rng.randrange(len(out))
        out[i], out[j] = out[j], out[i]
    return out


def stage_events(
    root: Path, table: str, evs: list[dict[str, Any]], per_object: int = 20_000, receipts: bool = True
) -> list[Path]:
    """Objects as the receiver lands them: each with its batch's receipt, which records the
    object's JSON types (``receipts=False``: objects alone; the apply infers their types)."""
    store = staging.LocalStaging(root)
    paths = []
    for n, i in enumerate(range(0, len(evs), per_object)):
        key = staging.make_key(table, "bench", n, T0_MS + n)
        part = evs[i : i + per_object]
        if receipts:
            types = {table: jsontypes.record(part)}
            receipt = staging.Receipt("bench", n, 0, key.landed_ms, "bench", len(part), [key.path], "", types)
            store.put_if_absent(staging.receipt_path("bench", n), staging.encode_receipt(receipt))
        store.put(key, "".join(json.dumps(e) + "\n" for e in part).encode())
        paths.append(root / key.path)
    return paths


def latest_changes(paths: list[Path]) -> pa.Table:
    """Dedup + newest event per key with pyarrow (the floor's own logic, shared by (b))."""
    t = pa.concat_tables([pj.read_json(p) for p in paths], promote_options="default")
    # Newest first within each key; the first row of each key wins (its re-sent copies and
    # older events follow it and are dropped).
    t = t.take(pc.sort_indices(t, [("rowId", "ascending"), ("sequence", "descending"), ("source", "descending")]))
    keys = t["rowId"].combine_chunks()
    first = pc.not_equal(keys.slice(1), keys.slice(0, len(keys) - 1))
    return t.filter(pa.concat_arrays([pa.array([True]), first]))


def final_rows(base: pa.Table, latest: pa.Table) -> pa.Table:
    changed = pc.is_in(base["_cdc_row_id"], value_set=latest["rowId"])
    kept = base.filter(pc.invert(changed))
    live = latest.filter(pc.not_equal(latest["operation"], "DELETE"))
    after = live["after"].combine_chunks()
    new = pa.table(
        {
            "_cdc_row_id": live["rowId"],
            "id": after.field("id"),
            "name": after.field("name"),
            "amount": after.field("amount"),
            "status": after.field("status"),
            "_cdc_seq": live["sequence"],
            "_cdc_ts": pc.cast(pc.multiply(live["timestamp"], 1000), pa.timestamp("us", tz="UTC")),
            "_cdc_source": live["source"],
        }
    )
    return pa.concat_tables([kept, new.cast(kept.schema)])


def cpu_seconds() -> float:
    """User + system CPU seconds of this process and its children (the Spark JVM) so far."""
    total = 0.0
    me = psutil.Process()
    for p in [me, *me.children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess):
            t = p.cpu_times()
            total += t.user + t.system
    return total


CPU: dict[str, float] = {}  # CPU seconds of each path, by the name timed() was given


def timed(fn: Callable[[], Any], path: str = "") -> tuple[float, Any, float]:
    with peak_rss() as rss:
        t0, c0 = time.perf_counter(), cpu_seconds()
        out = fn()
        dt = time.perf_counter() - t0
    CPU[path] = cpu_seconds() - c0
    print(f"[bench] cpu {CPU[path]:.1f}s over {dt:.1f}s wall", flush=True)
    return dt, out, rss["peak_mib"]


def duckdb_path(settings: Any, base: pa.Table, latest: pa.Table) -> tuple[float, float, int]:
    """(d): the table made and filled by pyiceberg (not timed), then DuckDB's transaction, timed."""
    from cdclake.lake.catalog import open_catalog
    from tests.restcatalog.test_rest_engines import duckdb_connection
    from tests.support.rest import serve

    cat = open_catalog(settings)
    cat.create_namespace_if_not_exists("duck")
    cat.create_table(("duck", "bench"), schema=base.schema).append(base)
    new_rows = final_rows(base.slice(0, 0), latest)
    with serve(settings) as (url, _app):
        con = duckdb_connection()
        con.execute(f"ATTACH 'lake' AS lake (TYPE iceberg, ENDPOINT '{url}', AUTHORIZATION_TYPE 'none')")
        con.register("changed", latest.select(["rowId"]))
        con.register("new_rows", new_rows)

        def apply() -> None:
            con.execute("BEGIN")
            con.execute("DELETE FROM lake.duck.bench WHERE _cdc_row_id IN (SELECT rowId FROM changed)")
            con.execute("INSERT INTO lake.duck.bench SELECT * FROM new_rows")
            con.execute("COMMIT")

        dt, _, rss = timed(apply, "d")
        found = con.execute("SELECT count(*) FROM lake.duck.bench").fetchone()
    rows = int(found[0]) if found else -1
    print(
        f"[bench] (d) DuckDB delete+insert: {dt:.1f}s, {rows} rows, peak RSS {rss:.0f} MiB",
        flush=True,
    )
    return dt, rss, rows


# (e)'s batch, from the staged objects: each key's newest event (exact re-sends share it), as
# the table's columns. Not the job's rules: no per-value quarantine, no ordering beyond
# ``sequence``, no late or superseded events against the stored rows, no side tables.
DUCKDB_LATEST = """
CREATE TEMP TABLE latest AS
SELECT rowId, operation, after, sequence, "timestamp", source
FROM read_json($files, format = 'newline_delimited')
QUALIFY row_number() OVER (PARTITION BY rowId ORDER BY sequence DESC, source DESC) = 1
"""
DUCKDB_INSERT = """
INSERT INTO lake.duckjson.bench
SELECT rowId, after.id, after.name, after.amount, after.status, sequence,
       make_timestamp("timestamp" * 1000)::TIMESTAMPTZ, source
FROM latest WHERE operation <> 'DELETE'
"""


def duckdb_json_path(settings: Any, base: pa.Table, paths: list[Path]) -> tuple[float, float, int]:
    """(e): DuckDB from the staged JSON, the whole batch timed: read the objects, keep each
    key's newest event, then delete the changed keys and insert the live rows in one transaction
    (the base table made and filled by pyiceberg, not timed)."""
    from cdclake.lake.catalog import open_catalog
    from tests.restcatalog.test_rest_engines import duckdb_connection
    from tests.support.rest import serve

    cat = open_catalog(settings)
    cat.create_namespace_if_not_exists("duckjson")
    cat.create_table(("duckjson", "bench"), schema=base.schema).append(base)
    with serve(settings) as (url, _app):
        con = duckdb_connection()
        con.execute("SET TimeZone = 'UTC'")
        con.execute(f"ATTACH 'lake' AS lake (TYPE iceberg, ENDPOINT '{url}', AUTHORIZATION_TYPE 'none')")

        def apply() -> None:
            con.execute(DUCKDB_LATEST, {"files": [str(p) for p in paths]})
            con.execute("BEGIN")
            con.execute("DELETE FROM lake.duckjson.bench WHERE _cdc_row_id IN (SELECT rowId FROM latest)")
            con.execute(DUCKDB_INSERT)
            con.execute("COMMIT")

        dt, _, rss = timed(apply, "e")
        found = con.execute("SELECT count(*) FROM lake.duckjson.bench").fetchone()
    rows = int(found[0]) if found else -1
    print(f"[bench] (e) DuckDB from the staged JSON: {dt:.1f}s, {rows} rows, peak RSS {rss:.0f} MiB", flush=True)
    return dt, rss, rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--keys", type=int, default=60_000)
    ap.add_argument("--base-rows", type=int, default=200_000)
    ap.add_argument("--skip", default="", help="comma list of a,b,c,d,e to skip")
    ap.add_argument(
        "--pad-rows",
        type=int,
        default=0,
        help="extra rows in (a)'s table, keys the batch never touches: table-size growth with the same batch",
    )
    ap.add_argument("--merge-mode", default=None, help="(a)'s table: copy-on-write or merge-on-read (default: ours)")
    ap.add_argument("--partition-by", default="", help="(a)'s table: ';'-separated transforms, e.g. 'bucket(8, k)'")
    ap.add_argument("--conf", action="append", default=[], help="(a)'s Spark session: KEY=VALUE, repeatable")
    ap.add_argument(
        "--warm",
        action="store_true",
        help="(a) in a warm JVM: apply a batch of the same shape to another table first, untimed",
    )
    ap.add_argument(
        "--no-receipts",
        action="store_true",
        help="(a) from objects without receipts: the apply infers the JSON types (a pass over the objects)",
    )
    ap.add_argument(
        "--cpu-phases", action="store_true", help="(a)'s phases in CPU seconds of the process tree (busy machines)"
    )
    args = ap.parse_args()
    skip = set(args.skip.split(",")) - {""}
    home = Path(tempfile.mkdtemp(prefix="cdclake-bench-"))
    os.environ["CDCLAKE_HOME"] = str(home)
    if args.merge_mode or args.partition_by:
        parts = [p.strip() for p in args.partition_by.split(";") if p.strip()]
        lines = [f"partition_by = {json.dumps(parts)}"]
        lines += [f'merge_mode = "{args.merge_mode}"'] if args.merge_mode else []
        (home / "tables.toml").write_text("[defaults]\n" + "\n".join(lines) + "\n")
        os.environ["CDCLAKE_TABLE_CONFIG"] = str(home / "tables.toml")
    settings = load()
    print(f"[bench] home {home}; generating {args.events} events over a {args.base_rows}-row table", flush=True)
    evs = workload(args.events, args.keys, args.base_rows)
    paths = stage_events(settings.staging_dir, "bench", evs, receipts=not args.no_receipts)
    base = base_rows(args.base_rows)
    n_events = len(evs)
    results: dict[str, tuple[float, float]] = {}
    counts: dict[str, int] = {}  # rows each path ends with: they must agree

    if "c" not in skip:

        def floor() -> int:
            out = final_rows(base, latest_changes(paths))
            pq.write_table(out, home / "floor.parquet")
            return int(out.num_rows)

        dt, rows_c, rss = timed(floor, "c")
        results["c"], counts["c"] = (dt, rss), rows_c
        print(f"[bench] (c) pyarrow floor: {dt:.1f}s, {rows_c} rows, peak RSS {rss:.0f} MiB", flush=True)

    if "b" not in skip:
        from pyiceberg.expressions import In

        from cdclake.lake.catalog import open_catalog

        cat = open_catalog(settings)
        cat.create_namespace_if_not_exists("pyice")
        tbl = cat.create_table(("pyice", "bench"), schema=base.schema)
        tbl.append(base)
        latest = latest_changes(paths)  # the same deduplicated data, not timed

        def pyiceberg_apply() -> None:
            with tbl.transaction() as tx:
                tx.delete(In("_cdc_row_id", set(latest["rowId"].to_pylist())))  # type: ignore[call-arg,arg-type]
                tx.append(final_rows(base.slice(0, 0), latest))

        dt, _, rss = timed(pyiceberg_apply, "b")
        results["b"], counts["b"] = (dt, rss), tbl.scan().count()
        print(
            f"[bench] (b) pyiceberg delete+append: {dt:.1f}s, {counts['b']} rows, peak RSS {rss:.0f} MiB",
            flush=True,
        )

    if "d" not in skip:
        dt, rss, counts["d"] = duckdb_path(settings, base, latest_changes(paths))
        results["d"] = (dt, rss)

    if "e" not in skip:
        dt, rss, counts["e"] = duckdb_json_path(settings, base, paths)
        results["e"] = (dt, rss)

    if "a" not in skip:
        import spark_jobs.apply as job
        from cdclake.config.tables import load_table_config
        from cdclake.lake.spark import session, table_ident
        from spark_jobs.apply import apply_table
        from spark_jobs.system import KEY
        from spark_jobs.table import apply_options

        if args.cpu_phases:

            class CpuClock:
                def __getattr__(self, name: str) -> Any:
                    return getattr(time, name)

                monotonic = staticmethod(cpu_seconds)

            job.time = CpuClock()  # type: ignore[assignment,attr-defined]

        spark = session(settings, "cdclake-bench")
        spark.sparkContext.setLogLevel("ERROR")
        for kv in args.conf:
            spark.conf.set(*kv.split("=", 1))
        spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {settings.catalog_name}.{settings.namespace}")
        pq.write_table(base, home / "base.parquet")

        def make_table(name: str) -> str:
            ident = table_ident(settings, name)
            spark.sql(
                f"CREATE TABLE {ident} ({KEY} string NOT NULL, id bigint, name string, amount double, status string, "
                "_cdc_seq bigint, _cdc_ts timestamp, _cdc_source string) USING iceberg"
            )
            spark.sql(f"ALTER TABLE {ident} SET IDENTIFIER FIELDS {KEY}")
            # As the job configures a new table, before any data (partition fields then cover the base rows).
            apply_options(spark, ident, spark.table(ident).schema, load_table_config(settings).for_table(name))
            spark.conf.set("spark.sql.iceberg.check-nullability", "false")  # parquet columns are all nullable
            spark.read.parquet(str(home / "base.parquet")).writeTo(ident).append()
            if args.pad_rows:
                print(f"[bench] padding {name} with {args.pad_rows} rows the batch never touches", flush=True)
                spark.range(args.pad_rows).selectExpr(
                    f"cast(id + {10**12} as string) as {KEY}",
                    f"id + {10**12} as id",
                    "concat('name-', id) as name",
                    "id * 0.5 as amount",
                    "'pad' as status",
                    "0L as _cdc_seq",
                    f"timestamp_micros({T0_MS * 1000}L) as _cdc_ts",
                    "'base' as _cdc_source",
                ).writeTo(ident).append()
            spark.conf.unset("spark.sql.iceberg.check-nullability")
            return ident

        if args.warm:
            # The default stack applies in a long-lived Spark Connect server: its JIT has compiled
            # the job's code by the time a big batch comes. A batch of the same shape (another
            # seed) applied to another table first, untimed, gives (a) that JVM.
            warm = workload(args.events, args.keys, args.base_rows, seed=2)
            stage_events(settings.staging_dir, "warm", warm, receipts=not args.no_receipts)
            make_table("warm")
            t0, c0 = time.perf_counter(), cpu_seconds()
            apply_table(spark, settings, "warm", 10_000)
            took, cpu = time.perf_counter() - t0, cpu_seconds() - c0
            print(f"[bench] warm-up apply (untimed): {took:.1f}s, cpu {cpu:.1f}s", flush=True)
        ident = make_table("bench")
        dt, res, rss = timed(lambda: apply_table(spark, settings, "bench", 10_000), "a")
        results["a"], counts["a"] = (dt, rss), spark.table(ident).count()
        print(
            f"[bench] (a) cdclake Spark apply: {dt:.1f}s, {counts['a']} rows, peak RSS {rss:.0f} MiB "
            f"{json.dumps({k: res[k] for k in ('received', 'applied', 'duplicate', 'superseded', 'late', 'phases')})}",
            flush=True,
        )
        spark.stop()

    print(f"\n{'path':<34}{'seconds':>9}{'CPU s':>8}{'events/s':>12}{'peak RSS MiB':>14}")
    names = {
        "a": "(a) cdclake Spark apply",
        "b": "(b) pyiceberg delete+append",
        "c": "(c) pyarrow floor",
        "d": "(d) DuckDB delete+insert (REST)",
        "e": "(e) DuckDB from the staged JSON",
    }
    for k in ("a", "b", "c", "d", "e"):
        if k in results:
            dt, rss = results[k]
            print(f"{names[k]:<34}{dt:>9.1f}{CPU.get(k, 0.0):>8.1f}{n_events / dt:>12,.0f}{rss:>14,.0f}")
    if "a" in results and "b" in results:
        print(f"(b)/(a) = {results['b'][0] / results['a'][0]:.2f}  (issue 16: >= 1.5, aim 3)")
    if "a" in results and "d" in results:
        print(f"(d)/(a) = {results['d'][0] / results['a'][0]:.3f}  (goal > 1: ours faster than DuckDB)")
    if "a" in results and "e" in results:
        print(f"(e)/(a) = {results['e'][0] / results['a'][0]:.3f}  (the same batch from the same objects)")
    if "a" in results and "c" in results:
        print(f"(a)/(c) = {results['a'][0] / results['c'][0]:.2f}  (issue 16: <= 8, aim 4)")
    shutil.rmtree(home, ignore_errors=True)
    if len(set(counts.values())) > 1:
        raise SystemExit(f"[bench] the paths end with different row counts: {counts}")
    print(f"[bench] every path ends with {next(iter(counts.values()), 0):,} rows")


if __name__ == "__main__":
    main()
