"""An independent model of the door rule (issue 13's shared contract), for the hostile-producer
tests: plain Python from the contract's text, sharing no code with ``cdclake.contracts.names``.

The rule, per key at every depth of an event's ``after`` and ``before`` (objects inside arrays
too): 1..max_name_chars characters; no backtick, dot or control character (U+0000-U+001F,
U+007F); top-level names starting with ``_cdc_``, and Iceberg's metadata column names, in any
case are reserved; no two keys of one
object equal ignoring case; containers nest at most max_depth deep (the image itself is depth
1); an image has at most max_columns leaf fields; a batch names at most max_tables tables.

"Equal ignoring case" is judged the way the engines behind the door compare names: Spark's
resolver (Java ``String.equalsIgnoreCase``: per code point, simple upper case, then simple lower
case) and Iceberg's case-insensitive lookup (``toLowerCase(Locale.ROOT)``). Two names equal in
either MUST be refused within one object and MUST land in one column across objects. Names that
only a wider reading of "ignoring case" equates (Unicode case folding: ``ß``/``ss``, also with
the Turkish i taken for i) are a tolerance zone: refusing them is allowed, so is accepting them
(as two columns or as one).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

RESERVED = "_cdc_"
ICEBERG_METADATA = {"_file", "_pos", "_deleted", "_spec_id", "_partition", "_row_id", "_last_updated_sequence_number"}
"""Top-level columns so named hide the metadata columns Spark's MERGE needs (every later apply
failed: "Row ID attributes cannot be nullable: _file", found by this test in CI), so the
contract reserves them at the top level in any letter case: a name Spark would take for one
must be refused; one equal only under a wider case folding may be."""

# A violated rule -> words its refusal message must hold (one of them).
RULE_WORDS = {
    "empty": ("CDCLAKE_MAX_NAME_CHARS",),
    "long": ("CDCLAKE_MAX_NAME_CHARS",),
    "backtick": ("backtick",),
    "dot": ("dot",),
    "control": ("control",),
    "reserved": ("reserved",),
    "case": ("case",),
    "depth": ("CDCLAKE_MAX_DEPTH",),
    "columns": ("CDCLAKE_MAX_COLUMNS",),
    "tables": ("CDCLAKE_MAX_TABLES_PER_BATCH",),
}
NAMED_RULES = {"empty", "long", "backtick", "dot", "control", "reserved", "case"}
"""Rules about one key: the refusal's field must show that key."""


@dataclass(frozen=True)
class Limits:
    max_name_chars: int = 128
    max_depth: int = 32
    max_columns: int = 1000
    max_tables: int = 100


# ------------------------------------------------------------------ equal ignoring case


def _simple_upper(c: str) -> str:
    u = c.upper()
    if len(u) == 1:
        return u
    t = c.title()  # e.g. U+1FB3 -> U+1FBC, where the full upper case is two characters
    return t if len(t) == 1 else c


def _simple_lower(c: str) -> str:
    if c == "\u0130":  # Java's Character.toLowerCase: U+0130 -> 'i' (the full mapping adds U+0307)
        return "i"
    low = c.lower()
    return low if len(low) == 1 else c


def java_key(name: str) -> str:
    """Equal for two names exactly when Java's ``String.equalsIgnoreCase`` (what Spark's
    case-insensitive resolver calls) says they are: per code point, simple upper case equal or
    their simple lower cases equal. Simple mappings keep the length, so lengths match too."""
    return "".join(_simple_lower(_simple_upper(c)) for c in name)


def same_name(a: str, b: str) -> bool:
    """Spark or Iceberg (``toLowerCase(Locale.ROOT)``) could take one for the other: one column,
    never two keys of one object."""
    return a == b or java_key(a) == java_key(b) or a.lower() == b.lower()


def folded(name: str) -> str:
    """Unicode case folding, after taking the Turkish dotted and dotless i for i."""
    return name.replace("\u0130", "i").replace("\u0131", "i").casefold()


def maybe_same_name(a: str, b: str) -> bool:
    """A wider reading of "ignoring case" equates them (Unicode case folding, with or without
    the Turkish i taken for i): the tolerance zone, and ``same_name``."""
    return same_name(a, b) or a.casefold() == b.casefold() or folded(a) == folded(b)


def clashes(names: Iterable[str]) -> tuple[set[str], set[str]]:
    """(names that clash under ``same_name``, names that clash only in the tolerance zone)."""
    must: set[str] = set()
    may: set[str] = set()
    for key, out in ((java_key, must), (str.lower, must), (str.casefold, may), (folded, may)):
        groups: dict[str, list[str]] = {}
        for n in names:
            groups.setdefault(key(n), []).append(n)
        out.update(n for g in groups.values() if len(g) > 1 for n in g)
    return must, may - must


# ------------------------------------------------------------------ one image


def name_rules(name: str, top: bool, limits: Limits) -> set[str]:
    out = set()
    if not name:
        out.add("empty")
    if len(name) > limits.max_name_chars:
        out.add("long")
    if "`" in name:
        out.add("backtick")
    if "." in name:
        out.add("dot")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in name):
        out.add("control")
    if top and (name[:5].lower() == RESERVED or any(same_name(name, m) for m in ICEBERG_METADATA)):
        out.add("reserved")
    return out


def iceberg_reserved(image: Any) -> set[str]:
    """The image's top-level names equal to one Iceberg reserves (see ICEBERG_METADATA)
    under some reading of "ignoring case" (the tolerance zone of ``maybe_same_name``)."""
    if not isinstance(image, dict):
        return set()
    return {k for k in image if any(maybe_same_name(k, m) for m in ICEBERG_METADATA)}


@dataclass
class Verdict:
    """What the rule says about one image, batch or event."""

    must: set[str] = field(default_factory=set)
    """Rules certainly broken: the door must refuse."""
    may: set[str] = field(default_factory=set)
    """Broken only in the tolerance zone: the door may refuse."""
    keys: set[str] = field(default_factory=set)
    """Keys a refusal for a named rule may show."""

    def merge(self, other: Verdict) -> None:
        self.must |= other.must
        self.may |= other.may
        self.keys |= other.keys


def depth(value: Any) -> int:
    """Containers nested in ``value``, itself included (a scalar is 0, ``{}`` is 1)."""
    if isinstance(value, dict):
        return 1 + max((depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((depth(v) for v in value), default=0)
    return 0


def leaf_paths(value: Any, prefix: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    """The columns an image makes: an array is one path whatever its length; its elements share
    one shape (their union); an array with no object or array inside is one leaf."""
    if isinstance(value, dict):
        out: set[tuple[str, ...]] = set()
        for k, v in value.items():
            out |= leaf_paths(v, (*prefix, k))
        return out
    if isinstance(value, list):
        inner: set[tuple[str, ...]] = set()
        for v in value:
            if isinstance(v, (dict, list)):
                inner |= leaf_paths(v, (*prefix, "[]"))
        return inner or {prefix}
    return {prefix}


def count_columns(paths: Iterable[tuple[str, ...]]) -> tuple[int, int]:
    """(fewest, most) columns the paths can make: paths whose segments are ``same_name`` (or
    linked through others that are) are one column at fewest; the most counts only identical
    paths as one."""
    distinct = set(paths)
    names = {seg for p in distinct for seg in p}
    parent = {n: n for n in names}

    def root(n: str) -> str:
        while parent[n] != n:
            n = parent[n]
        return n

    for key in (java_key, str.lower):
        first: dict[str, str] = {}
        for n in sorted(names):
            parent[root(n)] = root(first.setdefault(key(n), n))
    return len({tuple(root(seg) for seg in p) for p in distinct}), len(distinct)


def _objects(value: Any, top: bool = True) -> Iterator[tuple[dict[str, Any], bool]]:
    if isinstance(value, dict):
        yield value, top
        for v in value.values():
            yield from _objects(v, False)
    elif isinstance(value, list):
        for v in value:
            yield from _objects(v, False)


def judge_image(image: dict[str, Any], limits: Limits) -> Verdict:
    v = Verdict()
    if iceberg_reserved(image):
        v.may.add("reserved")
        v.keys |= iceberg_reserved(image)
    for obj, top in _objects(image):
        keys = list(obj)
        for k in keys:
            broken = name_rules(k, top, limits)
            if broken:
                v.must |= broken
                v.keys.add(k)
        must, may = clashes(keys)
        if must:
            v.must.add("case")
        if may:
            v.may.add("case")
        v.keys |= must | may
    if depth(image) > limits.max_depth:
        v.must.add("depth")
    fewest, most = count_columns(leaf_paths(image))
    if fewest > limits.max_columns:
        v.must.add("columns")
    elif most > limits.max_columns:
        v.may.add("columns")
    return v


def judge_event(event: dict[str, Any], limits: Limits) -> Verdict:
    v = Verdict()
    for which in ("before", "after"):
        if isinstance(event.get(which), dict):
            v.merge(judge_image(event[which], limits))
    return v


@dataclass
class BatchVerdict:
    must: dict[int, set[str]]
    """Event index -> rules it certainly breaks (-1: the batch as a whole)."""
    may: dict[int, set[str]]
    keys: dict[int, set[str]]

    @property
    def refused(self) -> bool | None:
        """True: must be refused; False: must be accepted; None: either."""
        if self.must:
            return True
        return None if self.may else False


def judge_batch(batch: dict[str, Any], limits: Limits) -> BatchVerdict:
    must: dict[int, set[str]] = {}
    may: dict[int, set[str]] = {}
    keys: dict[int, set[str]] = {}
    for i, ev in enumerate(batch["events"]):
        v = judge_event(ev, limits)
        if v.must:
            must[i] = v.must
        if v.may:
            may[i] = v.may
        keys[i] = v.keys
    tables: list[str] = []
    for i, ev in enumerate(batch["events"]):
        if ev["table"].lower() not in tables:
            tables.append(ev["table"].lower())
            if len(tables) > limits.max_tables:
                must.setdefault(i, set()).add("tables")
    return BatchVerdict(must, may, keys)


def renderings(key: str) -> set[str]:
    """How a refusal's field may show a key (as is, or JSON-escaped either way)."""
    ascii_ = json.dumps(key)[1:-1]
    utf8 = json.dumps(key, ensure_ascii=False)[1:-1]
    return {key, ascii_, utf8, utf8.replace("\x7f", "\\u007f")}


def refusal_problems(verdict: BatchVerdict, field_: str, message: str) -> list[str]:
    """What is wrong with a refusal's field and message, given the rule's verdict."""
    broken = {i: verdict.must.get(i, set()) | verdict.may.get(i, set()) for i in set(verdict.must) | set(verdict.may)}
    named = [i for i in broken if f"events[{i}]" in field_]
    if not named:
        return [f"field {field_!r} names none of the events that break the rule: {sorted(broken)}"]
    i = named[0]
    rules = broken[i]
    if not any(word in message for r in rules for word in RULE_WORDS[r]):
        return [f"message {message!r} names none of the broken rules {sorted(rules)}"]
    if rules <= NAMED_RULES:
        shown = [k for k in verdict.keys.get(i, ()) if k and any(r[:40] in field_ for r in renderings(k))]
        if not shown and "" not in verdict.keys.get(i, ()):
            return [f"field {field_!r} shows none of the offending keys {sorted(verdict.keys.get(i, ()))[:5]}"]
    return []
