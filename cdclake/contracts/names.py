"""The door rule for column names and event shapes: what a producer may put in a row image.

Every key at every depth of an event's ``after`` and ``before`` objects (objects inside arrays
too) is a column or struct field name once applied, so the receiver checks them before it lands
anything, and the apply job applies the same rule to whatever reached staging another way:

* a name is 1..``CDCLAKE_MAX_NAME_CHARS`` characters (default 128);
* it holds no backtick, no dot and no control character (U+0000-U+001F, U+007F); anything else
  is legal and applies with the name intact (spaces, dashes, ``@``, ``:``, quotes, ``<>``,
  commas, parentheses, SQL keywords and fragments, any Unicode);
* top-level names starting with ``_cdc_``, in any letter case, are reserved (system columns);
* top-level names of Iceberg's metadata columns (``_file``, ``_pos``, ``_deleted``, ``_spec_id``,
  ``_partition``, ``_row_id``, ``_last_updated_sequence_number``), in any letter case, are
  reserved: a data column so named hides the metadata column that Spark's row-level MERGE
  needs, and every later apply of the table would fail;
* no two keys of one object are equal ignoring case (:func:`fold`, or lower-cased as Java
  does): Spark and Iceberg look columns up that way;
* objects and arrays nest at most ``CDCLAKE_MAX_DEPTH`` deep (default 32; the image is depth 1);
* an image has at most ``CDCLAKE_MAX_COLUMNS`` leaf fields (default 1000), counted as the
  columns it would make: the elements of an array share one shape, so 5,000 numbers are one.

The same name in different letter case in different objects (``Name`` in one event, ``name`` in
another) is legal: the apply maps both to one column.

:func:`check_image` is one pass over the image, without copies; flat objects of plain names are
checked with a few C-level string operations per object, not per key.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import chain
from typing import Any, Protocol

RESERVED_PREFIX = "_cdc_"
ICEBERG_METADATA_COLUMNS = frozenset(
    ("_file", "_pos", "_deleted", "_spec_id", "_partition", "_row_id", "_last_updated_sequence_number")
)
"""Iceberg's ``MetadataColumns`` names (Iceberg 1.x, format v3 row lineage included)."""
DEFAULT_MAX_NAME_CHARS = 128
DEFAULT_MAX_DEPTH = 32
DEFAULT_MAX_COLUMNS = 1000
MAX_DEPTH_CEILING = 100
"""CDCLAKE_MAX_DEPTH above this is refused: the check, Spark's JSON inference and its nested
expressions recurse once per level."""

_BAD = re.compile(r"[`.\x00-\x1f\x7f]")
_PLAIN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_CONTAINERS = frozenset((dict, list))
_OBJECTS = frozenset((dict,))


_KNOWN_MAX_ENTRIES, _KNOWN_MAX_KEYS = 256, 256


class LimitSettings(Protocol):
    """What :meth:`Limits.of` reads: ``cdclake.config.settings.Settings`` has these fields (a
    structural type, so the contracts import nothing of the configuration)."""

    @property
    def max_name_chars(self) -> int: ...
    @property
    def max_depth(self) -> int: ...
    @property
    def max_columns(self) -> int: ...


@dataclass(frozen=True)
class Limits:
    max_name_chars: int = DEFAULT_MAX_NAME_CHARS
    max_depth: int = DEFAULT_MAX_DEPTH
    max_columns: int = DEFAULT_MAX_COLUMNS
    # Key sets already found good, top-level and nested: the events of one table mostly share
    # theirs, and the check of a known set is one tuple and one lookup. Bounded (entries, keys
    # per entry); cleared when full.
    _known_top: set[tuple[str, ...]] = field(default_factory=set, compare=False, repr=False)
    _known: set[tuple[str, ...]] = field(default_factory=set, compare=False, repr=False)

    @classmethod
    def of(cls, settings: LimitSettings) -> Limits:
        return cls(settings.max_name_chars, settings.max_depth, settings.max_columns)


DEFAULT = Limits()


class Refused(ValueError):
    """A name or shape breaks the rule; ``field`` is the JSON path below the image."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class _Bad(Exception):
    """Raised deep in the walk; each level on the way out adds its path segment (no path is
    built unless something is wrong)."""

    def __init__(self, message: str, segment: str = "") -> None:
        self.message = message
        self.segments = [segment] if segment else []


def quote(name: str) -> str:
    """One SQL identifier whatever ``name`` holds: ``a`b`` -> ```a``b``` (Spark's parser reads
    a backtick-quoted identifier with its backticks doubled back as exactly that name)."""
    return "`" + name.replace("`", "``") + "`"


def fold(name: str) -> str:
    """The name as Spark and Iceberg compare it ignoring case. Unicode case folding, plus the
    Turkish dotted and dotless i, which Java's ``equalsIgnoreCase`` equates with ``i``: two
    names that any of their lookups could confuse fold alike."""
    return name.replace("\u0130", "i").replace("\u0131", "i").casefold()


def is_reserved(name: str) -> bool:
    """A top-level name of the system columns' namespace."""
    return name[:5].lower() == RESERVED_PREFIX


def is_iceberg_metadata(name: str) -> bool:
    """A top-level name that would shadow one of Iceberg's metadata columns (compared as Spark
    resolves columns, ignoring case)."""
    return name[:1] == "_" and fold(name) in ICEBERG_METADATA_COLUMNS


def problem(name: str, top: bool = False, limits: Limits = DEFAULT) -> str | None:
    """What is wrong with one name under the rule (None: nothing)."""
    if not name:
        return f"column name is empty (names are 1..{limits.max_name_chars} characters, CDCLAKE_MAX_NAME_CHARS)"
    if len(name) > limits.max_name_chars:
        return (
            f"column name has {len(name)} characters, over the limit of {limits.max_name_chars} "
            "(CDCLAKE_MAX_NAME_CHARS)"
        )
    bad = _BAD.search(name)
    if bad:
        ch = bad.group()
        what = "a backtick" if ch == "`" else "a dot" if ch == "." else f"a control character (U+{ord(ch):04X})"
        return f"column name contains {what}; names may not contain backticks, dots or control characters"
    if top and is_reserved(name):
        return f"top-level names starting with {RESERVED_PREFIX} (any letter case) are reserved for system columns"
    if top and is_iceberg_metadata(name):
        return (
            f"top-level name {name!r} is reserved for Iceberg's metadata columns "
            f"({', '.join(sorted(ICEBERG_METADATA_COLUMNS))}, any letter case)"
        )
    return None


def segment(name: str) -> str:
    """One key as a JSON path segment: ``.name`` when plain, else ``["a b"]``."""
    if _PLAIN.fullmatch(name):
        return "." + name
    shown = name if len(name) <= 200 else name[:200] + "…"
    return "[" + json.dumps(shown, ensure_ascii=False).replace("\x7f", "\\u007f") + "]"


def check_image(image: dict[str, Any], limits: Limits = DEFAULT) -> None:
    """Raise :class:`Refused` (``field`` relative to the image, e.g. ``.doc["a b"]``) if the
    image breaks the rule."""
    # The common case in one step: a flat image whose key set is known good.
    if (
        tuple(image) in limits._known_top
        and len(image) <= limits.max_columns
        and _CONTAINERS.isdisjoint(map(type, image.values()))
    ):
        return
    try:
        leaves = _object(image, 1, True, limits)
    except _Bad as bad:
        raise Refused("".join(reversed(bad.segments)), bad.message) from None
    if leaves > limits.max_columns:
        raise Refused("", f"{leaves} leaf fields, over the limit of {limits.max_columns} columns (CDCLAKE_MAX_COLUMNS)")


def _too_deep(limits: Limits) -> _Bad:
    return _Bad(f"nesting deeper than {limits.max_depth} levels of objects and arrays (CDCLAKE_MAX_DEPTH)")


def _object(obj: dict[str, Any], depth: int, top: bool, limits: Limits) -> int:
    """Check one object's keys and what is below them; returns its leaf count."""
    if depth > limits.max_depth:
        raise _too_deep(limits)
    if not obj:
        return 0
    known = limits._known_top if top else limits._known
    names = tuple(obj)
    if names not in known:
        _keys(obj, top, limits)
        _remember(known, names)
    if _CONTAINERS.isdisjoint(map(type, obj.values())):
        return len(obj)
    leaves = 0
    for k, v in obj.items():
        kind = type(v)
        try:
            if kind is dict:
                leaves += _object(v, depth + 1, False, limits)
            elif kind is list:
                leaves += _array(v, depth + 1, limits)
            else:
                leaves += 1
        except _Bad as bad:
            bad.segments.append(segment(k))
            raise
    return leaves


def _array(arr: list[Any], depth: int, limits: Limits) -> int:
    """Check each element; the leaf count is that of the elements' shared shape."""
    if depth > limits.max_depth:
        raise _too_deep(limits)
    kinds = set(map(type, arr))
    if kinds.isdisjoint(_CONTAINERS):
        return 1
    if (
        kinds == _OBJECTS
        and depth < limits.max_depth
        and _CONTAINERS.isdisjoint(map(type, chain.from_iterable(map(dict.values, arr))))
    ):
        # Objects of scalars (line items): their keys' union holds every name once. Good names
        # without a case clash there mean good names in each element; the count is the union's.
        keys = set().union(*arr)
        names = tuple(keys)
        if names in limits._known or not _keys_problem(keys, limits):
            _remember(limits._known, names)
            return max(len(keys), 1)
    counts = []
    flat = True  # every container element is an object of scalars
    for i, v in enumerate(arr):
        kind = type(v)
        if kind not in _CONTAINERS:
            continue
        try:
            if kind is dict:
                counts.append(_object(v, depth + 1, False, limits))
                flat = flat and _CONTAINERS.isdisjoint(map(type, v.values()))
            else:
                counts.append(_array(v, depth + 1, limits))
                flat = False
        except _Bad as bad:
            bad.segments.append(f"[{i}]")
            raise
    if not counts:
        return 1
    if len(counts) == 1:
        return max(counts[0], 1)
    if flat:  # the union of the objects' keys, plus one for scalar elements beside them
        return max(len(set().union(*(v for v in arr if type(v) is dict))) + (len(counts) < len(arr)), 1)
    shape: set[tuple[str, ...]] = set()
    for v in arr:
        _paths(v, (), shape)
    return len(shape)


def _paths(value: Any, prefix: tuple[str, ...], out: set[tuple[str, ...]]) -> None:
    """Leaf paths of a value, array elements under one path (the union is the column count)."""
    if type(value) is dict:
        for k, v in value.items():
            _paths(v, (*prefix, k), out)
    elif type(value) is list:
        for v in value:
            _paths(v, (*prefix, "[]"), out)
        if not value:
            out.add(prefix)
    else:
        out.add(prefix)


def _remember(known: set[tuple[str, ...]], names: tuple[str, ...]) -> None:
    if len(names) <= _KNOWN_MAX_KEYS:
        if len(known) >= _KNOWN_MAX_ENTRIES:
            known.clear()
        known.add(names)


def _keys_problem(keys: set[str], limits: Limits) -> bool:
    """Whether a set of nested names holds one the rule refuses or two equal ignoring case."""
    joined = "".join(keys)
    if "" in keys or _BAD.search(joined) or max(map(len, keys), default=0) > limits.max_name_chars:
        return True
    return not (joined == joined.lower() and joined.isascii()) and _clashing(keys)


def _keys(obj: dict[str, Any], top: bool, limits: Limits) -> None:
    """The rule on one object's keys: each name, then case clashes among them."""
    joined = "".join(obj)
    lowered = joined.lower()
    if "" in obj or _BAD.search(joined) or max(map(len, obj)) > limits.max_name_chars:
        _name_problem(obj, top, limits)
    if top and (RESERVED_PREFIX in lowered or any(map(is_iceberg_metadata, obj))):
        _name_problem(obj, top, limits)
    # Plain lower-case ASCII names are their own folds, and dict keys are distinct.
    if not (lowered == joined and joined.isascii()) and _clashing(obj):
        _clash(obj)


def _name_problem(obj: dict[str, Any], top: bool, limits: Limits) -> None:
    for k in obj:
        why = problem(k, top, limits)
        if why:
            raise _Bad(why, segment(k))


def _clashing(keys: Iterable[str]) -> bool:
    """Two of the (distinct) keys are one name to some engine: equal after :func:`fold`, or
    after Java's ``toLowerCase(Locale.ROOT)`` (Iceberg's case-insensitive lookup; Python's
    ``str.lower`` maps alike), which equates ``İ`` with ``i̇`` where folding does not."""
    keys = list(keys)
    return len({fold(k) for k in keys}) < len(keys) or len({k.lower() for k in keys}) < len(keys)


def _clash(obj: dict[str, Any]) -> None:
    seen: dict[str, str] = {}
    for k in obj:
        other = seen.setdefault(fold(k), k)
        if other == k:
            other = seen.setdefault("\0" + k.lower(), k)  # NUL: no folded name starts with it
        if other != k:
            raise _Bad(
                f"{other!r} and {k!r} differ only in letter case within one object "
                "(column names are matched ignoring case)",
                segment(k),
            )
