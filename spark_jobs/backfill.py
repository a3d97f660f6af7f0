"""Source defaults for the rows a column added in the source never reached (issue 14, F5).

``ALTER TABLE docs ADD COLUMN score int NOT NULL DEFAULT 0`` gives every existing row 0 in the
source but emits no event for them; later events declare the default (``columnDefaults``,
:mod:`spark_jobs.declared`). When the apply adds such a column it first records, as a table
property ``cdclake.default-backfill.<column>``, the default (text), the column's type and the
threshold (the lowest ordering value of the run's events that have the column); then it adds
the column. After the run's MERGE has committed (still under the table lock) each recorded
column gets its default where it is NULL in a row ordered below the threshold: rows written
before the column existed, in earlier runs or earlier in this one. Rows from events that have
the column keep their value, a NULL too. Then the property is removed.

Property first, then the column: a crash between the two leaves the property, and the re-run
(which re-adds the column) still fills the rows; a crash between the MERGE and the fill leaves
it too, and the next run fills them. Filling twice changes nothing: a filled row is not NULL.
Values never go into SQL text (named parameter markers); names only quoted
(:mod:`spark_jobs.sqltext`); the type is read back only in the vocabulary of
:mod:`cdclake.contracts.coltypes`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql.types import ArrayType, DataType, MapType, StructType

from cdclake.contracts import coltypes
from cdclake.contracts.names import fold
from spark_jobs.declared import Declared
from spark_jobs.sqltext import quote, sql_type, string_literal

PREFIX = "cdclake.default-backfill."


@dataclass(frozen=True)
class Backfill:
    default: str
    type: str
    threshold: list[int]

    def encode(self) -> str:
        return json.dumps({"default": self.default, "type": self.type, "threshold": self.threshold}, sort_keys=True)

    @staticmethod
    def decode(text: str) -> Backfill | None:
        """None for a property this module did not write (it then fills nothing)."""
        try:
            obj = json.loads(text)
            kind = coltypes.canonical(obj["type"])
        except (ValueError, TypeError, KeyError):
            return None
        default, threshold = obj.get("default"), obj.get("threshold")
        ok = (
            isinstance(default, str)
            and not kind.startswith("array<")
            and isinstance(threshold, list)
            and 1 <= len(threshold) <= 4
            and all(isinstance(x, int) and not isinstance(x, bool) for x in threshold)
        )
        return Backfill(default, kind, threshold) if ok else None


def planned(declared: Declared, adds: Sequence[tuple[tuple[str, ...], DataType]], created: bool) -> dict[str, Backfill]:
    """The top-level columns among ``adds`` that need a backfill: a default is declared and a row
    may predate the column. In a table created by this run (``created``) only this run's rows
    exist, so a column every event of the run has (its threshold is the run's first ordering
    value) needs none: a table created with its defaults costs no UPDATE."""
    out: dict[str, Backfill] = {}
    for path, t in adds:
        name = fold(path[0])
        if len(path) != 1 or isinstance(t, StructType | ArrayType | MapType) or name not in declared.defaults:
            continue
        threshold = declared.thresholds[name]
        if created and declared.first is not None and threshold <= declared.first:
            continue
        try:
            kind = coltypes.canonical(sql_type(t))
        except ValueError:
            continue  # a type the vocabulary has no cast for: the rows stay NULL
        out[path[0]] = Backfill(declared.defaults[name], kind, threshold)
    return out


def mark(spark: SparkSession, ident: str, backfills: Mapping[str, Backfill]) -> None:
    """Record the backfills as table properties (before their columns are added)."""
    pairs = ", ".join(f"{string_literal(PREFIX + c)}={string_literal(b.encode())}" for c, b in backfills.items())
    spark.sql(f"ALTER TABLE {ident} SET TBLPROPERTIES ({pairs})")


def _value(b: Backfill, param: str, strict: bool) -> str:
    """SQL of the default as the column's value. Binary values come base64, as in the events."""
    if b.type == "binary":
        return f"{'' if strict else 'try_'}to_binary(:{param}, 'base64')"
    return f"{'cast' if strict else 'try_cast'}(:{param} AS {b.type})"


def fill(spark: SparkSession, ident: str, properties: Mapping[str, str], row_order: str) -> list[str]:
    """Run the backfills the table's ``properties`` record, in one UPDATE, then remove them; the
    columns filled. ``row_order`` is the SQL of a row's ordering value. A default its column's
    type cannot hold (a value Debezium sends as text saying it does not fit) fills nothing, and a
    property naming a column the table lacks is stale (the column is re-marked when added)."""
    keys = sorted(k for k in properties if k.startswith(PREFIX))
    if not keys:
        return []
    columns = set(spark.table(ident).columns)
    found = {k[len(PREFIX) :]: Backfill.decode(properties[k]) for k in keys}
    todo = {c: b for c, b in found.items() if b is not None and c in columns}
    if todo:
        names = list(todo)
        args: dict[str, Any] = {f"v{j}": todo[c].default for j, c in enumerate(names)}
        checks = ", ".join(f"{_value(todo[c], f'v{j}', False)} IS NOT NULL AS ok{j}" for j, c in enumerate(names))
        ok = spark.sql(f"SELECT {checks}", args=args).first()
        assert ok is not None
        todo = {c: todo[c] for j, c in enumerate(names) if ok[f"ok{j}"]}
    if todo:
        _update(spark, ident, todo, row_order)
    spark.sql(f"ALTER TABLE {ident} UNSET TBLPROPERTIES ({', '.join(string_literal(k) for k in keys)})")
    return sorted(todo)


def _update(spark: SparkSession, ident: str, todo: Mapping[str, Backfill], row_order: str) -> None:
    sets: list[str] = []
    where: list[str] = []
    args: dict[str, Any] = {}
    for j, (c, b) in enumerate(todo.items()):
        q = quote(c)
        predates = f"{q} IS NULL AND {row_order} < CAST(:t{j} AS array<bigint>)"
        sets.append(f"{q} = CASE WHEN {predates} THEN {_value(b, f'v{j}', True)} ELSE {q} END")
        where.append(f"({predates})")
        args[f"v{j}"], args[f"t{j}"] = b.default, b.threshold
    spark.sql(f"UPDATE {ident} SET {', '.join(sets)} WHERE {' OR '.join(where)}", args=args)
