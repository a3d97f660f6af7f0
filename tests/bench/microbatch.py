"""Micro-batch benchmark (not a test): `make bench-microbatch` or
    .venv/bin/python -m tests.bench.microbatch [--events 30,4000] [--objects 30] [--applies 6] [--connect] [--parts]

What one small apply costs alone, the number freshness is made of: a table made from 20,000
events over 20,000 keys, then ``--applies`` micro-batches per size, each ``--objects`` staging
objects holding ``--events`` events in all (the project's workload generator,
cdclake.dev.workload: inserts, updates, deletes, some out of order), applied by
``spark_jobs.apply.apply_table`` in one warm in-process local[2] session. The sizes run side by
side: the smallest is the baseline, so ``size / baseline`` near 1 says the apply is fixed cost
(planning, Spark jobs, commits), not per-event work. Reported per size, over every apply but
the first (it warms the JVM): wall and CPU seconds (this process and the Spark JVM), the JVM's
JIT compiler threads' share of those, Spark jobs, and the mean of each phase with its Spark jobs.
``--warm N`` first applies N micro-batches of the baseline's size, untimed: a Connect server that
has applied for a while has compiled its code, and a fresh JVM's compilers take half its CPU
for the first dozens of applies (docs/benchmarks.md, "Micro-batch"). The table is checked
against the reference model at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.bench.apply import cpu_seconds

TABLE = "t"
BASE_ROWS = 20_000


class Stream:
    """One producer's batches over ``BASE_ROWS`` keys (cdclake.dev.workload.generate, numbering
    continued from call to call), all kept for the reference model."""

    def __init__(self) -> None:
        self.batches: list[dict[str, Any]] = []
        self.sequence = self.batch = 1

    def next(self, events: int, batch_size: int, seed: int) -> list[dict[str, Any]]:
        from cdclake.dev.workload import generate

        w = generate(
            seed=seed,
            events=events,
            tables=(TABLE,),
            batch_size=batch_size,
            source="bench",
            keys_per_table=BASE_ROWS,
            start_sequence=self.sequence,
            start_batch=self.batch,
            duplicate_every=0,
        )
        self.sequence += events
        self.batch += len(w.batches)
        self.batches += w.batches
        return w.batches


@contextmanager
def counting_jobs(spark: Any) -> Iterator[dict[str, int]]:
    """Spark jobs per apply phase: ``Phases.end`` also notes the jobs the tracker has seen."""
    import spark_jobs.apply as ap

    if is_remote(spark):  # a Connect client sees no jobs: none counted
        yield {}
        return
    tracker = spark.sparkContext.statusTracker()
    jobs: dict[str, int] = {}
    end, init = ap.Phases.end, ap.Phases.__init__
    seen = [0]

    def newest() -> int:
        # Job ids count up; the tracker keeps only the newest jobs (spark.ui.retainedJobs).
        return max(tracker.getJobIdsForGroup(), default=-1)

    def counted_init(self: Any) -> None:
        init(self)
        seen[0] = newest()

    def counted_end(self: Any, name: str) -> None:
        now = newest()
        jobs[name] = now - seen[0]
        seen[0] = now
        end(self, name)

    ap.Phases.__init__, ap.Phases.end = counted_init, counted_end  # type: ignore[method-assign]
    try:
        yield jobs
    finally:
        ap.Phases.__init__, ap.Phases.end = init, end  # type: ignore[method-assign]


PARTS = {
    "spark_jobs.apply": (
        "refresh_tables", "read_events", "ensure_table", "fit", "mark_seen", "decide", "account",
        "log_decisions", "commit_table", "_upkeep", "fill_defaults",
    ),
    "spark_jobs.decide": ("truncation",),  # called inside decide: a part of it
}  # fmt: skip
"""The functions ``--parts`` times, by the module they are called through."""


@contextmanager
def timing_parts() -> Iterator[dict[str, list[float]]]:
    """Wall seconds of each call of the functions in :data:`PARTS` and of ``Stage.publish``
    (phases lump some together; a Connect client sees no Spark jobs to count instead)."""
    import importlib

    from spark_jobs.stage import Stage

    times: dict[str, list[float]] = {}
    undo: list[tuple[Any, str, Any]] = []

    def wrap(owner: Any, name: str) -> None:
        f = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return f(*args, **kwargs)
            finally:
                times.setdefault(name, []).append(time.perf_counter() - t0)

        undo.append((owner, name, f))
        setattr(owner, name, timed)

    for module, names in PARTS.items():
        for name in names:
            wrap(importlib.import_module(module), name)
    wrap(Stage, "publish")
    try:
        yield times
    finally:
        for owner, name, f in reversed(undo):
            setattr(owner, name, f)


def is_remote(spark: Any) -> bool:
    return type(spark).__module__.startswith("pyspark.sql.connect")


def jit_seconds(pid: int) -> float:
    """CPU seconds so far of the JIT compiler threads (C1, C2) of the JVM ``pid`` (Linux /proc)."""
    total = 0.0
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            if "CompilerThre" not in (task / "comm").read_text():
                continue
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # the thread ended
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


@contextmanager
def connect_server(settings: Any) -> Iterator[tuple[Any, int]]:
    """The default stack's apply: a Spark Connect server started as ``cdclake up`` starts it (its
    command and environment), on a free loopback port, and a session on it; (session, its pid)."""
    import socket
    import subprocess
    import sys

    import pyspark

    from cdclake.lake.spark import connect_server_command, connect_server_env, connect_session, connect_token

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {
        "SPARK_HOME": str(Path(pyspark.__file__).parent),
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        **os.environ,
        "SPARK_LOCAL_IP": "127.0.0.1",
        **connect_server_env(settings),
    }
    with (Path(settings.home) / "connect.log").open("w") as log:
        proc = subprocess.Popen(
            connect_server_command(settings, port=port), env=env, stdout=log, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + 300
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the Spark Connect server did not start: {settings.home}/connect.log")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                break
            time.sleep(0.5)
        spark = connect_session(f"sc://127.0.0.1:{port}", connect_token(settings))
        try:
            yield spark, proc.pid
        finally:
            spark.stop()  # while the server is up: its release calls would retry for minutes after
    finally:
        proc.terminate()
        proc.wait(60)


def run(
    sizes: list[int], objects: int, applies: int, conf: tuple[str, ...] = (), warm: int = 0, connect: bool = False
) -> list[dict[str, Any]]:
    from cdclake.config.settings import load
    from cdclake.lake.spark import session

    home = Path(tempfile.mkdtemp(prefix="cdclake-microbatch-"))
    settings = load({"CDCLAKE_HOME": str(home)})
    os.environ.update(settings.as_env())
    if connect:
        with connect_server(settings) as (spark, pid):
            return measure(spark, pid, settings, sizes, objects, applies, conf, warm)
    spark = session(settings, "cdclake-bench-microbatch")
    pid = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()  # type: ignore[union-attr]
    try:
        return measure(spark, pid, settings, sizes, objects, applies, conf, warm)
    finally:
        spark.stop()


def measure(
    spark: Any,
    jvm: int,
    settings: Any,
    sizes: list[int],
    objects: int,
    applies: int,
    conf: tuple[str, ...],
    warm: int,
) -> list[dict[str, Any]]:
    """The applies, timed, on ``spark`` (whose driver JVM is ``jvm``)."""
    from spark_jobs.apply import apply_table
    from tests.support import stage

    for kv in conf:
        spark.conf.set(*kv.split("=", 1))
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {settings.catalog_name}.{settings.namespace}")
    w = Stream()
    stage(settings, w.next(BASE_ROWS, BASE_ROWS // 10, seed=0))
    apply_table(spark, settings, TABLE, 1000)
    for i in range(warm):
        stage(settings, w.next(sizes[0], max(1, sizes[0] // objects), seed=10_000 + i))
        apply_table(spark, settings, TABLE, 1000)
    out = []
    with counting_jobs(spark) as jobs:
        for size in sizes:
            rows = []
            for i in range(applies):
                stage(settings, w.next(size, max(1, size // objects), seed=size + i))
                t0, c0, j0 = time.perf_counter(), cpu_seconds(), jit_seconds(jvm)
                r = apply_table(spark, settings, TABLE, 1000)
                rows.append(
                    {"wall": time.perf_counter() - t0, "cpu": cpu_seconds() - c0, "phases": r["phases"]}
                    | {"jit": jit_seconds(jvm) - j0}
                    | {"jobs": dict(jobs), "events": r["received"]}
                )
            out.append({"size": size, "applies": rows[1:]})
            print(f"[microbatch] {size} events: {[round(r['wall'], 2) for r in rows]} s", flush=True)
    check(spark, settings, w.batches)
    return out


def check(spark: Any, settings: Any, batches: list[dict[str, Any]]) -> None:
    """Exits unless the bench table is what the reference model makes of ``batches``."""
    from cdclake.dev.reference import diff, expected_tables, rows_by_key
    from cdclake.lake.spark import table_ident

    problems = diff(expected_tables(batches)[TABLE], rows_by_key(spark.table(table_ident(settings, TABLE)).collect()))
    if problems:
        raise SystemExit(f"the table differs from the reference model: {problems[:3]}")


def report(results: list[dict[str, Any]]) -> None:
    base = statistics.fmean(r["wall"] for r in results[0]["applies"])
    print("\nmeans over the applies after the first")
    print(f"{'events':>8}{'wall s':>9}{'cpu s':>8}{'jit s':>7}{'jobs':>6}{'x base':>8}")
    for res in results:
        a = res["applies"]
        wall = statistics.fmean(r["wall"] for r in a)
        cpu = statistics.fmean(r["cpu"] for r in a)
        jit = statistics.fmean(r["jit"] for r in a)
        jobs = statistics.fmean(sum(r["jobs"].values()) for r in a)
        print(f"{res['size']:>8}{wall:>9.2f}{cpu:>8.2f}{jit:>7.2f}{jobs:>6.0f}{wall / base:>8.2f}")
    for res in results:
        print(f"\n{res['size']} events: phase  mean s  Spark jobs")
        for phase in res["applies"][0]["phases"]:
            secs = statistics.fmean(r["phases"].get(phase, 0.0) for r in res["applies"])
            print(f"  {phase:<12}{secs:>7.2f}{res['applies'][0]['jobs'].get(phase, 0):>6}")
    print("\nthe table matches the reference model")


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument(
        "--events", default="30,4000", help="events per micro-batch, comma-separated; the first is the baseline"
    )
    ap.add_argument("--objects", type=int, default=30, help="staging objects per micro-batch")
    ap.add_argument("--applies", type=int, default=6, help="micro-batches per size (the first is not counted)")
    ap.add_argument(
        "--conf", action="append", default=[], help="a Spark SQL conf for the session: KEY=VALUE, repeatable"
    )
    ap.add_argument("--warm", type=int, default=0, help="untimed micro-batches of the baseline's size first")
    ap.add_argument(
        "--connect", action="store_true", help="apply through a Spark Connect server, as the default stack does"
    )
    ap.add_argument(
        "--parts", action="store_true", help="also time the apply's functions (PARTS) over the last size's applies"
    )
    args = ap.parse_args()
    sizes = [int(s) for s in args.events.split(",") if s.strip()]
    applies = max(2, args.applies)
    timing: contextlib.AbstractContextManager[dict[str, list[float]]] = (
        timing_parts() if args.parts else contextlib.nullcontext({})
    )
    with timing as parts:
        results = run(sizes, args.objects, applies, tuple(args.conf), args.warm, args.connect)
    report(results)
    if parts:
        print(f"\n{sizes[-1]} events: part  median s over its {applies} applies")
        for name, calls in sorted(parts.items(), key=lambda kv: -statistics.median(kv[1][-applies:])):
            print(f"  {name:<15}{statistics.median(calls[-applies:]):>7.3f}")


if __name__ == "__main__":
    main()
