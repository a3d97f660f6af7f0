"""An independent reference model of what the tables must contain: plain Python over the
batches that were acknowledged, sharing no code with the pipeline."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
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
            state = _replay(events)
            if state is not None:
                rows[rid] = state
    return out


def _replay(events: list[tuple[Any, str, Any]]) -> dict[str, Any] | None:
    """A key's row after its (rank, operation, after-image) events in rank order; None if deleted.
    A value marked unavailable keeps the key's previous value."""
    state: dict[str, Any] | None = None
    for _, op, after in sorted(events, key=lambda e: e[0]):
        if op == "DELETE":
            state = None
        else:
            prev = state or {}
            state = {c: (prev.get(c) if v == UNAVAILABLE else v) for c, v in after.items()}
    return state


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


# ---------------------------------------------------------------- types, quarantine, run by run
#
# What the apply job promises about types, per table, restated in plain Python (no Spark):
#
# * A column's type is decided by the run that first brings it, and never changes: Spark's JSON
#   inference over that run's values of the column (bigint for integers, double once a number has
#   a fraction or exponent, string, boolean, a struct for objects, an array; values of different
#   kinds in that run make it a string column; a column only ever null is a string column). The
#   same holds for a struct field: a field new in a run is typed over that run's objects for the
#   struct (values of the struct column that are no object do not fit anyway).
# * Every value is judged on its own (not by the other values of its run) against its column's
#   type, by its JSON kind:
#     string   takes any value: a string as it is, anything else as its JSON text as staged
#              (Spark's JSON reader does exactly that);
#     bigint   a JSON integer within 64 bits; not 7.0 or 2.5, not the string "7", not a boolean;
#     double   any JSON number (an integer becomes the nearest double); not a string ("NaN" neither);
#     boolean  true or false only;
#     struct   an object whose fields each fit (fields the struct lacks are new fields, added);
#     array    an array whose elements each fit;
#     null     fits every column.
#   An event with a value that does not fit is quarantined with its reason and changes no row;
#   the rest of its run applies. Debezium's unavailable placeholder (a top-level value) fits any
#   column: the key keeps its previous value.
# * Every event (producer, sequence) is decided once, by the first run that reads it: delivered
#   again later, under any batch number, it is a duplicate: logged neither in the change history
#   nor the quarantine again, applied never again.
#
# Modelled values are those the property tests generate: integers within 64 bits, floats written
# the same by Java and Python (only where they become JSON text), ASCII strings, booleans,
# objects, arrays.

JsonType = str | dict[str, Any] | list[Any] | None
"""A column type: "bigint" | "double" | "string" | "boolean", a struct as {field: type}, an
array as [element type]; None for a value that is null (no type)."""


@dataclass
class Expected:
    """What the tables must hold after a sequence of apply runs."""

    tables: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    """table -> rowId -> row, values as the table's column types hold them."""
    types: dict[str, dict[str, Any]] = field(default_factory=dict)
    """table -> column -> type (Spark's simple names; a struct is a dict of its fields, an array
    a one-element list of its element type)."""
    quarantined: dict[str, set[tuple[str, int]]] = field(default_factory=dict)
    """table -> (source, sequence) of every event quarantined by some run."""
    changes: dict[str, set[tuple[str, int]]] = field(default_factory=dict)
    """table -> (source, sequence) of every event some run accepted (its change history)."""


def infer_type(value: Any) -> JsonType:
    """Spark's JSON type of one value (before merging and the final step, :func:`_canonical`)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        if not -(2**63) <= value < 2**63:
            raise NotImplementedError(f"integer {value} outside the modelled range")
        return "bigint"
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise NotImplementedError(f"double {value!r} is no JSON")
        return "double"
    if isinstance(value, str):
        return "string"
    if isinstance(value, dict):
        return {k: infer_type(v) for k, v in value.items()}
    if isinstance(value, list):
        element: JsonType = None
        for v in value:
            element = merge_types(element, infer_type(v))
        return [element]
    raise NotImplementedError(f"{type(value).__name__} values are not modelled")


def merge_types(a: JsonType, b: JsonType) -> JsonType:
    """The type Spark's JSON inference gives values of types ``a`` and ``b``."""
    if a is None:
        return b
    if b is None or a == b:
        return a
    if isinstance(a, dict) and isinstance(b, dict):
        return {k: merge_types(a.get(k), b.get(k)) for k in [*a, *(k for k in b if k not in a)]}
    if isinstance(a, list) and isinstance(b, list):
        return [merge_types(a[0], b[0])]
    if sorted(map(str, (a, b))) == ["bigint", "double"]:
        return "double"
    return "string"  # anything else mixed: the JSON text of each value


def _canonical(t: JsonType) -> JsonType:
    """Inference's last step: null-only is a string; a struct without fields is no column."""
    if t is None:
        return "string"
    if isinstance(t, dict):
        fields = {k: c for k, c in ((k, _canonical(v)) for k, v in t.items()) if c is not None}
        return fields or None
    if isinstance(t, list):
        element = _canonical(t[0])
        return None if element is None else [element]
    return t


def column_type(table: JsonType, values: list[Any]) -> JsonType:
    """A column's type after a run with these (non-null) values: the inferred one if the column
    is new (``table`` None), else the table's, with new struct fields typed over the run's
    objects for the struct (and arrays' elements likewise). None: no column (only empty objects)."""
    if table is None:
        inferred: JsonType = None
        for v in values:
            inferred = merge_types(inferred, infer_type(v))
        return _canonical(inferred)
    if isinstance(table, dict):
        objects = [v for v in values if isinstance(v, dict)]
        out = dict(table)
        for k in [*table, *sorted({k for o in objects for k in o if k not in table})]:
            t = column_type(table.get(k), [o[k] for o in objects if o.get(k) is not None])
            if t is not None:
                out[k] = t
        return out
    if isinstance(table, list):
        elements = [e for v in values if isinstance(v, list) for e in v if e is not None]
        return [column_type(table[0], elements)]
    return table


def _double_text(d: float) -> str:
    """Java's (and so Spark's) text of a double, where it agrees with Python's."""
    if d != d or d in (float("inf"), float("-inf")) or (d != 0 and not 1e-3 <= abs(d) < 1e7):
        raise NotImplementedError(f"double {d!r} outside the modelled range")
    return repr(d)


def _json_text(value: Any) -> str:
    """Compact JSON, as the receiver stages it and Spark copies it into a string column."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _double_text(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ",".join(_json_text(v) for v in value) + "]"
    return "{" + ",".join(f"{json.dumps(k, ensure_ascii=False)}:{_json_text(v)}" for k, v in value.items()) + "}"


def fit(value: Any, t: JsonType) -> tuple[Any, bool]:
    """``(value as a column of type t holds it, whether it fits)``, by the value's JSON kind."""
    if value is None:
        return None, True
    if t == "string":
        return (value if isinstance(value, str) else _json_text(value)), True
    if t == "bigint":
        ok = isinstance(value, int) and not isinstance(value, bool) and -(2**63) <= value < 2**63
        return (value if ok else None), ok
    if t == "double":
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return (float(value) if ok else None), ok
    if t == "boolean":
        ok = isinstance(value, bool)
        return (value if ok else None), ok
    if isinstance(t, dict):
        if not isinstance(value, dict):
            return None, False
        out, ok = {}, True
        for k, ft in t.items():
            out[k], good = fit(value.get(k), ft)
            ok = ok and good
        return out, ok
    if isinstance(t, list):
        if not isinstance(value, list):
            return None, False
        elements = [fit(v, t[0]) for v in value]
        return [v for v, _ in elements], all(good for _, good in elements)
    raise NotImplementedError(f"type {t!r}")


def expected_runs(runs: Iterable[Iterable[dict[str, Any]]]) -> Expected:
    """:func:`expected_tables`, run by run: ``runs`` lists the batches each apply run consumed
    (every table's run reads the objects its batches landed). Also predicts column types, the
    quarantine and the change history, by the rules above. Crashed runs need no special case:
    the re-run finishes the crashed run's objects with the same decisions, and a crashed run's
    schema changes are the re-run's own."""
    out = Expected()
    Rank = tuple[list[int], str, int]  # (ordering value, source, sequence)
    accepted: dict[str, dict[tuple[str, int], tuple[Rank, str, str, Any]]] = {}
    for run in runs:
        per_table: dict[str, list[tuple[str, dict[str, Any]]]] = {}
        for batch in run:
            for ev in batch["events"]:
                per_table.setdefault(ev["table"].lower(), []).append((batch["source"], ev))
        for table, events in per_table.items():
            # Every delivery of the run counts for new types, decided before or not.
            run_type = column_type(out.types.get(table, {}), [ev.get("after") or {} for _, ev in events])
            assert isinstance(run_type, dict)
            types = out.types[table] = run_type
            quarantined = out.quarantined.setdefault(table, set())
            done = accepted.setdefault(table, {})
            for source, ev in events:
                ident = (source, ev["sequence"])
                if ident in done or ident in quarantined:
                    continue  # decided by an earlier run or delivery: a duplicate
                row, ok = None, True
                if ev["operation"] != "DELETE":
                    row = {}
                    for c, v in (ev.get("after") or {}).items():
                        if v == UNAVAILABLE:
                            row[c] = v  # not a value: the key keeps its previous one
                            continue
                        if c not in types:
                            continue  # only ever empty objects: no column
                        row[c], good = fit(v, types[c])
                        ok = ok and good
                if not ok:
                    quarantined.add(ident)
                else:
                    rank = (list(ev.get("order") or [ev["sequence"]]), source, ev["sequence"])
                    done[ident] = (rank, ev["rowId"], ev["operation"], row)
    for table, done in accepted.items():
        out.changes[table] = set(done)
        per_key: dict[str, list[tuple[Rank, str, Any]]] = {}
        for rank, rid, op, row in done.values():
            per_key.setdefault(rid, []).append((rank, op, row))
        rows = out.tables.setdefault(table, {})
        for rid, changes in per_key.items():
            state = _replay(changes)
            if state is not None:
                rows[rid] = state
    return out
