"""Freshness benchmark (not a test): `make bench-freshness` or
    .venv/bin/python -m tests.bench.freshness [--modes connect,connect-tasks3,submit] [--seconds 120] [--rate 1000]
        [--sparse-every 20]

The embedded stack (receiver + Airflow scheduler on SQLite + Spark local) with Airflow in the loop:
producers send a steady ``--rate`` events/s over 3 tables through the real receiver; ``cdc_apply``
runs on the receiver's Asset events. For every acked batch and table, the latency is

    ack received by the producer  ->  commit of the first Iceberg snapshot of that table whose
                                      consumed-staging watermark holds the batch's object

i.e. from then on a new Spark SQL query sees the batch's effect (the commit IS visibility; the
end of the run checks the tables against the reference model through Spark SQL).

Each mode is one fresh stack, measured side by side in the same run:

* ``connect``: jobs run in sessions on a long-lived Spark Connect server (the default), each apply
  task draining (``CDCLAKE_APPLY_DRAIN_S``, 120 s), the tables in ``CDCLAKE_APPLY_TASKS`` tasks
  (auto: one on local[2]);
* ``-tasksN`` (e.g. ``connect-tasks3``, one task per table): ``CDCLAKE_APPLY_TASKS=N``;
* ``-nodrain`` (e.g. ``connect-tasks3-nodrain``): ``CDCLAKE_APPLY_DRAIN_S=0``, one pass per DAG run;
* ``-drainS`` (e.g. ``connect-drain30``): ``CDCLAKE_APPLY_DRAIN_S=S``, a handover to the next run every S s;
* ``submit``: one ``spark-submit`` (a fresh driver JVM) per task, draining.

``--sparse-every S``: a fourth table gets a batch of 5 events every S seconds from 30 s into the
load on, when the busy tables' run is already draining; its latencies are printed apart.

Printed per mode: p50/p95/p99/max latency, also per 30 s of load by ack time (a fresh Spark JVM
compiles for minutes); where the time goes, averaged over the apply runs: waiting for a run,
plan task, mapped-task start (executor + process + Spark session or JVM), the job's phases (list,
read, fit, classify, count, side tables, merge = MERGE + commit); and the CPU seconds of each
component of the stack from the load's start to its last run's end (tests.bench.cputree).
"""

from __future__ import annotations

import argparse
import random
import re
import statistics
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from cdclake.client import Producer
from cdclake.config.settings import load
from cdclake.contracts.watermark import SUMMARY_KEY, Watermark
from cdclake.dev.stack import LocalStack, free_port
from cdclake.lake.catalog import load_table
from cdclake.staging import stores
from tests.bench import cputree

TABLES = ("customers", "orders", "products")
SPARSE = "sparse"
"""With ``--sparse-every S``, a fourth table that gets one small batch every S seconds, its
latency reported apart: a table that is quiet when a run is planned (cdclake.orchestration.apply_plan)."""
SPARSE_AFTER_S = 30.0


def _ts(value: str | None) -> float | None:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() if value else None


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(p / 100 * len(s)) - 1))] if s else float("nan")


class Load:
    """``sources`` producer threads, each sending a batch every ``1 / batches_per_s`` seconds,
    its events over ``tables`` in turn."""

    def __init__(
        self,
        url: str,
        rate: float,
        sources: int,
        batches_per_s: float,
        keys: int,
        seed: int = 7,
        tables: tuple[str, ...] = TABLES,
    ) -> None:
        # --rate 0: no busy tables (with --sparse-every, the sparse table alone: a quiet lake).
        self.url, self.sources, self.keys, self.tables = url, sources if rate > 0 else 0, keys, tables
        self.per_batch = max(1, round(rate / sources / batches_per_s))
        self.interval = 1.0 / batches_per_s
        self.acked: list[tuple[str, int, float, int]] = []  # source, batch seq, ack wall time, events
        self.sent: list[dict[str, Any]] = []  # batches as acked, for the reference model
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._seed = seed

    def _run(self, n: int) -> None:
        rng = random.Random(self._seed + n)
        source = f"bench{self._seed}-{n}"
        alive: dict[tuple[str, str], bool] = {}
        seq = 0
        next_at = time.monotonic()
        with Producer(self.url, source, batch_size=100_000, start_sequence=1) as p:
            while not self._stop.is_set():
                events = []
                for _ in range(self.per_batch):
                    seq += 1
                    table = self.tables[seq % len(self.tables)]
                    key = str(rng.randrange(self.keys))
                    exists = alive.get((table, key), False)
                    r = rng.random()
                    if exists and r < 0.07:
                        op, after = "DELETE", None
                        alive[(table, key)] = False
                    else:
                        op = "UPDATE" if exists else "INSERT"
                        after = {"id": int(key), "n": seq, "label": f"{table}-{key}-{seq}", "amount": seq + 0.5}
                        alive[(table, key)] = True
                    events.append(
                        {"sequence": seq, "timestamp": int(time.time() * 1000), "operation": op}
                        | {"table": table, "rowId": key, "after": after}
                    )
                try:
                    ack = p.send_events(events)
                except Exception as exc:  # recorded, the run goes on: a lost ack is a finding
                    self.errors.append(f"{source}: {exc}")
                    continue
                now = time.time()
                with self._lock:
                    self.acked.append((source, ack.sequence_number, now, len(events)))
                    self.sent.append({"source": source, "sequenceNumber": ack.sequence_number, "events": events})
                next_at += self.interval
                time.sleep(max(0.0, next_at - time.monotonic()))

    def run_for(self, seconds: float, after: float = 0.0) -> None:
        time.sleep(after)
        threads = [threading.Thread(target=self._run, args=(n,), daemon=True) for n in range(self.sources)]
        for t in threads:
            t.start()
        time.sleep(seconds)
        self._stop.set()
        for t in threads:
            t.join(timeout=60)


def visible_at(settings: Any) -> dict[tuple[str, str, int], float]:
    """(table, source, batch seq) -> wall time of the commit whose watermark first holds it."""
    store = stores.open_store(settings)
    out: dict[tuple[str, str, int], float] = {}
    for table in (*TABLES, SPARSE):
        t = load_table(settings, table)
        if t is None:
            continue
        snaps = sorted(t.metadata.snapshots, key=lambda s: s.timestamp_ms)
        marks = [
            (s.timestamp_ms / 1000, Watermark.decode(s.summary.additional_properties[SUMMARY_KEY]))
            for s in snaps
            if s.summary is not None and SUMMARY_KEY in s.summary.additional_properties
        ]
        for k in store.list(table):
            for at, wm in marks:
                if wm.consumed(k.name):
                    out[(table, k.source, k.batch_sequence)] = at
                    break
    return out


def breakdown(stack: LocalStack, since: float) -> tuple[dict[str, float], int, list[tuple[float, float, str]]]:
    """Mean seconds per part of the cdc_apply runs started after ``since``; and the apply task
    windows (start, end, table) to tell which run made a batch visible."""
    api = stack.airflow
    runs = api.json("GET", "/api/v2/dags/cdc_apply/dagRuns", params={"limit": 1000, "order_by": "-start_date"})
    parts: dict[str, list[float]] = {}
    windows: list[tuple[float, float, str]] = []

    def add(name: str, value: float | None) -> None:
        if value is not None:
            parts.setdefault(name, []).append(value)

    n = batches = 0
    for r in runs["dag_runs"]:
        start, end = _ts(r.get("start_date")), _ts(r.get("end_date"))
        # A draining run may have started before ``since`` (in the warm-up) and run on through the load.
        if start is None or end is None or end < since or r.get("state") != "success":
            continue
        n += 1
        add("run: queued -> started", start - (_ts(r.get("queued_at")) or start))
        tis = stack.airflow.task_instances("cdc_apply", r["dag_run_id"])
        plan = next((t for t in tis if t["task_id"] == "plan"), None)
        applies = [t for t in tis if t["task_id"] == "apply" and t.get("start_date") and t.get("end_date")]
        if plan and plan.get("end_date"):
            add("plan task", (_ts(plan["end_date"]) or 0) - (_ts(plan["start_date"]) or 0))
        for ti in applies:
            t0, t1 = _ts(ti["start_date"]) or 0, _ts(ti["end_date"]) or 0
            if plan and plan.get("end_date"):
                add("apply queued after plan", t0 - (_ts(plan["end_date"]) or t0))
            x = api.request(
                "GET",
                f"/api/v2/dags/cdc_apply/dagRuns/{r['dag_run_id']}/taskInstances/apply/xcomEntries/return_value",
                params={"map_index": ti["map_index"]},
            )
            value = x.json().get("value") if x.status_code == 200 else None
            # A draining task returns {"runs": [...], "passes": n}: one result per micro-batch.
            items = value.get("runs", [value]) if isinstance(value, dict) else []
            jobs = [j for j in items if isinstance(j, dict) and j.get("seconds") is not None]
            if jobs:
                add("apply: task start + session", (t1 - t0) - sum(j["seconds"] for j in jobs))
                for j in jobs:
                    batches += 1
                    for phase, secs in (j.get("phases") or {}).items():
                        add(f"job: {phase}", secs)
                    windows.append((t0, t1, str(j.get("table"))))
            else:
                add("apply task (whole)", t1 - t0)
    means = {k: statistics.fmean(v) for k, v in parts.items()}
    means["micro-batches applied (count)"] = batches
    return means, n, windows


def latencies(
    load_: Load, seen: dict[tuple[str, str, int], float], since: float
) -> tuple[list[tuple[float, float]], int]:
    """(seconds since the load began, latency) per acked batch and table; how many never became visible."""
    timed: list[tuple[float, float]] = []
    missing = 0
    tables_of = _tables_per_batch(load_)
    for source, seq, acked_at, _ in load_.acked:
        for table in tables_of[(source, seq)]:
            at = seen.get((table, source, seq))
            if at is None:
                missing += 1
            else:
                timed.append((acked_at - since, max(0.0, at - acked_at)))
    return timed, missing


def run_mode(
    mode: str, seconds: float, rate: int, sources: int, batches_per_s: float, keys: int, sparse_every: float = 0
) -> dict[str, Any]:
    home = Path(tempfile.mkdtemp(prefix=f"cdclake-fresh-{mode}-"))
    url = f"sc://127.0.0.1:{free_port()}" if mode.startswith("connect") else ""
    settings = load(
        {"CDCLAKE_HOME": str(home)},
        receiver_port=free_port(),
        airflow_port=free_port(),
        spark_connect_url=url,
        query_spark_connect_url="",  # no queries here: no query server
        # "-nodrain": one pass per DAG run, as before CDCLAKE_APPLY_DRAIN_S (the baseline); "-drainS":
        # CDCLAKE_APPLY_DRAIN_S=S (how often a draining task hands over to the next DAG run).
        **({"apply_drain_s": 0} if mode.endswith("-nodrain") else {}),
        **({"apply_drain_s": int(m.group(1))} if (m := re.search(r"-drain(\d+)", mode)) else {}),
        # "-tasksN": the tables in N apply tasks (CDCLAKE_APPLY_TASKS), each applying its group in turn.
        **({"apply_tasks": int(m.group(1))} if (m := re.search(r"-tasks(\d+)", mode)) else {}),
        # No producer here is rate limited: the benchmark sets the rate.
        rate_limit_per_s=0.0,
    )
    print(f"[fresh] {mode}: starting the stack in {home}", flush=True)
    with LocalStack(settings) as stack:
        stack.airflow.wait_dag("cdc_apply")
        stack.airflow.unpause("cdc_apply")
        # Warm-up: the first run pays table creation (and, for connect, the server's first job).
        warm = Load(settings.receiver_url, rate, sources, batches_per_s, keys, seed=99)
        warm.run_for(5)
        _wait_applied(stack, settings, warm, timeout=300)
        load_ = Load(settings.receiver_url, rate, sources, batches_per_s, keys)
        # 5 events per batch on the sparse table, one batch every ``sparse_every`` seconds.
        sparse = Load(settings.receiver_url, 5 / (sparse_every or 1), 1, 1 / (sparse_every or 1), keys, 55, (SPARSE,))
        since, cpu0 = time.time(), cputree.snapshot(cputree.components(stack))
        print(f"[fresh] {mode}: {rate} events/s for {seconds:.0f}s", flush=True)
        # Its first batch lands 30 s into the load: when the busy tables' run is already draining.
        beside = threading.Thread(target=sparse.run_for, args=(max(0.0, seconds - SPARSE_AFTER_S), SPARSE_AFTER_S))
        if sparse_every:
            beside.start()
        load_.run_for(seconds)
        if sparse_every:
            beside.join(timeout=120)
        _wait_applied(stack, settings, load_, timeout=600)
        _wait_applied(stack, settings, sparse, timeout=600)
        seen = visible_at(settings)
        _wait_runs_end(stack, timeout=300)  # a draining run ends after a pass that finds nothing
        cpu, cpu_window = cputree.spent(cpu0, cputree.snapshot(cputree.components(stack))), time.time() - since
        parts, runs, _ = breakdown(stack, since)
        timed, missing = latencies(load_, seen, since)
        sparse_timed, sparse_missing = latencies(sparse, seen, since)
        lat = [v for _, v in timed]
        problems = _check(settings, warm.sent + load_.sent + sparse.sent)
    events = sum(a[3] for a in load_.acked)
    return {
        "mode": mode,
        "events": events,
        "rate": events / seconds,
        "samples": len(lat),
        "missing": missing + sparse_missing,
        "errors": (load_.errors + sparse.errors)[:3],
        "sparse": [v for _, v in sparse_timed],
        "p50": pct(lat, 50),
        "p95": pct(lat, 95),
        "p99": pct(lat, 99),
        "max": max(lat) if lat else float("nan"),
        "windows": by_window(timed, WINDOW_S),
        "runs": runs,
        "parts": parts,
        "problems": problems,
        "cpu": (cpu, cpu_window),
    }


WINDOW_S = 30.0


def by_window(timed: list[tuple[float, float]], width: float) -> list[tuple[float, float, float]]:
    """(window start, p50, p95) of the latencies per ``width`` seconds of load, by ack time."""
    out = []
    for i in range(int(max((t for t, _ in timed), default=0) // width) + 1):
        lat = [v for t, v in timed if i * width <= t < (i + 1) * width]
        if lat:
            out.append((i * width, pct(lat, 50), pct(lat, 95)))
    return out


def _tables_per_batch(load_: Load) -> dict[tuple[str, int], set[str]]:
    return {(b["source"], b["sequenceNumber"]): {e["table"] for e in b["events"]} for b in load_.sent}


def _wait_applied(stack: LocalStack, settings: Any, load_: Load, timeout: float) -> None:
    want = {(t, s, q) for (s, q), ts in _tables_per_batch(load_).items() for t in ts}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if want <= set(visible_at(settings)):
            return
        time.sleep(2)
    raise RuntimeError(f"not everything applied after {timeout:.0f}s")


def _wait_runs_end(stack: LocalStack, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while stack.airflow.active_runs("cdc_apply") and time.monotonic() < deadline:
        time.sleep(2)


def _check(settings: Any, batches: list[dict[str, Any]]) -> list[str]:
    """The tables through Spark SQL against the reference model (a fresh in-process session)."""
    from cdclake.dev.reference import diff, expected_tables, rows_by_key
    from cdclake.lake.spark import session, table_ident

    spark = session(settings, "cdclake-bench-check")
    try:
        out = []
        for table, want in expected_tables(batches).items():
            got = rows_by_key(spark.table(table_ident(settings, table)).collect())
            out += [f"{table}: {d}" for d in diff(want, got)[:3]]
        return out
    finally:
        spark.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--modes", default="connect,connect-tasks3,connect-tasks3-nodrain")
    ap.add_argument("--seconds", type=float, default=120)
    ap.add_argument("--rate", type=int, default=1000, help="events/s from all producers together (0: none)")
    ap.add_argument("--sources", type=int, default=2)
    ap.add_argument("--batches-per-s", type=float, default=2.0, help="per source")
    ap.add_argument("--keys", type=int, default=20_000, help="per table")
    ap.add_argument("--sparse-every", type=float, default=0, help="seconds between batches to a 4th table (0: none)")
    args = ap.parse_args()
    results = []
    for m in [m.strip() for m in args.modes.split(",") if m.strip()]:
        r = run_mode(m, args.seconds, args.rate, args.sources, args.batches_per_s, args.keys, args.sparse_every)
        print(f"[fresh] {m}: p50 {r['p50']:.1f}s p95 {r['p95']:.1f}s parts {r['parts']}", flush=True)
        results.append(r)
    print(f"\n{'mode':<16}{'events/s':>9}{'batches':>9}{'p50 s':>8}{'p95 s':>8}{'p99 s':>8}{'max s':>8}{'runs':>6}")
    for r in results:
        print(
            f"{r['mode']:<16}{r['rate']:>9.0f}{r['samples']:>9}{r['p50']:>8.1f}{r['p95']:>8.1f}"
            f"{r['p99']:>8.1f}{r['max']:>8.1f}{r['runs']:>6}"
        )
    print("goal (issue 32): p50 <= 3 s, p95 <= 6 s")
    for r in results:
        print(f"\n{r['mode']}: mean seconds per part of an apply run ({r['runs']} runs)")
        for k, v in r["parts"].items():
            print(f"  {k:<34}{v:>7.2f}")
        shown = ", ".join(f"{t:.0f}s: {a:.1f}/{b:.1f}" for t, a, b in r["windows"])
        print(f"  p50/p95 per {WINDOW_S:.0f} s of load, by ack time: {shown}")
        if lat := r["sparse"]:
            print(
                f"  {SPARSE} (a batch every {args.sparse_every:.0f} s, {len(lat)} batches): p50 {pct(lat, 50):.1f}s"
                f" p95 {pct(lat, 95):.1f}s max {max(lat):.1f}s; each: {' '.join(f'{v:.0f}' for v in lat)}"
            )
        print(f"  CPU from the load's start to its last run's end ({r['cpu'][1]:.0f} s, bench = producers):")
        print("\n".join(cputree.report(r["cpu"][0], r["events"], "   ")))
        if r["missing"] or r["errors"] or r["problems"]:
            print(f"  !! missing {r['missing']} errors {r['errors']} divergence {r['problems']}")
        else:
            print("  every acked batch visible; tables match the reference model (Spark SQL)")
    a = results[0] if results else None
    for b in results[1:]:
        if a and a["p50"] and b["p50"]:
            print(f"\n{b['mode']}/{a['mode']}: p50 {b['p50'] / a['p50']:.2f}x, p95 {b['p95'] / a['p95']:.2f}x")


if __name__ == "__main__":
    main()
