"""The reference model's column types and fits: what the apply job promises about types,
restated in plain Python (no Spark), independent of the pipeline's code like the rest of
:mod:`cdclake.dev.reference`."""

from __future__ import annotations

import json
from typing import Any

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
#     double   any JSON number (an integer becomes the nearest double), and the strings Spark's JSON
#              reader takes for NaN and the infinities ("NaN", "Infinity", "+Infinity", "+INF",
#              "-Infinity", "-INF": Debezium's form of them); no other string;
#     boolean  true or false only;
#     struct   an object whose fields each fit (fields the struct lacks are new fields, added);
#     array    an array whose elements each fit;
#     null     fits every column.
#   An event with a value that does not fit is quarantined with its reason and changes no row;
#   the rest of its run applies. Debezium's unavailable placeholder (a top-level value) fits any
#   column: it takes the row's value just before the event, a key change's INSERT the old key's,
#   and with no row to take it from its event is quarantined (cdclake.dev.reference.apply_run).
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


_NON_NUMBERS = {
    "NaN": float("nan"),
    **dict.fromkeys(("Infinity", "+Infinity", "+INF"), float("inf")),
    **dict.fromkeys(("-Infinity", "-INF"), float("-inf")),
}


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
        if isinstance(value, str) and value in _NON_NUMBERS:
            return _NON_NUMBERS[value], True
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
