"""Subscribe lag benchmark (not a test): `make bench-subscribe` or
    .venv/bin/python -m tests.bench.subscribe [--applies 20] [--events 200] [--subscribers 1]

How long after the commit that makes a change visible a subscriber has it: a table of 2,000
rows, then ``--applies`` micro-batches of ``--events`` events (the project's workload generator)
applied one after another by ``spark_jobs.apply.apply_table`` in an in-process local[2] session,
while ``--subscribers`` lake clients (cdclake.client.lake, ``subscribe(since="now")`` over
``GET /v1/subscribe``) listen to the REST catalog's server (uvicorn in this process, 127.0.0.1).
An apply's commit time is its table snapshot's ``timestamp-ms`` (the commit that makes its changes
visible, :mod:`cdclake.lake.changes`); its lag is when its last change reached a subscriber
minus that. Reported: p50 / p95 / max lag over every apply and subscriber, the first change's
lag beside the last's, and the CPU seconds of this process (server, subscribers and Spark driver)
and the Spark JVM. Every subscriber must receive exactly the applied changes the feed's page
holds, in order, or the run fails.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from tests.bench.apply import cpu_seconds
from tests.bench.microbatch import TABLE, Stream


class Listener(threading.Thread):
    """One subscriber: every change it gets, with the wall time it got it."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url, self.stop = url, threading.Event()
        self.got: list[tuple[float, dict[str, Any]]] = []

    def run(self) -> None:
        from cdclake.client import lake

        with lake.connect(self.url) as db:
            for change in db.subscribe([TABLE], since="now", reconnect_s=0.1):
                self.got.append((time.time(), change))
                if self.stop.is_set():
                    return


def lags(
    commits: list[tuple[set[tuple[str, int]], float]], got: list[tuple[float, dict[str, Any]]]
) -> list[tuple[float, float]]:
    """(first, last) change's lag in seconds per apply: ``commits`` holds each apply's events and
    its commit time."""
    out = []
    for events, at in commits:
        times = [t for t, c in got if (c["source"], c["sequence"]) in events]
        if times:
            out.append((min(times) - at, max(times) - at))
    return out


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * q))]


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--applies", type=int, default=20)
    ap.add_argument("--events", type=int, default=200)
    ap.add_argument("--subscribers", type=int, default=1)
    args = ap.parse_args()

    from cdclake.config.settings import load
    from cdclake.lake import changes
    from cdclake.lake.catalog import load_table
    from cdclake.lake.spark import session
    from spark_jobs.apply import apply_table
    from tests.support import stage
    from tests.support.rest import serve

    home = Path(tempfile.mkdtemp(prefix="cdclake-bench-subscribe-"))
    settings = load({"CDCLAKE_HOME": str(home)})
    os.environ.update(settings.as_env())
    spark = session(settings, "cdclake-bench-subscribe")
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {settings.catalog_name}.{settings.namespace}")
    w = Stream()
    stage(settings, w.next(2000, 200, seed=0))
    apply_table(spark, settings, TABLE, 1000)
    commits: list[tuple[set[tuple[str, int]], float]] = []
    with serve(settings) as (url, _app):
        listeners = [Listener(url) for _ in range(args.subscribers)]
        for li in listeners:
            li.start()
        time.sleep(2)  # each has its start event: since=now is before the first apply below
        c0 = cpu_seconds()
        for i in range(args.applies):
            batches = w.next(args.events, max(1, args.events // 4), seed=100 + i)
            stage(settings, batches)
            apply_table(spark, settings, TABLE, 1000)
            t = load_table(settings, TABLE)
            snap = t.current_snapshot() if t is not None else None
            assert snap is not None
            commits.append(
                ({(b["source"], e["sequence"]) for b in batches for e in b["events"]}, snap.timestamp_ms / 1000)
            )
            time.sleep(0.3)  # a steady stream, not back-to-back commits
        time.sleep(3)
        cpu = cpu_seconds() - c0
        for li in listeners:
            li.stop.set()
    whole = changes.read_changes(settings, TABLE, None, changes.OPERATIONS, 1_000_000)
    after_base = [c for c in whole if any((c.source, c.sequence) in ev for ev, _ in commits)]
    first: list[float] = []
    last: list[float] = []
    for li in listeners:
        got = [c for _, c in li.got]
        want = [(c.source, c.sequence) for c in after_base]
        if [(c["source"], c["sequence"]) for c in got] != want:
            raise SystemExit(f"a subscriber got {len(got)} changes, the feed holds {len(want)} (or another order)")
        for a, b in lags(commits, li.got):
            first.append(a)
            last.append(b)
    spark.stop()
    print(
        f"\n{args.applies} applies of {args.events} events, {args.subscribers} subscriber(s), "
        f"{len(after_base)} changes delivered to each"
    )
    for name, xs in (("first change of a commit", first), ("last change of a commit", last)):
        print(f"lag, {name:<26} p50 {statistics.median(xs):5.2f} s  p95 {pct(xs, 0.95):5.2f} s  max {max(xs):5.2f} s")
    print(f"CPU seconds while applying and streaming (this process + Spark JVM): {cpu:.1f}")


if __name__ == "__main__":
    main()
