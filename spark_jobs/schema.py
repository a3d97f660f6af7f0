"""Types of a run's after-images against a table's schema.

A run's staging objects are read twice: Spark's JSON inference first (it names the run's columns
and types the ones the table does not have yet), then with an explicit *read type* per column
(:func:`read_type`): the TABLE's type for every column and struct field it already has, the
inferred type for what is new. Spark's JSON parser then converts each value straight to the
table's type, value by value; a value it cannot convert makes its event a corrupt record, which
the apply job quarantines. Against the table we then:
* add columns (top level, inside structs, inside arrays of structs) the table lacks;
* widen a column when Iceberg allows it (int->long, float->double, decimal precision up).

Structs are rebuilt field by field BY NAME (:func:`conform`): Spark's struct-to-struct cast is
positional, and inference orders fields alphabetically while the table keeps them in the order
they were added.

Names are matched ignoring case (:func:`cdclake.contracts.names.fold`), as Spark and Iceberg look them up.
One run may hold several spellings of one name (``Name`` in one event, ``name`` in another):
Spark cannot resolve such a struct's fields by name, so :func:`slots` renames them by position
first, and :func:`conform` merges the spellings into the table's one field. Nested paths are
tuples of names; spark_jobs.sqltext quotes them wherever they become SQL.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import reduce

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    DataType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    NullType,
    StringType,
    StructField,
    StructType,
)

from cdclake.contracts.names import fold


def safe_widening(src: DataType, dst: DataType) -> bool:
    """Iceberg's allowed promotions of a ``dst`` column to hold ``src`` values."""
    if isinstance(dst, IntegerType) and isinstance(src, LongType):
        return True
    if isinstance(dst, FloatType) and isinstance(src, DoubleType):
        return True
    return (
        isinstance(dst, DecimalType)
        and isinstance(src, DecimalType)
        and src.scale == dst.scale
        and src.precision > dst.precision
    )


Path = tuple[str, ...]


def spellings(fields: Sequence[StructField]) -> dict[str, list[int]]:
    """Positions of ``fields`` per name ignoring case, in first-seen order."""
    out: dict[str, list[int]] = {}
    for i, f in enumerate(fields):
        out.setdefault(fold(f.name), []).append(i)
    return out


def slots(col: Column, t: StructType) -> tuple[Column, list[str]]:
    """``col`` (of struct type ``t``) and the names to ``getField`` its fields by, in order.
    Where ``t`` spells one name several ways, ``getField`` is ambiguous: the struct is cast
    (positionally) to fields named by their position."""
    if len(spellings(t.fields)) == len(t.fields):
        return col, [f.name for f in t.fields]
    keys = [f"_{i}" for i in range(len(t.fields))]
    return col.cast(
        StructType([StructField(k, f.dataType, f.nullable) for k, f in zip(keys, t.fields, strict=True)])
    ), keys


def missing_fields(src: DataType, dst: DataType, path: Path = ()) -> list[tuple[Path, DataType]]:
    """(path, type) of every nested field in ``src`` that ``dst`` lacks."""
    out: list[tuple[Path, DataType]] = []
    if isinstance(src, StructType) and isinstance(dst, StructType):
        have = {fold(f.name): f for f in dst.fields}
        for f in src.fields:
            sub = (*path, f.name)
            if fold(f.name) not in have:
                if not isinstance(f.dataType, NullType):
                    out.append((sub, f.dataType))
            else:
                out += missing_fields(f.dataType, have[fold(f.name)].dataType, sub)
    elif isinstance(src, ArrayType) and isinstance(dst, ArrayType):
        out += missing_fields(src.elementType, dst.elementType, (*path, "element"))
    return out


def widenings(src: DataType, dst: DataType, path: Path = ()) -> list[tuple[Path, DataType]]:
    """(path, new type) of every column to promote so ``dst`` holds ``src``."""
    if safe_widening(src, dst):
        return [(path, src)]
    out: list[tuple[Path, DataType]] = []
    if isinstance(src, StructType) and isinstance(dst, StructType):
        have = {fold(f.name): f for f in dst.fields}
        for f in src.fields:
            if fold(f.name) in have:
                out += widenings(f.dataType, have[fold(f.name)].dataType, (*path, f.name))
    return out


def conform(col: Column, src: DataType, dst: DataType) -> tuple[Column, Column]:
    """``(value as dst, bad)``: bad is true where a non-null value does not fit ``dst``.
    Spellings of one field in ``src`` (see :func:`slots`) merge into ``dst``'s one field."""
    if src == dst:
        return col, F.lit(False)
    if isinstance(src, NullType):
        return F.lit(None).cast(dst), F.lit(False)
    if isinstance(src, StructType) and isinstance(dst, StructType):
        base, keys = slots(col, src)
        have = spellings(src.fields)
        values, bads = [], []
        for f in dst.fields:
            parts = [
                conform(base.getField(keys[i]), src.fields[i].dataType, f.dataType) for i in have.get(fold(f.name), [])
            ]
            if not parts:
                v, b = F.lit(None).cast(f.dataType), F.lit(False)
            elif len(parts) == 1:
                v, b = parts[0]
            else:
                v, b = F.coalesce(*[p[0] for p in parts]), any_of([p[1] for p in parts])
            values.append(v.alias(f.name))
            bads.append(b)
        rebuilt = F.when(col.isNull(), F.lit(None).cast(dst)).otherwise(F.struct(*values))
        return rebuilt, F.coalesce(any_of(bads), F.lit(False))
    if isinstance(src, ArrayType) and isinstance(dst, ArrayType):
        es, ed = src.elementType, dst.elementType
        value = F.transform(col, lambda x: conform(x, es, ed)[0])
        bad = F.coalesce(F.exists(col, lambda x: conform(x, es, ed)[1]), F.lit(False))
        return value, bad
    if isinstance(src, (StructType, ArrayType)) or isinstance(dst, (StructType, ArrayType)):
        return F.lit(None).cast(dst), col.isNotNull()
    cast = col.try_cast(dst)
    bad = col.isNotNull() & (cast.isNull() | (cast.cast(src) != col))
    return cast, F.coalesce(bad, F.lit(True))


def any_of(conditions: Sequence[Column]) -> Column:
    """The OR of ``conditions`` (false for none) as a balanced tree. A chain nests a level per
    term, and the Spark Connect client cannot build an expression nested about 50 calls deep:
    an object of 50 fields was one (tests/jobs/test_semantics.py)."""
    if len(conditions) <= 1:
        return conditions[0] if conditions else F.lit(False)
    half = len(conditions) // 2
    return any_of(conditions[:half]) | any_of(conditions[half:])


# ---------------------------------------------------------------- read types


def json_merge(a: DataType | None, b: DataType | None) -> DataType | None:
    """The type Spark's JSON inference gives values of types ``a`` and ``b`` (None: only nulls)."""
    if a is None or isinstance(a, NullType):
        return b
    if b is None or isinstance(b, NullType) or a == b:
        return a
    if isinstance(a, StructType) and isinstance(b, StructType):
        names = sorted({f.name for f in a.fields} | {f.name for f in b.fields})
        have_a, have_b = {f.name: f.dataType for f in a.fields}, {f.name: f.dataType for f in b.fields}
        return StructType([StructField(n, _or_null(json_merge(have_a.get(n), have_b.get(n)))) for n in names])
    if isinstance(a, ArrayType) and isinstance(b, ArrayType):
        return ArrayType(_or_null(json_merge(a.elementType, b.elementType)))
    numbers = {type(a), type(b)}
    if numbers <= {LongType, DoubleType, DecimalType}:
        if DoubleType in numbers:
            return DoubleType()
        da, db = (t if isinstance(t, DecimalType) else DecimalType(20, 0) for t in (a, b))
        scale = max(da.scale, db.scale)
        digits = max(da.precision - da.scale, db.precision - db.scale)
        return DecimalType(digits + scale, scale) if digits + scale <= 38 else DoubleType()
    return StringType()  # anything else mixed: each value's JSON text


def _or_null(t: DataType | None) -> DataType:
    # Not ``t or NullType()``: an empty StructType is falsy.
    return NullType() if t is None else t


def json_canonical(t: DataType | None) -> DataType | None:
    """Spark's last inference step: null-only becomes string, empty structs are dropped."""
    if t is None or isinstance(t, NullType):
        return StringType()
    if isinstance(t, StructType):
        fields = []
        for f in t.fields:
            ft = json_canonical(f.dataType)
            if f.name and ft is not None:
                fields.append(StructField(f.name, ft))
        return StructType(fields) if fields else None
    if isinstance(t, ArrayType):
        et = json_canonical(t.elementType)
        return ArrayType(et) if et is not None else None
    return t


def read_type(table: DataType | None, values: Sequence[DataType]) -> DataType | None:
    """The type a run reads a column as, given the table's type (None: a new column) and the
    types of the run's values (their inferred merge, or each distinct value's own type).

    New columns and struct fields take Spark's JSON inference over the values; existing ones keep
    the table's type (widened where a value needs it and Iceberg allows). Where the table has a
    struct (array), only the run's object (array) values can bring new fields: the others do not
    fit anyway. None: nothing to read (the column only ever held empty objects).
    """
    if table is None:
        return json_canonical(reduce(json_merge, values, None))
    if isinstance(table, StructType):
        objects = [v for v in values if isinstance(v, StructType)]
        fields = []
        matched: set[str] = set()
        for f in table.fields:
            subs = [g for o in objects for g in o.fields if fold(g.name) == fold(f.name)]
            spelled = sorted({g.name for g in subs}) or [f.name]  # the parser matches names exactly
            for name in spelled:
                t = read_type(f.dataType, [g.dataType for g in subs if g.name == name])
                fields.append(StructField(name, f.dataType if t is None else t, f.nullable))
            matched.add(fold(f.name))
        new = sorted({g.name for o in objects for g in o.fields if fold(g.name) not in matched})
        for name in new:
            t = read_type(None, [g.dataType for o in objects for g in o.fields if g.name == name])
            if t is not None:
                fields.append(StructField(name, t))
        return StructType(fields)
    if isinstance(table, ArrayType):
        elements = [v.elementType for v in values if isinstance(v, ArrayType)]
        t = read_type(table.elementType, elements)
        return ArrayType(table.elementType if t is None else t, table.containsNull)
    if isinstance(table, MapType):
        return table
    wider = [v for v in values if safe_widening(v, table)]
    return max(wider, key=lambda t: t.precision if isinstance(t, DecimalType) else 0) if wider else table


def hides_fields(table: DataType, inferred: DataType) -> bool:
    """Whether inference merged objects (arrays) with other values into a string where the table
    holds a struct (array): the run's new fields there are only seen value by value."""
    if isinstance(table, (StructType, ArrayType)) and isinstance(inferred, StringType):
        return True
    if isinstance(table, StructType) and isinstance(inferred, StructType):
        have = {fold(f.name): f.dataType for f in table.fields}
        return any(hides_fields(have[fold(f.name)], f.dataType) for f in inferred.fields if fold(f.name) in have)
    if isinstance(table, ArrayType) and isinstance(inferred, ArrayType):
        return hides_fields(table.elementType, inferred.elementType)
    return False


_VARIANT_TOKEN = re.compile(r"\s*(`(?:[^`]|``)*`|[A-Za-z_][A-Za-z0-9_]*|\(\s*\d+\s*,\s*\d+\s*\)|[<>:,])")
_VARIANT_LEAVES: dict[str, DataType | None] = {
    "BOOLEAN": BooleanType(),
    "STRING": StringType(),
    "TINYINT": LongType(),
    "SMALLINT": LongType(),
    "INT": LongType(),
    "BIGINT": LongType(),
    # A JSON number with a fraction or exponent; the variant of 7.0 is DECIMAL(1,0), so every
    # decimal is one (integers beyond a long, decimals for JSON inference, are typed double here).
    "DECIMAL": DoubleType(),
    "FLOAT": DoubleType(),
    "DOUBLE": DoubleType(),
    "VOID": None,
    "VARIANT": StringType(),  # an array of mixed elements: JSON inference reads them as text
}


def variant_json_type(text: str) -> DataType | None:
    """A ``schema_of_variant`` result (one JSON value's shape) as Spark's JSON inference types the
    value: integers bigint, other numbers double, objects structs; None for null."""
    tokens = [m.group(1) for m in _VARIANT_TOKEN.finditer(text)]
    pos = 0

    def take(expected: str | None = None) -> str:
        nonlocal pos
        tok = tokens[pos]
        if expected is not None and tok != expected:
            raise ValueError(f"unexpected {tok!r} in variant schema {text!r}")
        pos += 1
        return tok

    def parse() -> DataType | None:
        word = take().upper()
        if word == "OBJECT":
            take("<")
            fields = []
            while tokens[pos] != ">":
                name = take()
                if name.startswith("`"):
                    name = name[1:-1].replace("``", "`")
                take(":")
                fields.append(StructField(name, _or_null(parse())))
                if tokens[pos] == ",":
                    take(",")
            take(">")
            return StructType(fields)
        if word == "ARRAY":
            take("<")
            element = parse()
            take(">")
            return ArrayType(_or_null(element))
        if word == "DECIMAL" and pos < len(tokens) and tokens[pos].startswith("("):
            take()
        if word not in _VARIANT_LEAVES:
            raise ValueError(f"unknown type {word!r} in variant schema {text!r}")
        return _VARIANT_LEAVES[word]

    return parse()
