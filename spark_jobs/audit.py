"""Audit before publish: each table's expectations (:mod:`cdclake.config.expectations`) checked on
the snapshot the run staged for it, before anything is visible (write-audit-publish).

The staged table is read at its staged snapshot (``versionAsOf``): every row the publish would
show, not only the run's. Key and check expectations are one aggregate over it (the key's
uniqueness one more job); the row-count change comes from the snapshots' summaries (Iceberg's
``total-records`` less its deletes), with no scan. The checks' predicates are the operator's
configuration, parsed by Spark as one expression each."""

from __future__ import annotations

from collections.abc import Mapping

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from cdclake.config.expectations import Expectations
from cdclake.config.tables import TableOptions
from cdclake.lake.catalog import load_table
from cdclake.lake.holds import Failure
from spark_jobs.schema import any_of
from spark_jobs.stage import Stage
from spark_jobs.system import KEY


def audit(spark: SparkSession, stage: Stage, options: Mapping[str, TableOptions]) -> list[Failure]:
    """The failing expectations of the staged tables (each table's options by name)."""
    out: list[Failure] = []
    for table, opts in sorted(options.items()):
        expect = opts.expectations
        if not expect or table not in stage.moves:
            continue
        staged, parent = stage.moves[table]
        ident = f"{stage.settings.catalog_name}.{stage.settings.namespace}.{table}"
        df = spark.read.format("iceberg").option("versionAsOf", staged).load(ident)
        out += _rows(table, df, expect, opts.key)
        out += _count_change(stage, table, staged, parent, expect)
    return out


def _rows(table: str, df: DataFrame, expect: Expectations, key: tuple[str, ...]) -> list[Failure]:
    columns = [c for c in key if c in df.columns] if key else []
    cols = columns if columns and len(columns) == len(key) else [KEY]
    measures: dict[str, Column] = {}
    if expect.key_not_null:
        null = any_of([F.col(f"`{c}`").isNull() for c in cols])
        measures["key_not_null"] = F.sum(F.when(null, 1).otherwise(0))
    failures: list[Failure] = []
    for name, predicate in expect.checks.items():
        try:
            measures[f"checks.{name}"] = F.sum(F.when(~F.coalesce(F.expr(predicate), F.lit(True)), 1).otherwise(0))
        except Exception as exc:  # the operator's predicate does not parse: the check fails, named
            failures.append(Failure(table, f"checks.{name}", f"cannot be read: {str(exc).splitlines()[0][:300]}"))
    if measures:
        try:
            row = df.agg(*[m.alias(f"m{i}") for i, m in enumerate(measures.values())]).collect()[0]
        except Exception as exc:  # e.g. a check naming a column the table lacks
            return [*failures, Failure(table, "checks", f"cannot be evaluated: {str(exc).splitlines()[0][:300]}")]
        for i, name in enumerate(measures):
            bad = int(row[f"m{i}"] or 0)
            if bad:
                what = "without their key" if name == "key_not_null" else f"where {expect.checks[name[7:]]} is false"
                failures.append(Failure(table, name, f"{bad} rows {what}"))
    if expect.key_unique:
        dup = df.groupBy(*[F.col(f"`{c}`") for c in cols]).count().where(F.col("count") > 1).count()
        if dup:
            failures.append(Failure(table, "key_unique", f"{dup} keys ({', '.join(cols)}) held by more than one row"))
    return failures


def _count_change(stage: Stage, table: str, staged: int, parent: int | None, expect: Expectations) -> list[Failure]:
    if expect.max_rows_added is None and expect.max_rows_removed is None:
        return []
    t = load_table(stage.settings, table)
    if t is None:
        return []
    after = _rows_of(t.snapshot_by_id(staged))
    before = _rows_of(t.snapshot_by_id(parent)) if parent is not None else 0
    change = after - before
    out = []
    if expect.max_rows_added is not None and change > expect.max_rows_added:
        out.append(Failure(table, "max_rows_added", f"{change} rows added, at most {expect.max_rows_added} expected"))
    if expect.max_rows_removed is not None and -change > expect.max_rows_removed:
        out.append(
            Failure(table, "max_rows_removed", f"{-change} rows removed, at most {expect.max_rows_removed} expected")
        )
    return out


def _rows_of(snapshot: object) -> int:
    summary = getattr(getattr(snapshot, "summary", None), "additional_properties", {}) or {}
    total = int(summary.get("total-records", 0))
    return total - int(summary.get("total-position-deletes", 0)) - int(summary.get("total-equality-deletes", 0))
