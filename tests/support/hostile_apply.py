"""What an applied hostile table must look like, checked against tests/support/hostile_model.py: the
events the door accepted, the table's schema and rows read through Spark, its side tables and
snapshot summary read through pyiceberg.

Names intact: every column and struct field of the table is a name some accepted event sent,
spelled as sent; every key of an applied event has its column (one that Spark or Iceberg takes
for it; in the tolerance zone one that case folding takes for it); two names one engine could
confuse are never two columns of one struct; a new column takes the first spelling in sort order.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from cdclake.config.settings import Settings
from cdclake.contracts.events import UNAVAILABLE
from cdclake.dev.reference import diff, expected_tables, rows_by_key, unavailable_quarantine
from cdclake.lake.catalog import load_table
from cdclake.lake.spark import table_ident
from tests.support.hostile_model import Limits, count_columns, iceberg_reserved, leaf_paths, maybe_same_name, same_name

OUTCOMES = ("applied", "duplicate", "superseded", "late", "quarantined")


@dataclass
class Projection:
    """Accepted events' images in the table's column names, and what did not fit."""

    problems: list[str] = field(default_factory=list)
    spellings: dict[tuple[str, ...], set[str]] = field(default_factory=lambda: defaultdict(set))
    """Column path -> the names events sent for it."""


def resolve(key: str, names: list[str]) -> str | None:
    if key in names:
        return key
    for related in (same_name, maybe_same_name):
        found = [n for n in names if related(key, n)]
        if len(found) == 1:
            return found[0]
    return None


def project(value: Any, dtype: Any, path: tuple[str, ...], out: Projection) -> Any:
    """``value`` as the table holds it (keys renamed to their columns); misfits in ``out``."""
    from pyspark.sql.types import ArrayType, StructType

    if isinstance(value, dict) and isinstance(dtype, StructType):
        names = [f.name for f in dtype.fields if path or not f.name.startswith("_cdc_")]
        types = {f.name: f.dataType for f in dtype.fields}
        row: dict[str, Any] = {}
        for k, v in value.items():
            col = resolve(k, names)
            if col is None:
                if v not in (None, {}):  # an empty object holds no data: no column is fine
                    out.problems.append(f"{[*path, k]}: no column for this name (columns: {names[:8]})")
                continue
            if col in row:
                out.problems.append(f"{[*path, k]}: another key of the same object is in column {col!r} too")
            out.spellings[(*path, col)].add(k)
            row[col] = project(v, types[col], (*path, col), out)
        return row
    if isinstance(value, list) and isinstance(dtype, ArrayType):
        return [project(v, dtype.elementType, (*path, "[]"), out) for v in value]
    if isinstance(value, (dict, list)):
        out.problems.append(f"{list(path)}: a {type(value).__name__} in a {dtype.simpleString()} column")
    return value


def schema_leaves(dtype: Any, top: bool = True) -> int:
    """Leaf fields of a Spark type, system columns left out."""
    from pyspark.sql.types import ArrayType, StructType

    if isinstance(dtype, StructType):
        return sum(schema_leaves(f.dataType, False) for f in dtype.fields if not (top and f.name.startswith("_cdc_")))
    if isinstance(dtype, ArrayType) and isinstance(dtype.elementType, (StructType, ArrayType)):
        return max(1, schema_leaves(dtype.elementType, False))
    return 1


def schema_problems(dtype: Any, path: tuple[str, ...] = ()) -> list[str]:
    """Two fields of one struct that Spark or Iceberg could confuse."""
    from pyspark.sql.types import ArrayType, StructType

    out = []
    if isinstance(dtype, StructType):
        names = [f.name for f in dtype.fields]
        for i, a in enumerate(names):
            out += [f"{list(path)}: columns {b!r} and {a!r} clash" for b in names[:i] if same_name(a, b)]
        for f in dtype.fields:
            out += schema_problems(f.dataType, (*path, f.name))
    elif isinstance(dtype, ArrayType):
        out += schema_problems(dtype.elementType, (*path, "[]"))
    return out


def _drop_empty(value: Any) -> Any:
    """Null, absent and ``{}`` hold the same (no data)."""
    if isinstance(value, dict):
        kept = {k: _drop_empty(v) for k, v in value.items()}
        return {k: v for k, v in kept.items() if v not in (None, {})}
    if isinstance(value, list):
        return [_drop_empty(v) for v in value]
    return value


def side_rows(settings: Settings, table: str, columns: tuple[str, ...]) -> list[tuple[Any, ...]]:
    t = load_table(settings, table)
    if t is None:
        return []
    return [tuple(r[c] for c in columns) for r in t.scan().to_arrow().to_pylist()]


def check_table(
    spark: Any,
    settings: Settings,
    limits: Limits,
    table: str,
    accepted: list[tuple[str, dict[str, Any]]],
    result: dict[str, Any],
) -> None:
    """``accepted``: (source, event) of every event the door took for ``table``, in sending order."""
    ids = {(src, e["sequence"]): e for src, e in accepted}
    assert result.get("committed"), result
    counts = {k: result[k] for k in ("received", *OUTCOMES)}
    assert counts["received"] == len(accepted), (counts, len(accepted))
    assert sum(counts[k] for k in OUTCOMES) == counts["received"], counts

    quarantined = {
        (s, q): why
        for s, q, why in side_rows(settings, table + "__quarantine", ("_cdc_source", "_cdc_seq", "_cdc_reason"))
    }
    changes = {
        (s, q): o for s, q, o in side_rows(settings, table + "__changes", ("_cdc_source", "_cdc_seq", "_cdc_outcome"))
    }
    assert not set(quarantined) & set(changes), "an event is applied or quarantined, not both"
    assert set(quarantined) | set(changes) == set(ids), set(ids) - set(quarantined) - set(changes)
    assert len(quarantined) == counts["quarantined"], (quarantined, counts)

    t = load_table(settings, table)
    snapshot = t.current_snapshot() if t is not None else None
    if snapshot is not None:
        assert snapshot.summary is not None
        summary = snapshot.summary.additional_properties
        assert {k: int(summary.get(f"cdclake.events-{k}", -1)) for k in counts} == counts, summary

    dtype = spark.table(table_ident(settings, table)).schema if t is not None else None
    assert dtype is not None or not changes, f"{table}: events applied but no table"
    if dtype is None:
        return
    assert not schema_problems(dtype), schema_problems(dtype)
    leaves = schema_leaves(dtype)
    assert leaves <= limits.max_columns, f"{table} has {leaves} leaf columns, over CDCLAKE_MAX_COLUMNS"

    fewest, _ = count_columns(
        p for e in ids.values() if isinstance(e.get("after"), dict) for p in leaf_paths(e["after"])
    )
    kept, mapped = {}, {}
    for ident, e in ids.items():
        out = Projection()
        after = project(e["after"], dtype, (), out) if isinstance(e.get("after"), dict) else None
        if ident in quarantined and any(n in quarantined[ident] for n in iceberg_reserved(e.get("after"))):
            continue  # a name Iceberg reserves, named in the reason (the contract's gap)
        assert not iceberg_reserved(e.get("after")), f"{ident}: applied a column Iceberg reserves"
        if ident in quarantined and UNAVAILABLE in quarantined[ident]:
            pass  # a placeholder with nothing to keep: the reference model says which, below
        elif ident in quarantined:
            assert "CDCLAKE_MAX_COLUMNS" in quarantined[ident], f"{ident} quarantined: {quarantined[ident]}"
            assert fewest > limits.max_columns, f"{ident} quarantined though the events make {fewest} columns"
            assert out.problems, f"{ident} quarantined for columns though the table has a column for each of its names"
            continue
        assert not out.problems, (ident, out.problems)
        kept[ident] = out
        mapped[ident] = {**e, "table": table} | ({"after": after} if after is not None else {})
    check_spellings(dtype, kept)

    batches = [{"source": s, "events": [ev]} for (s, _), ev in sorted(mapped.items(), key=lambda kv: kv[0][1])]
    held = unavailable_quarantine(batches).get(table, set())
    assert {i for i, why in quarantined.items() if UNAVAILABLE in why} == held
    # Newest event per key is applied, the others superseded (one run, sequences ascending).
    newest: dict[str, tuple[str, int]] = {}
    for ident in sorted(set(mapped) - held, key=lambda i: i[1]):
        newest[mapped[ident]["rowId"]] = ident
    want = {i: ("applied" if newest[mapped[i]["rowId"]] == i else "superseded") for i in set(mapped) - held}
    assert changes == want, sorted(set(changes.items()) ^ set(want.items()))[:5]

    expected = {k: _drop_empty(v) for k, v in expected_tables(batches).get(table, {}).items()}
    actual = {k: _drop_empty(v) for k, v in rows_by_key(spark.table(table_ident(settings, table)).collect()).items()}
    problems = diff(expected, actual)
    assert not problems, problems[:3]


def check_spellings(dtype: Any, kept: dict[Any, Projection]) -> None:
    """Every column is a name as sent, the first in sort order of the names sent for it."""
    sent: dict[tuple[str, ...], set[str]] = defaultdict(set)
    for out in kept.values():
        for path, names in out.spellings.items():
            sent[path] |= names
    for path, names in sent.items():
        assert path[-1] in names, f"column {list(path)} is none of the names sent for it: {sorted(names)}"
        assert path[-1] == min(names), (
            f"column {list(path)}: the first of {sorted(names)} in sort order is {min(names)!r}"
        )
