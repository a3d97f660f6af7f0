"""An independent reference model of what the tables must contain: plain Python over the
batches that were acknowledged, sharing no code with the pipeline."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

UNAVAILABLE = "__debezium_unavailable_value"


Rank = tuple[list[int], str, int]
"""(ordering value, source, sequence): the order events of one key apply in."""
Ident = tuple[str, int]
"""(source, sequence): one event, however often delivered."""


@dataclass
class Change:
    """One accepted event of a run: its rank, key, operation and after-image (placeholders as sent)."""

    rank: Rank
    ident: Ident
    rid: str
    op: str
    row: dict[str, Any] | None


@dataclass
class Stored:
    """What a table holds between runs: its rows and the ranks of its deleted keys."""

    rows: dict[str, tuple[Rank, dict[str, Any]]] = field(default_factory=dict)
    tombs: dict[str, Rank] = field(default_factory=dict)


def _rank(source: str, ev: dict[str, Any]) -> Rank:
    return (list(ev.get("order") or [ev["sequence"]]), source, ev["sequence"])


def expected_tables(batches: Iterable[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """table -> rowId -> row, for every row alive after all events, as one apply run over
    empty tables (:func:`apply_run`); the ordering value is ``order`` when the event has one,
    else ``[sequence]``."""
    return {table: {rid: row for rid, (_, row) in s.rows.items()} for table, s in _one_run(batches)[0].items()}


def unavailable_quarantine(batches: Iterable[dict[str, Any]]) -> dict[str, set[Ident]]:
    """table -> the events :func:`expected_tables`' one run quarantines: a placeholder with no
    earlier value to keep."""
    return _one_run(batches)[1]


def _one_run(batches: Iterable[dict[str, Any]]) -> tuple[dict[str, Stored], dict[str, set[Ident]]]:
    seen: set[Ident] = set()
    changes: dict[str, list[Change]] = {}
    for batch in batches:
        for ev in batch["events"]:
            ident = (batch["source"], ev["sequence"])
            if ident in seen:
                continue
            seen.add(ident)
            row = ev.get("after") if ev["operation"] != "DELETE" else None
            change = Change(_rank(batch["source"], ev), ident, ev["rowId"], ev["operation"], row)
            changes.setdefault(ev["table"].lower(), []).append(change)
    stored = {table: Stored() for table in changes}
    return stored, {table: apply_run(stored[table], cs) for table, cs in changes.items()}


def apply_run(stored: Stored, changes: list[Change]) -> set[Ident]:
    """One apply run of a table's accepted ``changes`` over ``stored`` (updated in place); returns
    the events quarantined because a placeholder had no value to keep.

    A placeholder (a top-level value ``__debezium_unavailable_value``) takes the value its column
    had in the key's row just before the event: the newest of the key's earlier events of the
    run that were not quarantined and its stored row if older than the event. An INSERT whose
    source position (producer and ordering value) holds exactly one DELETE, of another key, in
    this run is a primary-key change: its placeholders take the old key's values just before that
    delete. No row there (a delete, nothing stored, several deletes at the position): the event
    is quarantined and changes nothing. Then per key the newest accepted event applies, unless
    the stored row or the key's tombstone is as new."""
    by_key: dict[str, list[Change]] = {}
    for c in sorted(changes, key=lambda c: c.rank):
        by_key.setdefault(c.rid, []).append(c)
    deletes: dict[tuple[str, tuple[int, ...]], list[Change]] = {}
    for c in changes:
        if c.op == "DELETE":
            deletes.setdefault((c.rank[1], tuple(c.rank[0])), []).append(c)
    decided: dict[Ident, tuple[bool, dict[str, Any] | None]] = {}  # (accepted, row: None when deleted)

    def before(rid: str, rank: Rank) -> dict[str, Any] | None:
        newest: tuple[Rank, dict[str, Any] | None] | None = None
        if rid in stored.rows and stored.rows[rid][0] < rank:
            newest = stored.rows[rid]
        for c in reversed(by_key.get(rid, [])):
            if c.rank < rank and decide(c)[0]:
                if newest is None or c.rank > newest[0]:
                    newest = (c.rank, decide(c)[1])
                break
        return newest[1] if newest is not None else None

    def decide(c: Change) -> tuple[bool, dict[str, Any] | None]:
        if c.ident not in decided:
            decided[c.ident] = _decide(c, before, deletes)
        return decided[c.ident]

    for c in sorted(changes, key=lambda c: c.rank):
        decide(c)
    for rid, cs in by_key.items():
        kept = [c for c in cs if decided[c.ident][0]]
        if not kept:
            continue
        win = kept[-1]
        if (rid in stored.rows and stored.rows[rid][0] >= win.rank) or (
            rid in stored.tombs and stored.tombs[rid] >= win.rank
        ):
            continue  # late, or the stored row itself
        row = decided[win.ident][1]
        if row is not None:
            stored.rows[rid] = (win.rank, row)
        else:
            stored.rows.pop(rid, None)
            stored.tombs[rid] = win.rank
    return {ident for ident, (accepted, _) in decided.items() if not accepted}


Before = Callable[[str, Rank], "dict[str, Any] | None"]


def _decide(
    c: Change, before: Before, deletes: dict[tuple[str, tuple[int, ...]], list[Change]]
) -> tuple[bool, dict[str, Any] | None]:
    """(accepted, ``c``'s row: None for a DELETE); not accepted when a placeholder has nothing
    to take."""
    if c.op == "DELETE" or c.row is None:
        return True, None
    if UNAVAILABLE not in c.row.values():
        return True, dict(c.row)
    old = deletes.get((c.rank[1], tuple(c.rank[0])), []) if c.op == "INSERT" else []
    if len(old) > 1:
        return False, None  # which key changed is ambiguous
    changed = len(old) == 1 and old[0].rid != c.rid
    was = before(old[0].rid, old[0].rank) if changed else before(c.rid, c.rank)
    if was is None:
        return False, None
    return True, {k: (was.get(k) if v == UNAVAILABLE else v) for k, v in c.row.items()}


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
#   column: it takes the row's value just before the event, a key change's INSERT the old key's,
#   and with no row to take it from its event is quarantined (:func:`apply_run`).
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
    stored: dict[str, Stored] = {}
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
            done = out.changes.setdefault(table, set())
            fresh: dict[Ident, Change] = {}
            for source, ev in events:
                ident = (source, ev["sequence"])
                if ident in done or ident in quarantined or ident in fresh:
                    continue  # decided by an earlier run or delivery: a duplicate
                row, ok = _fit_image(ev, types)
                if not ok:
                    quarantined.add(ident)
                else:
                    fresh[ident] = Change(_rank(source, ev), ident, ev["rowId"], ev["operation"], row)
            held = apply_run(stored.setdefault(table, Stored()), list(fresh.values()))
            quarantined |= held
            done |= set(fresh) - held
    for table, s in stored.items():
        out.tables[table] = {rid: row for rid, (_, row) in s.rows.items()}
    return out


def _fit_image(ev: dict[str, Any], types: dict[str, Any]) -> tuple[dict[str, Any] | None, bool]:
    """An event's after-image as the table's types hold it, and whether every value fits."""
    if ev["operation"] == "DELETE":
        return None, True
    row: dict[str, Any] = {}
    ok = True
    for c, v in (ev.get("after") or {}).items():
        if v == UNAVAILABLE:
            row[c] = v  # not a value: the key keeps its previous one
            continue
        if c not in types:
            continue  # only ever empty objects: no column
        row[c], good = fit(v, types[c])
        ok = ok and good
    return row, ok
