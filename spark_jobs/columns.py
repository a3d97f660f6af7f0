"""Which of a run's columns a table takes: spellings, the door rule, the column budget.

* Spellings: one run may hold ``Name`` and ``name`` (different events; the door refuses them in
  one object). :func:`unify_case` gives every spelling of a name one read type, so the parser
  reads each (it matches names exactly) into the same type; :func:`dedupe_case` is the type
  with one field per name (the first spelling in sort order; the table's spelling wins later,
  where values are fitted to the table by :func:`spark_jobs.schema.conform`).
* The rule: names :func:`cdclake.contracts.names.problem` refuses are never added to a table; they reach
  staging only past the door (an older receiver, a hand-made object).
* The budget: a table's user columns, counted as leaf fields (:func:`leaves`), never pass
  ``CDCLAKE_MAX_COLUMNS``. :func:`plan_columns` adds a run's new columns in order while they fit.

What is not added is never dropped silently: :func:`not_added` says why, and the apply
quarantines each event that carries a value there (:func:`extra_values`).
"""

from __future__ import annotations

from functools import reduce

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, DataType, MapType, NullType, StructField, StructType

from cdclake.contracts.names import Limits, fold, problem
from spark_jobs.schema import Path, json_merge, safe_widening, slots, spellings


def has_case_variants(t: DataType) -> bool:
    """Whether some struct in ``t`` spells one name two ways (a file source refuses that schema)."""
    if isinstance(t, StructType):
        return len(spellings(t.fields)) < len(t.fields) or any(has_case_variants(f.dataType) for f in t.fields)
    if isinstance(t, ArrayType):
        return has_case_variants(t.elementType)
    return False


def _merge(a: DataType, b: DataType) -> DataType:
    """The type holding values of both ``a`` and ``b`` (table types widen; else JSON inference's)."""
    if a == b or safe_widening(b, a):
        return a
    if safe_widening(a, b):
        return b
    if isinstance(a, StructType) and isinstance(b, StructType):
        have_b = {f.name: f.dataType for f in b.fields}
        fields = [
            StructField(f.name, _merge(f.dataType, have_b[f.name]) if f.name in have_b else f.dataType)
            for f in a.fields
        ]
        seen = {f.name for f in a.fields}
        return StructType(fields + [f for f in b.fields if f.name not in seen])
    if isinstance(a, ArrayType) and isinstance(b, ArrayType):
        return ArrayType(_merge(a.elementType, b.elementType))
    merged = json_merge(a, b)
    return NullType() if merged is None else merged


def unify_case(t: DataType) -> DataType:
    """``t`` with the spellings of each struct's names sharing one type (recursively)."""
    if isinstance(t, StructType):
        types = {
            key: unify_case(reduce(_merge, [t.fields[i].dataType for i in idx]))
            for key, idx in spellings(t.fields).items()
        }
        return StructType([StructField(f.name, types[fold(f.name)], f.nullable) for f in t.fields])
    if isinstance(t, ArrayType):
        return ArrayType(unify_case(t.elementType), t.containsNull)
    return t


def dedupe_case(t: DataType) -> DataType:
    """``t`` (unified) with one field per name: the first spelling in sort order."""
    if isinstance(t, StructType):
        fields = []
        for idx in spellings(t.fields).values():
            first = min(idx, key=lambda i: t.fields[i].name)
            f = t.fields[first]
            fields.append(StructField(f.name, dedupe_case(f.dataType), f.nullable))
        return StructType(fields)
    if isinstance(t, ArrayType):
        return ArrayType(dedupe_case(t.elementType), t.containsNull)
    return t


def leaves(t: DataType) -> int:
    """Leaf fields of a type: what ``CDCLAKE_MAX_COLUMNS`` counts (an array's elements share one)."""
    if isinstance(t, StructType):
        return sum(leaves(f.dataType) for f in t.fields)
    if isinstance(t, ArrayType):
        return leaves(t.elementType)
    if isinstance(t, MapType):
        return leaves(t.keyType) + leaves(t.valueType)
    return 1


def _lawful(t: DataType, limits: Limits) -> DataType | None:
    """``t`` without the nested fields whose names break the rule (None: nothing left)."""
    if isinstance(t, StructType):
        fields = []
        for f in t.fields:
            sub = None if problem(f.name, False, limits) else _lawful(f.dataType, limits)
            if sub is not None:
                fields.append(StructField(f.name, sub, f.nullable))
        return StructType(fields) if fields else None
    if isinstance(t, ArrayType):
        sub = _lawful(t.elementType, limits)
        return None if sub is None else ArrayType(sub, t.containsNull)
    return t


def plan_columns(
    missing: list[tuple[Path, DataType]], have: StructType, limits: Limits | None
) -> list[tuple[Path, DataType]]:
    """Of the ``missing`` columns and fields (:func:`spark_jobs.schema.missing_fields`, in
    order), those to add to a table whose user columns are ``have``: names the rule allows,
    while the user columns stay within ``limits.max_columns`` leaf fields. ``limits`` None: all
    of them (side tables mirror what their table took)."""
    if limits is None:
        return missing
    room = limits.max_columns - leaves(have)
    out = []
    for path, t in missing:
        if any(problem(name, i == 0, limits) for i, name in enumerate(path)):
            continue
        lawful = _lawful(t, limits)
        if lawful is not None and leaves(lawful) <= room:
            out.append((path, lawful))
            room -= leaves(lawful)
    return out


def not_added(name: str, top: bool, limits: Limits) -> str:
    """Why the table lacks a column or field the run has (see :func:`plan_columns`)."""
    return problem(name, top, limits) or (
        f"not added: the table would pass {limits.max_columns} leaf columns (CDCLAKE_MAX_COLUMNS)"
    )


def extra_values(col: Column, src: DataType, dst: DataType, path: str) -> list[tuple[str, str, Column]]:
    """(display path, name, holds a value) of each field of ``src`` that ``dst`` lacks, below
    ``col`` (of type ``src``): where a row's value would be lost on the way into the table."""
    out: list[tuple[str, str, Column]] = []
    if isinstance(src, StructType) and isinstance(dst, StructType):
        have = {fold(f.name): f.dataType for f in dst.fields}
        base, keys = slots(col, src)
        for f, key in zip(src.fields, keys, strict=True):
            if isinstance(f.dataType, NullType):
                continue
            sub, where = base.getField(key), f"{path}.{f.name}"
            d = have.get(fold(f.name))
            out += [(where, f.name, sub.isNotNull())] if d is None else extra_values(sub, f.dataType, d, where)
    elif isinstance(src, ArrayType) and isinstance(dst, ArrayType):
        se, de = src.elementType, dst.elementType
        inner = extra_values(F.lit(None).cast(se), se, de, path + "[]")  # the paths; values per element below

        def holds(j: int) -> Column:
            return F.exists(col, lambda x: extra_values(x, se, de, path + "[]")[j][2])

        out += [(where, name, F.coalesce(holds(j), F.lit(False))) for j, (where, name, _) in enumerate(inner)]
    return out
