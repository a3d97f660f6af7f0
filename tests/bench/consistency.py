"""Consistent publish benchmark (not a test): `make bench-consistency` or
    .venv/bin/python -m tests.bench.consistency [--microbatches 10] [--transactions 200] [--objects 30]

What publishing several tables in one catalog commit costs against applying each table alone.
One deterministic stream of source transactions over three tables (each transaction writes one
``orders`` row, one to four ``order_lines`` rows and updates one ``stock`` row; transactions
straddle the producer's batches, a micro-batch ends on a transaction's END), landed as
micro-batches of ``--objects`` staging objects holding ``--transactions`` transactions, and
applied in two modes side by side, each in a namespace and staging folder of its own, in ONE warm
in-process local[2] session: ``on`` (consistent_publish on: ``apply_together`` of the three
tables, one run and one publish per micro-batch) and ``off`` (``apply_table`` of each table in
turn, a publish each). The modes alternate which goes first from one micro-batch to the next, so
they share the machine's noise. The first micro-batch (and the stock rows' load) warms up each
mode and is not counted.

Reported per mode: wall seconds per micro-batch (from the apply's start until every table shows
it), events/s, CPU seconds (this process and the Spark JVM), the catalog commits that publish
(calls of ``publish_tables`` and the tables each moved, counted by wrapping
``spark_jobs.stage.publish_tables``), and landing -> visible (the micro-batch's first object
landing until the publish that made its last table show it) p50/p95; then on / off. At the end
every table of both modes is checked against the reference model, and the ``on`` tables' current
snapshots against the position of the last transaction.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.bench.apply import cpu_seconds

SOURCE = "shop"
TABLES = ("orders", "order_lines", "stock")
SKUS = 500
MAX_OBJECTS = 1000
T0_MS = 1_767_225_600_000


class Shop:
    """A shop's source transactions, numbered on from call to call (deterministic in ``seed``),
    every batch kept for the reference model."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.sequence = self.batch = self.order = self.tx = 0
        self.on_hand = dict.fromkeys(range(SKUS), 1000)
        self.batches: list[dict[str, Any]] = []

    def _event(self, table: str, op: str, key: str, after: dict[str, Any], tx: str) -> dict[str, Any]:
        self.sequence += 1
        return {
            "sequence": self.sequence,
            "timestamp": T0_MS + self.sequence,
            "operation": op,
            "table": table,
            "rowId": key,
            "after": after,
            "transaction": {"id": tx},
        }

    def _transaction(self) -> tuple[str, list[dict[str, Any]], str]:
        """One order: its row, its lines, one stock update (id, events, END position)."""
        self.tx += 1
        self.order += 1
        tx, o = f"tx{self.tx}", f"o{self.order}"
        lines: list[dict[str, Any]] = []
        for n in range(self.rng.randint(1, 4)):
            sku, qty = self.rng.randrange(SKUS), self.rng.randint(1, 5)
            lines.append({"order_id": o, "line": n + 1, "sku": f"s{sku}", "qty": qty, "amount": qty * (sku % 50 + 1)})
        customer = f"c{self.rng.randrange(2000)}"
        evs = [self._event("orders", "INSERT", o, {"customer": customer, "total": sum(x["amount"] for x in lines)}, tx)]
        evs += [self._event("order_lines", "INSERT", f"{o}-{x['line']}", x, tx) for x in lines]
        sku = int(lines[0]["sku"][1:])
        self.on_hand[sku] -= lines[0]["qty"]
        evs.append(self._event("stock", "UPDATE", f"s{sku}", {"sku": f"s{sku}", "on_hand": self.on_hand[sku]}, tx))
        return tx, evs, str(1_000_000 + self.tx * 100)

    def _batches(self, transactions: list[tuple[str, list[dict[str, Any]], str]], n: int) -> list[dict[str, Any]]:
        """The transactions' events cut into ``n`` batches of about the same size, whatever the
        transactions' boundaries: BEGIN with a transaction's first event, END with its last."""
        flat = [(tx, i, len(evs), ev) for tx, evs, _ in transactions for i, ev in enumerate(evs)]
        ends = {tx: (evs, pos) for tx, evs, pos in transactions}
        out = []
        for b in range(n):
            chunk = flat[b * len(flat) // n : (b + 1) * len(flat) // n]
            markers: list[dict[str, Any]] = []
            for tx, i, count, _ in chunk:
                if i == 0:
                    markers.append({"id": tx, "status": "BEGIN"})
                if i == count - 1:
                    evs, pos = ends[tx]
                    tables: dict[str, int] = {}
                    for ev in evs:
                        tables[ev["table"]] = tables.get(ev["table"], 0) + 1
                    markers.append({"id": tx, "status": "END", "eventCount": count, "tables": tables, "position": pos})
            self.batch += 1
            out.append(
                {
                    "source": SOURCE,
                    "sequenceNumber": self.batch,
                    "events": [c[3] for c in chunk],
                    "transactions": markers,
                }
            )
        self.batches += out
        return out

    def stock(self) -> list[dict[str, Any]]:
        """Every stock row, inserted by one transaction."""
        self.tx += 1
        tx = f"tx{self.tx}"
        evs = [
            self._event("stock", "INSERT", f"s{k}", {"sku": f"s{k}", "on_hand": v}, tx) for k, v in self.on_hand.items()
        ]
        return self._batches([(tx, evs, str(1_000_000 + self.tx * 100))], 1)

    def microbatch(self, transactions: int, objects: int) -> list[dict[str, Any]]:
        return self._batches([self._transaction() for _ in range(transactions)], max(1, objects // len(TABLES)))

    @property
    def position(self) -> str:
        return str(1_000_000 + self.tx * 100)


@dataclass
class Mode:
    name: str
    settings: Any
    apply: Callable[[], list[dict[str, Any]]]
    rows: list[dict[str, Any]] = field(default_factory=list)


@contextmanager
def counting_publishes() -> Iterator[list[tuple[float, float, list[str]]]]:
    """Every ``publish_tables`` call of the apply: (started, ended, the tables it moved)."""
    from unittest import mock

    from cdclake.lake.publish import publish_tables as publish

    calls: list[tuple[float, float, list[str]]] = []

    def counted(settings: Any, moves: Any) -> Any:
        t0 = time.perf_counter()
        out = publish(settings, moves)
        calls.append((t0, time.perf_counter(), sorted(moves)))
        return out

    with mock.patch("spark_jobs.stage.publish_tables", counted):
        yield calls


def run(microbatches: int, transactions: int, objects: int, seed: int) -> tuple[list[Mode], int]:
    from cdclake.contracts.watermark import positions_of
    from cdclake.dev.reference import diff, expected_tables
    from cdclake.lake.catalog import load_table
    from cdclake.lake.spark import session, table_ident
    from spark_jobs.apply import apply_table, apply_together
    from tests.support import fresh_settings, make_settings, stage, table_rows

    home = Path(tempfile.mkdtemp(prefix="cdclake-consistency-"))
    base = make_settings(home)
    os.environ.update(base.as_env())
    spark = session(base, "cdclake-bench-consistency")
    spark.sparkContext.setLogLevel("ERROR")
    on, off = fresh_settings(home, consistent_publish=True), fresh_settings(home, consistent_publish=False)
    modes = [
        Mode("on", on, lambda: apply_together(spark, on, list(TABLES), MAX_OBJECTS)),
        Mode("off", off, lambda: [apply_table(spark, off, t, MAX_OBJECTS) for t in TABLES]),
    ]
    for m in modes:
        spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {m.settings.catalog_name}.{m.settings.namespace}")
    shop = Shop(seed)
    work = [shop.stock() + shop.microbatch(transactions, objects)]
    work += [shop.microbatch(transactions, objects) for _ in range(microbatches)]
    with counting_publishes() as calls:
        for i, batches in enumerate(work):
            for m in modes if i % 2 == 0 else modes[::-1]:
                calls.clear()
                landing = time.perf_counter()
                keys = stage(m.settings, batches)
                t0, c0 = time.perf_counter(), cpu_seconds()
                results = m.apply()
                wall, cpu = time.perf_counter() - t0, cpu_seconds() - c0
                stuck = [r["table"] for r in results if not r.get("committed") or r.get("waiting")]
                if stuck:
                    raise SystemExit(f"{m.name}: micro-batch {i} left {stuck} unapplied: {results}")
                m.rows.append(
                    {
                        "wall": wall,
                        "cpu": cpu,
                        "events": sum(r.get("received", 0) for r in results),
                        "objects": sum(not k.table.startswith(".") for k in keys),  # data, not markers
                        "landing": t0 - landing,
                        "visible": max(c[1] for c in calls) - landing,
                        "first_visible": min(c[1] for c in calls) - landing,
                        "publishes": [c[2] for c in calls],
                        "publish_s": sum(c[1] - c[0] for c in calls),
                    }
                )
                print(f"[consistency] {i} {m.name}: {wall:.2f} s, {len(calls)} publish(es)", flush=True)
    want = expected_tables(shop.batches)
    problems = []
    for m in modes:
        for t in TABLES:
            problems += [f"{m.name} {t}: {p}" for p in diff(want[t], table_rows(spark, table_ident(m.settings, t)))[:3]]
    for t in TABLES:
        table = load_table(on, t)
        snap = table.current_snapshot() if table is not None else None
        got = positions_of(snap.summary.additional_properties) if snap is not None and snap.summary else None
        if got != {SOURCE: shop.position}:
            problems.append(f"on {t}: position {got}, want {shop.position}")
    spark.stop()
    if problems:
        raise SystemExit(f"the tables differ from the reference model: {problems[:6]}")
    return modes, sum(len(v) for v in want.values())


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def report(modes: list[Mode], rows: int) -> None:
    counted = {m.name: m.rows[1:] for m in modes}
    print(f"\nper micro-batch, over {len(counted['on'])} micro-batches per mode after the warm-up")
    head = ("mode", "wall mean", "wall p50", "events/s", "CPU s", "publishes", "tables/publish", "vis p50", "vis p95")
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    summary: dict[str, dict[str, float]] = {}
    for name, a in counted.items():
        wall = [r["wall"] for r in a]
        cpu = statistics.fmean(r["cpu"] for r in a)
        events = sum(r["events"] for r in a)
        pubs = [len(r["publishes"]) for r in a]
        moved = sorted({len(p) for r in a for p in r["publishes"]})
        vis = [r["visible"] for r in a]
        summary[name] = {"wall": statistics.fmean(wall), "cpu": cpu}
        cells = (
            name,
            f"{statistics.fmean(wall):.2f}",
            f"{statistics.median(wall):.2f}",
            f"{events / sum(wall):,.0f}",
            f"{cpu:.2f}",
            f"{statistics.fmean(pubs):.1f}",
            "/".join(map(str, moved)),
            f"{pct(vis, 0.5):.2f}",
            f"{pct(vis, 0.95):.2f}",
        )
        print("| " + " | ".join(cells) + " |")
    print(
        f"\non / off: wall {summary['on']['wall'] / summary['off']['wall']:.2f}, "
        f"CPU {summary['on']['cpu'] / summary['off']['cpu']:.2f}"
    )
    for name, a in counted.items():
        first = [r["first_visible"] for r in a]
        mean = {k: statistics.fmean(r[k] for r in a) for k in ("events", "objects", "landing", "publish_s")}
        print(
            f"{name}: events per micro-batch {mean['events']:.0f}, objects {mean['objects']:.0f}, "
            f"landing {mean['landing']:.2f} s, first table visible p50 {pct(first, 0.5):.2f} s, "
            f"publish_tables {mean['publish_s']:.3f} s per micro-batch; "
            f"tables moved: {sorted({t for r in a for p in r['publishes'] for t in p})}"
        )
    print(f"\nevery table of both modes matches the reference model ({rows} rows)")


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--microbatches", type=int, default=10, help="micro-batches per mode after the warm-up one")
    ap.add_argument("--transactions", type=int, default=200, help="source transactions per micro-batch")
    ap.add_argument("--objects", type=int, default=30, help="staging objects per micro-batch (a batch: one per table)")
    ap.add_argument("--seed", type=int, default=31)
    args = ap.parse_args()
    report(*run(max(1, args.microbatches), args.transactions, args.objects, args.seed))


if __name__ == "__main__":
    main()
