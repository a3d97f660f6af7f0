"""An independent reference model of what the tables must contain: plain Python over the
batches that were acknowledged, sharing no code with the pipeline."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

UNAVAILABLE = "__debezium_unavailable_value"


def expected_tables(batches: Iterable[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """table -> rowId -> row, for every row alive after all events, replayed per key in
    (ordering value, source, sequence) order, the ordering value being ``order`` when the event
    has one, else ``[sequence]``. A value marked unavailable keeps the key's previous value."""
    seen: set[tuple[str, int]] = set()
    history: dict[str, dict[str, list[tuple[tuple[list[int], str, int], str, Any]]]] = {}
    for batch in batches:
        for ev in batch["events"]:
            ident = (batch["source"], ev["sequence"])
            if ident in seen:
                continue
            seen.add(ident)
            per_key = history.setdefault(ev["table"].lower(), {}).setdefault(ev["rowId"], [])
            rank = (list(ev.get("order") or [ev["sequence"]]), batch["source"], ev["sequence"])
            per_key.append((rank, ev["operation"], ev.get("after")))
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for table, keys in history.items():
        rows = out.setdefault(table, {})
        for rid, events in keys.items():
            state: dict[str, Any] | None = None
            for _, op, after in sorted(events, key=lambda e: e[0]):
                if op == "DELETE":
                    state = None
                else:
                    prev = state or {}
                    state = {c: (prev.get(c) if v == UNAVAILABLE else v) for c, v in after.items()}
            if state is not None:
                rows[rid] = state
    return out


def normalise_row(value: Any) -> Any:
    """Spark Rows -> plain dicts/lists so they compare with JSON after-images."""
    if hasattr(value, "asDict"):
        return {k: normalise_row(v) for k, v in value.asDict().items()}
    if isinstance(value, dict):
        return {k: normalise_row(v) for k, v in value.items()}
    if isinstance(value, list):
        return [normalise_row(v) for v in value]
    return value


def rows_by_key(rows: Iterable[Any], key: str = "_cdc_row_id") -> dict[str, dict[str, Any]]:
    """Table rows (Spark Rows or dicts) -> key -> user columns, system ``_cdc_*`` columns dropped."""
    out = {}
    for r in rows:
        d = normalise_row(r)
        out[d[key]] = {k: v for k, v in d.items() if not k.startswith("_cdc_")}
    return out


def _drop_nulls(value: Any) -> Any:
    """Absent and null fields mean the same in an after-image; the table has every column."""
    if isinstance(value, dict):
        return {k: _drop_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_nulls(v) for v in value]
    return value


def diff(expected: dict[str, dict[str, Any]], actual: dict[str, dict[str, Any]]) -> list[str]:
    """Human-readable differences; empty when equal. Rows may carry extra NULL columns and fields."""
    problems = []
    for rid in sorted(set(expected) | set(actual), key=lambda r: (len(r), r)):
        if rid not in actual:
            problems.append(f"missing row {rid}: {expected[rid]}")
        elif rid not in expected:
            problems.append(f"unexpected row {rid}: {actual[rid]}")
        else:
            want, got = _drop_nulls(expected[rid]), _drop_nulls(actual[rid])
            if got != want:
                problems.append(f"row {rid}: want {want} got {got}")
    return problems
