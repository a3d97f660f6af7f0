"""The invariants of tests/support/consistency_workload.py, checked on one read of the five
tables, and the one statement that reads them all (so a reader that pins a cut reads every
table at it).

A read is the rows of :func:`read_sql`: ``(t, k, a, b)`` = (table, key as text, first value,
second value): orders ``(id, total, NULL)``, order_lines ``(id, order_id, amount)``, stock
``(sku, qty, NULL)``, accounts_a/accounts_b ``(id, balance, NULL)``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tests.support.consistency_workload import MONEY, STOCK_TOTAL, TABLES

_COLUMNS = {
    "orders": ("CAST(id AS STRING)", "CAST(total AS BIGINT)", "CAST(NULL AS BIGINT)"),
    "order_lines": ("CAST(id AS STRING)", "CAST(order_id AS BIGINT)", "CAST(amount AS BIGINT)"),
    "stock": ("CAST(sku AS STRING)", "CAST(qty AS BIGINT)", "CAST(NULL AS BIGINT)"),
    "accounts_a": ("CAST(id AS STRING)", "CAST(balance AS BIGINT)", "CAST(NULL AS BIGINT)"),
    "accounts_b": ("CAST(id AS STRING)", "CAST(balance AS BIGINT)", "CAST(NULL AS BIGINT)"),
}

Row = tuple[str, str, int | None, int | None]


def select_one(table: str, source: str) -> str:
    """The read of one table in the common shape; ``source`` is what follows FROM."""
    k, a, b = _COLUMNS[table]
    return f"SELECT '{table}' AS t, {k} AS k, {a} AS a, {b} AS b FROM {source}"


def read_sql(sources: Mapping[str, str]) -> str:
    """One statement reading each table of ``sources`` (table -> what follows FROM: a name, or a
    name with ``VERSION AS OF``); a table left out reads as empty."""
    return "\nUNION ALL\n".join(select_one(t, sources[t]) for t in TABLES if t in sources)


@dataclass(frozen=True)
class Seen:
    """What one read found: the violations by kind (empty: consistent) and a fingerprint."""

    violations: Counter[str]
    state: int
    """A hash of the rows: distinct states a reader saw."""
    orders: frozenset[int]
    detail: str

    @property
    def ok(self) -> bool:
        return not self.violations


def check(rows: Iterable[Sequence[Any]]) -> Seen:
    """The invariants on one read's rows."""
    by: dict[str, dict[str, tuple[int | None, int | None]]] = {t: {} for t in TABLES}
    for t, k, a, b in rows:
        by[str(t)][str(k)] = (None if a is None else int(a), None if b is None else int(b))
    orders = {int(k): v[0] for k, v in by["orders"].items()}
    sums: Counter[int] = Counter()
    v: Counter[str] = Counter()
    notes: list[str] = []
    for k, (order_id, amount) in by["order_lines"].items():
        assert order_id is not None and amount is not None
        sums[order_id] += amount
        if order_id not in orders:
            v["line_without_order"] += 1
            notes.append(f"line {k} of missing order {order_id}")
    for oid, total in orders.items():
        if sums.get(oid, 0) != total:
            v["order_total"] += 1
            notes.append(f"order {oid}: total {total}, lines sum {sums.get(oid, 0)}")
    stock = sum(q or 0 for q, _ in by["stock"].values())
    if stock + len(by["order_lines"]) != STOCK_TOTAL:
        v["stock"] += 1
        notes.append(f"stock {stock} + {len(by['order_lines'])} lines != {STOCK_TOTAL}")
    money = sum(bal or 0 for t in ("accounts_a", "accounts_b") for bal, _ in by[t].values())
    if money != MONEY:
        v["money"] += 1
        notes.append(f"money {money} != {MONEY}")
    state = hash(tuple(sorted((t, k, val) for t, rows_ in by.items() for k, val in rows_.items())))
    return Seen(v, state, frozenset(orders), "; ".join(notes[:4]))


def lake_equals(
    got: Mapping[str, Mapping[str, tuple[Any, ...]]], want: Mapping[str, Mapping[str, tuple[Any, ...]]]
) -> str:
    """'' when every table holds the same keys and values; else what differs (first few)."""
    out = []
    for t in TABLES:
        g, w = got.get(t, {}), want.get(t, {})
        if g != w:
            missing = sorted(set(w) - set(g))[:3]
            extra = sorted(set(g) - set(w))[:3]
            changed = [k for k in sorted(set(g) & set(w)) if g[k] != w[k]][:3]
            out.append(f"{t}: missing {missing} extra {extra} changed {[(k, g[k], w[k]) for k in changed]}")
    return "\n".join(out)


def as_tables(rows: Iterable[Sequence[Any]]) -> dict[str, dict[str, tuple[int, ...]]]:
    """A read's rows as table -> key -> values (the shape of consistency_workload.source_tables)."""
    out: dict[str, dict[str, tuple[int, ...]]] = {t: {} for t in TABLES}
    for t, k, a, b in rows:
        out[str(t)][str(k)] = tuple(int(x) for x in (a, b) if x is not None)
    return out
