"""Hostile producers for tests/receiver/test_hostile.py: hypothesis strategies for batches whose column
and nested key names are unicode, quotes, backticks, dots, spaces, SQL keywords and fragments,
case clashes, system-column names, empty or very long, at random depth and width within and
beyond the limits, over a random number of tables.

Each table has a *shape* (names -> kinds, nested), drawn once: an event takes a subset of it,
some names in another letter case, so that a name's values have one kind across events and the
only reasons an accepted event could fail to apply are names and shapes, never types. Names that
break the rule sit in the shapes too (rarely): an event that takes one is refused."""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, Phase
from hypothesis import strategies as st

from tests.support.hostile_model import Limits, maybe_same_name, name_rules

UNAVAILABLE = "__debezium_unavailable_value"

LEGAL = [
    "id",
    "Name",
    "a b",
    " lead",
    "trail ",
    " ",
    "content-type",
    "@timestamp",
    "x:y",
    "it's",
    'say "hi"',
    "<tag>",
    "a,b",
    "f(x)",
    "select",
    "FROM",
    "null",
    "0",
    "-",
    "/",
    "\\",
    "%s",
    "${x}",
    "drop table victim;--",
    "a') OR true THEN (SELECT 1) WHEN array_contains(array('b'), 'a",
    "x:string>) USING iceberg LOCATION 'file:///tmp/squat' --",
    "struct<a:int>",
    "名前",
    "ünïcödé",
    "é",  # precomposed
    "e\u0301",  # e + combining acute: another name
    "😀",
    "Ω",
    "ß",
    "straße",
    "İd",
    "ıd",
    "\u212a",  # Kelvin sign
    "ſ",
    "Σ",
    "\u00a0",
    "\u200b",
    "\u0085",  # a C1 control: not in the rule's control range, so legal
    "\u2028",
    "_cdc",
    "_file",
    "_pos",
    "_row_id",
    "_partition",
    "_spec_id",
    "_deleted",
    "element",
    "key",
    "value",
    UNAVAILABLE,
    "x" * 128,
    "é" * 128,
    "😀" * 128,
]
ILLEGAL = ["", "a.b", ".", "a`b", "`", "tab\tx", "nl\n", "\x00", "\x7f", "x" * 129, "😀" * 129]
TOP_RESERVED = ["_cdc_x", "_CDC_SOURCE", "_Cdc_row_id", "_cdc_", "_cdc_w_op"]  # legal when nested
TRICKY = "aAiIıİsSſßkK\u212aσΣς`. \t'\"é\u0301😀_"

_text = st.characters(exclude_categories=["Cc", "Cs"], exclude_characters="`.")
names = st.one_of(
    *[st.sampled_from(LEGAL)] * 6,
    st.text(_text, min_size=1, max_size=10),
    st.text(alphabet=TRICKY.replace("`", "").replace(".", "").replace("\t", ""), min_size=1, max_size=4),
)
nested_names = st.one_of(names, st.sampled_from(TOP_RESERVED))  # reserved at the top only
"""Names for shapes: mostly legal; the ``bad`` mutation adds the illegal ones."""
bad_names = st.one_of(st.sampled_from(ILLEGAL + TOP_RESERVED), st.text(alphabet=TRICKY, min_size=1, max_size=4))

VARIANTS: list[Callable[[str], str]] = [
    str.upper,
    str.lower,
    str.swapcase,
    str.title,
    lambda s: s.replace("i", "ı"),
    lambda s: s.replace("I", "İ"),
    lambda s: s.replace("s", "ſ"),
    lambda s: s.replace("k", "\u212a"),
    lambda s: s.replace("σ", "ς"),
]


@dataclass
class Shape:
    """An object's names and the kind of each: "s" (a string), a Shape (an object), or a
    one-element list of either (an array of them)."""

    fields: dict[str, Any] = field(default_factory=dict)


def _fresh(name: str, taken: dict[str, Any]) -> bool:
    return not any(maybe_same_name(name, t) for t in taken)


@st.composite
def shapes(draw: st.DrawFn, levels: int, top: bool = True) -> Shape:
    shape = Shape()
    for _ in range(draw(st.integers(1, 5 if top else 3))):
        name = draw(names if top else nested_names)
        if not _fresh(name, shape.fields):
            continue
        kinds: list[Any] = ["s", "s", ["s"]]
        if levels > 1:
            kinds += [None, [None]]  # placeholders for a nested shape
        kind = draw(st.sampled_from(kinds))
        if kind is None:
            kind = draw(shapes(levels - 1, top=False))
        elif kind == [None]:
            kind = [draw(shapes(levels - 2 if levels > 2 else 1, top=False))]
        shape.fields[name] = kind
    return shape


@st.composite
def spelling(draw: st.DrawFn, name: str, siblings: dict[str, Any]) -> str:
    """The name, or (sometimes) another letter case of it that no sibling could be taken for."""
    if draw(st.integers(0, 4)) != 0:
        return name
    other = draw(st.sampled_from(VARIANTS))(name)
    others = [s for s in siblings if s != name]
    if other != name and maybe_same_name(other, name) and all(not maybe_same_name(other, s) for s in others):
        return other
    return name


@st.composite
def values(draw: st.DrawFn, kind: Any, seq: int) -> Any:
    if kind == "s":
        return draw(st.sampled_from(["v", "x'y", "名", "", "a`b.c", "NULL"])) + str(seq)
    if isinstance(kind, Shape):
        return draw(images(kind, seq))
    return [draw(values(kind[0], seq)) for _ in range(draw(st.integers(0, 2)))]


@st.composite
def images(draw: st.DrawFn, shape: Shape, seq: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, kind in shape.fields.items():
        if draw(st.integers(0, 9)) < 7:
            out[draw(spelling(name, shape.fields))] = draw(values(kind, seq))
    return out


def _nest(levels: int, leaf: Any) -> Any:
    """``levels`` containers (objects and arrays by parity, so one depth is always one type)."""
    value = leaf
    for i in range(levels):
        value = [value] if i % 2 else {"n": value}
    return value


@st.composite
def mutations(draw: st.DrawFn, image: dict[str, Any], shape: Shape, limits: Limits, seq: int) -> dict[str, Any]:
    """Case clashes, depth and width around the limits, added to an image."""
    kind = draw(st.sampled_from(["none", "none", "none", "clash", "deep", "wide", "bad", "bad"]))
    if kind == "bad":
        inside = draw(st.sampled_from(list(objects(image))))
        inside[draw(bad_names)] = f"b{seq}"
    elif kind == "clash":
        inside = draw(st.sampled_from(list(objects(image))))
        pairs = [(k, f(k)) for k in inside for f in VARIANTS if f(k) != k and f(k) not in inside]
        if pairs:
            name, other = draw(st.sampled_from(pairs))
            inside[other] = inside[name]
    elif kind == "deep":
        # The image is depth 1: a field holding n containers makes it n + 1 deep.
        n = draw(st.integers(limits.max_depth - 2, limits.max_depth + 1))
        image[f"deep{n}"] = _nest(n, f"d{seq}")
    elif kind == "wide":
        have = len(leaves(image))
        w = max(1, draw(st.integers(limits.max_columns - 1, limits.max_columns + 1)) - have)
        image[f"wide{w}"] = {f"c{i}": f"w{seq}" for i in range(w)}
    return image


def objects(value: Any) -> Any:
    """Every object in a value, itself first."""
    if isinstance(value, dict):
        yield value
        for v in value.values():
            yield from objects(v)
    elif isinstance(value, list):
        for v in value:
            yield from objects(v)


def leaves(value: Any, prefix: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    if isinstance(value, dict):
        return set().union(*(leaves(v, (*prefix, k)) for k, v in value.items())) if value else set()
    return {prefix}


@dataclass
class Plan:
    """One example: tables with their shapes, and batches in sending order."""

    limits: Limits
    tables: dict[str, Shape]
    batches: list[dict[str, Any]]

    def __repr__(self) -> str:  # what hypothesis prints for a failing example
        import json

        return "\n".join(json.dumps(b, ensure_ascii=True) for b in self.batches)


_example = itertools.count()


@st.composite
def plans(draw: st.DrawFn, limits: Limits, max_tables: int, max_batches: int, source: str) -> Plan:
    n = next(_example)
    count = draw(st.integers(1, max_tables))
    tables = {f"h{n}t{k}": draw(shapes(levels=3)) for k in range(count)}
    seq = itertools.count(1)
    batches = []
    for b in range(draw(st.integers(1, max_batches))):
        evs = []
        for _ in range(draw(st.integers(1, 4))):
            table = draw(st.sampled_from(sorted(tables)))
            evs.append(draw(events(table, tables[table], limits, next(seq))))
        batches.append({"source": source, "sequenceNumber": b + 1, "events": evs})
    return Plan(limits, tables, batches)


@st.composite
def events(draw: st.DrawFn, table: str, shape: Shape, limits: Limits, seq: int) -> dict[str, Any]:
    op = draw(st.sampled_from(["INSERT", "UPDATE", "UPDATE", "DELETE"]))
    ev: dict[str, Any] = {
        "sequence": seq,
        "timestamp": 1_767_225_600_000 + seq,
        "operation": op,
        "table": draw(st.sampled_from([table, table.upper(), table.title()])),
        "rowId": draw(st.sampled_from(["1", "2", "3"])),
    }
    if op != "DELETE":
        after = draw(mutations(draw(images(shape, seq)), shape, limits, seq))
        if op == "UPDATE":
            for k, v in after.items():
                if isinstance(v, str) and draw(st.integers(0, 5)) == 0:
                    after[k] = UNAVAILABLE  # keep the stored value: names reach the MERGE's keep-list
        ev["after"] = after
    if op != "INSERT" and draw(st.integers(0, 3)) == 0:
        ev["before"] = draw(images(shape, seq))
    if draw(st.integers(0, 5)) == 0:
        ev["metadata"] = {"db.table": "x", "a`b": 1, "": None}  # outside the rule: never refused
    return ev


def legal_top(name: str, limits: Limits) -> bool:
    return not name_rules(name, True, limits)


def examples(ci: int, env: str = "CDCLAKE_HOSTILE_EXAMPLES", shrink_in_ci: bool = True) -> dict[str, Any]:
    """CI: ``ci`` derandomized examples; the long run (``make test-hostile``) sets ``env``: that
    many random examples, shrunk on failure."""
    long = int(os.environ.get(env, "0"))
    return {
        "max_examples": long or ci,
        "derandomize": not long,
        # CI reports the failing example as drawn; shrinking one apply at a time takes long.
        "phases": list(Phase) if long or shrink_in_ci else [Phase.explicit, Phase.reuse, Phase.generate],
        "deadline": None,
        "database": None,
        "suppress_health_check": list(HealthCheck),
    }
