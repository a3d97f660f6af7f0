"""The types Spark's JSON inference gives a staged object's lines, computed at landing.

The apply reads a run's staging objects with an explicit schema. Without one it needs a whole
pass over the objects first (Spark's JSON inference; its cost: docs/benchmarks.md, "Apply"): so the receiver,
which has every event decoded anyway, records per object the types that pass would find
(in the batch's receipt, :class:`cdclake.staging.Receipt`), and the apply merges the records of
its objects instead (:func:`merge` then :func:`canonical`, then :func:`spark_json`). Only the
staged fields the apply types from inference are recorded: ``after``, ``columnTypes`` and
``columnDefaults`` (the others it reads as fixed types).

The rules are Spark's (``org.apache.spark.sql.catalyst.json.JsonInferSchema`` with the job's
options: no primitivesAsString, no prefersDecimal, no timestamp inference):

* a JSON integer in the signed 64-bit range is ``long``; a larger one ``decimal(digits, 0)``
  up to 38 digits, else ``double``; any other number ``double``;
* an empty string is *null* (it types nothing), ``null`` is null, any other string ``string``;
* an object is a struct of its fields, ordered as Java orders strings (UTF-16 code units);
* an array's element type is the merge of its elements' types;
* merging: null gives way to anything; ``long`` with ``double`` is ``double``; decimals widen
  (to ``double`` past 38 digits, and with ``double``); structs merge field by field; arrays by
  element; anything else is ``string``;
* only at the end (:func:`canonical`): null becomes ``string``, and a struct left with no
  fields is dropped. So a record keeps null types: a column null in one object and ``long``
  in another is ``long``.

The record's form is compact JSON: ``"n"`` null, ``"s"`` string, ``"l"`` long, ``"d"`` double,
``"b"`` boolean, ``["dec", precision, scale]``, ``["arr", element]``, ``["st", [[name, type],
...]]``. The test is Spark itself: tests/jobs/test_recorded_types.py compares
:func:`spark_json` of random events with ``spark.read.json`` of the same lines.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from operator import itemgetter
from typing import Any

NULL, STRING, LONG, DOUBLE, BOOLEAN = "n", "s", "l", "d", "b"
RECORDED = ("after", "columnDefaults", "columnTypes")
"""The staged fields a record types, in Spark's (sorted) field order."""
MAX_PRECISION = 38
_LONG_MIN, _LONG_MAX = -(2**63), 2**63 - 1
_WIDEST_LONG = ("dec", 20, 0)  # DecimalType.forType(LongType)
_SCALARS = {
    NULL: "string",  # only after canonical(); see spark_json
    STRING: "string",
    LONG: "long",
    DOUBLE: "double",
    BOOLEAN: "boolean",
}

Type = Any  # str | tuple: the nested form above, with tuples for JSON arrays


def _order(name: str) -> bytes:
    # Java's String.compareTo order (UTF-16 code units), which Spark sorts fields by; Python's
    # str order is by code point and differs past U+FFFF.
    return name.encode("utf-16-be", "surrogatepass")


def column(kind: type, values: list[Any]) -> Type:
    """The merged type of ``values``, all of Python type ``kind``. By column, not by value:
    the receiver types every event it lands, and a value-by-value walk cost as much as the
    decoding itself; here most of the work runs in C (``any``, ``min``, ``max``)."""
    if kind is str:
        return STRING if any(values) else NULL
    if kind is int:
        if min(values) >= _LONG_MIN and max(values) <= _LONG_MAX:
            return LONG
        return functools.reduce(merge, map(_integer, values), NULL)
    if kind is float:
        return DOUBLE
    if kind is bool:
        return BOOLEAN
    if kind is dict:
        return objects(values)
    if kind is list:
        return ("arr", mixed([item for v in values for item in v]))
    if values and values[0] is None:
        return NULL
    raise TypeError(f"not a decoded JSON value: {kind.__name__}")


def _integer(value: int) -> Type:
    if _LONG_MIN <= value <= _LONG_MAX:
        return LONG
    digits = len(str(abs(value)))
    return ("dec", digits, 0) if digits <= MAX_PRECISION else DOUBLE


def mixed(values: list[Any]) -> Type:
    """The merged type of values of any kinds."""
    kinds = set(map(type, values))
    if len(kinds) == 1:  # the common case, without a Python loop over the values
        return column(kinds.pop(), values)
    by_kind: dict[type, list[Any]] = {}
    for v in values:
        by_kind.setdefault(type(v), []).append(v)
    return functools.reduce(merge, (column(k, vs) for k, vs in by_kind.items()), NULL)


def objects(values: list[Mapping[str, Any]]) -> Type:
    """The merged struct type of JSON objects: grouped by shape (names and value kinds), then
    typed column by column."""
    shapes: dict[tuple[tuple[str, ...], tuple[type, ...]], list[Mapping[str, Any]]] = {}
    for obj in values:
        shape = (tuple(obj), tuple(map(type, obj.values())))
        found = shapes.get(shape)
        if found is None:
            shapes[shape] = [obj]
        else:
            found.append(obj)
    merged: Type = NULL
    for (names, kinds), group in shapes.items():
        fields = [(k, column(kind, [o[k] for o in group])) for k, kind in zip(names, kinds, strict=True)]
        # Code point and UTF-16 order agree on ASCII names, and plain sorting is cheaper.
        fields.sort(key=itemgetter(0) if all(k.isascii() for k in names) else lambda f: _order(f[0]))
        merged = merge(merged, ("st", tuple(fields)))
    return merged


def merge(a: Type, b: Type) -> Type:
    """Spark's ``compatibleType``: the narrowest type both fit."""
    if a == b or b == NULL:
        return a
    if a == NULL:
        return b
    if isinstance(a, str) and isinstance(b, str):
        return DOUBLE if {a, b} == {LONG, DOUBLE} else STRING
    ka, kb = _kind(a), _kind(b)
    if ka == kb == "st":
        return ("st", _merge_fields(a[1], b[1]))
    if ka == kb == "arr":
        return ("arr", merge(a[1], b[1]))
    if "dec" in (ka, kb):
        other = b if ka == "dec" else a
        if other == DOUBLE:
            return DOUBLE
        if other == LONG:
            other = _WIDEST_LONG
        if _kind(other) == "dec":
            return _widen(a if ka == "dec" else other, b if kb == "dec" else other)
    return STRING


def _kind(t: Type) -> str:
    return t if isinstance(t, str) else t[0]


def _widen(a: Type, b: Type) -> Type:
    scale = max(a[2], b[2])
    whole = max(a[1] - a[2], b[1] - b[2])
    return DOUBLE if whole + scale > MAX_PRECISION else ("dec", whole + scale, scale)


def _merge_fields(xs: tuple[Any, ...], ys: tuple[Any, ...]) -> tuple[Any, ...]:
    out, i, j = [], 0, 0
    while i < len(xs) and j < len(ys):
        kx, ky = _order(xs[i][0]), _order(ys[j][0])
        if kx == ky:
            out.append((xs[i][0], merge(xs[i][1], ys[j][1])))
            i, j = i + 1, j + 1
        elif kx < ky:
            out.append(xs[i])
            i += 1
        else:
            out.append(ys[j])
            j += 1
    return (*out, *xs[i:], *ys[j:])


def record(lines: Iterable[Any]) -> Type:
    """The merged type of staged lines' :data:`RECORDED` fields (decoded lines, or events with
    those attributes: :func:`cdclake.contracts.events.stage_types`), not canonical."""
    found: dict[str, list[Any]] = {k: [] for k in RECORDED}
    for line in lines:
        for k in RECORDED:
            v = line.get(k) if isinstance(line, Mapping) else getattr(line, k)
            if v is not None:
                found[k].append(v)
    return ("st", tuple((k, mixed(vs)) for k, vs in found.items() if vs))


def canonical(t: Type) -> Type | None:
    """Spark's end of inference: null is ``string``; a struct with no fields is dropped."""
    if t == NULL:
        return STRING
    kind = _kind(t)
    if kind == "arr":
        element = canonical(t[1])
        return None if element is None else ("arr", element)
    if kind == "st":
        fields = tuple((n, c) for n, f in t[1] if n for c in [canonical(f)] if c is not None)
        return ("st", fields) if fields else None
    return t


def spark_json(t: Type) -> Any:
    """A canonical type as Spark's DataType JSON (``StructType.fromJson`` reads a struct's)."""
    kind = _kind(t)
    if kind == "dec":
        return f"decimal({t[1]},{t[2]})"
    if kind == "arr":
        return {"type": "array", "elementType": spark_json(t[1]), "containsNull": True}
    if kind == "st":
        return {
            "type": "struct",
            "fields": [{"name": n, "type": spark_json(f), "nullable": True, "metadata": {}} for n, f in t[1]],
        }
    return _SCALARS[t]


def from_record(data: Any) -> Type:
    """A record read back from JSON: its arrays as tuples, so records compare and merge."""
    if isinstance(data, str):
        if data not in _SCALARS:
            raise ValueError(f"not a recorded type: {data!r}")
        return data
    kind = data[0]
    if kind == "dec":
        return ("dec", int(data[1]), int(data[2]))
    if kind == "arr":
        return ("arr", from_record(data[1]))
    if kind == "st":
        return ("st", tuple((str(n), from_record(f)) for n, f in data[1]))
    raise ValueError(f"not a recorded type: {data!r}")
