"""A deterministic sample CDC workload: inserts, updates, deletes over several tables, with
duplicate batches (a producer retry) and out-of-order events. Used by the demo, tests and
benchmarks; it knows nothing of how the pipeline applies them."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

TABLES = ("customers", "orders", "products")
TIERS = ("free", "pro", "enterprise")
STATUSES = ("new", "paid", "shipped", "cancelled")


@dataclass(frozen=True)
class Workload:
    batches: list[dict[str, Any]]
    """Batches in sending order, as JSON-ready dicts; duplicates are repeated entries."""

    @property
    def events(self) -> int:
        return sum(len(b["events"]) for b in self.batches)


def _money(rng: random.Random, low: float, high: float) -> float:
    # Never integral: JSON "12.0" and "12" infer different types, and that is not what we test here.
    x = round(rng.uniform(low, high), 2)
    return x if x != int(x) else x + 0.25


def _row(rng: random.Random, table: str, key: int) -> dict[str, Any]:
    if table == "customers":
        return {
            "id": key,
            "name": f"customer-{key}",
            "email": f"c{key}@example.com",
            "tier": rng.choice(TIERS),
            "balance": _money(rng, 0, 1000),
        }
    if table == "orders":
        return {
            "order_id": key,
            "customer_id": rng.randrange(1, 50),
            "amount": _money(rng, 1, 500),
            "status": rng.choice(STATUSES),
            "items": [{"sku": f"sku-{rng.randrange(100)}", "qty": rng.randrange(1, 5)} for _ in range(2)],
        }
    return {"sku": f"sku-{key}", "title": f"product {key}", "price": _money(rng, 1, 99)}


def generate(
    *,
    seed: int = 7,
    events: int = 600,
    tables: tuple[str, ...] = TABLES,
    batch_size: int = 40,
    source: str = "shop-db",
    keys_per_table: int = 60,
    start_sequence: int = 1,
    start_batch: int = 1,
    start_ms: int = 1_767_225_600_000,
    duplicate_every: int = 5,
    late_fraction: float = 0.05,
) -> Workload:
    rng = random.Random(seed)
    live: dict[str, dict[int, dict[str, Any]]] = {t: {} for t in tables}
    stream: list[dict[str, Any]] = []
    for i in range(events):
        table = rng.choice(tables)
        key = rng.randrange(1, keys_per_table + 1)
        rows = live[table]
        ev: dict[str, Any] = {
            "sequence": start_sequence + i,
            "timestamp": start_ms + i * 10,
            "table": table,
            "rowId": str(key),
        }
        if key not in rows:
            rows[key] = _row(rng, table, key)
            ev.update(operation="INSERT", after=rows[key])
        elif rng.random() < 0.2:
            ev.update(operation="DELETE", before=rows.pop(key))
        else:
            after = _row(rng, table, key)
            ev.update(operation="UPDATE", before=rows[key], after=after)
            rows[key] = after
        stream.append(ev)

    chunks = [stream[i : i + batch_size] for i in range(0, len(stream), batch_size)]
    # Out of order: move a few events into a later batch, so they arrive after newer ones.
    for ci in range(len(chunks) - 1):
        for ev in list(chunks[ci]):
            if rng.random() < late_fraction:
                chunks[ci].remove(ev)
                chunks[rng.randrange(ci + 1, len(chunks))].append(ev)
    batches: list[dict[str, Any]] = []
    for n, chunk in enumerate(c for c in chunks if c):
        batch = {"source": source, "sequenceNumber": start_batch + n, "events": chunk}
        batches.append(batch)
        if duplicate_every and n % duplicate_every == duplicate_every - 1:
            batches.append(batch)  # the producer retried: same batch again
    return Workload(batches)
