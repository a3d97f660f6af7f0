"""Fitting events to the table: each value in its column's table type, or the event quarantined
with a reason (a value that does not fit, a column the table did not take, a value the parser
refused), and placeholders for unavailable values listed, to keep what is stored."""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import NullType, StringType, StructField, StructType, VariantType

from cdclake.contracts import names
from cdclake.contracts.coltypes import companion
from cdclake.contracts.events import UNAVAILABLE
from cdclake.contracts.names import Limits, fold, is_reserved
from spark_jobs.columns import extra_values, not_added
from spark_jobs.read import JSON_OPTIONS
from spark_jobs.retyped import exact, read_as_text
from spark_jobs.schema import any_of, conform
from spark_jobs.sqltext import col
from spark_jobs.system import (
    CARRIED,
    COPIES,
    CORRUPT,
    KEEP,
    OBJECT,
    OP,
    REASON,
    SEQ,
    SOURCE,
    SYSTEM_COLUMNS,
    UNFIT,
    WORK_COLUMNS,
)


@dataclass
class Fitted:
    """The run's fitted events and what one pass over them counts."""

    rows: DataFrame
    received: int  # deliveries, exact duplicates included
    distinct: int
    quarantined: int
    unavailable: list[str]  # columns holding a placeholder in some event
    ranges: list[tuple[str, int, int]]  # per producer: lowest and highest sequence
    ids: dict[str, list[int]] | None  # per producer: every sequence (a small run's; None: not collected)
    cached: DataFrame  # ``rows``, or what they are derived from when corrupt events were explained

    def release(self) -> None:
        """Unpersist the one cached DataFrame: ``rows`` may be a plan on top of it, and
        unpersisting that would leave the cache in place (a Connect server outlives runs)."""
        self.cached.unpersist()


def fit(rows: DataFrame, target: StructType, limits: Limits, after: StructType | None, ids: bool = False) -> Fitted:
    """:func:`fit_to_table`, cached, and its counts; corrupt events explained only when there are
    any. ``ids``: the same pass also brings back every event's sequence (for a small run)."""
    # Cached with every column: which events the parser calls corrupt depends on the columns a
    # scan reads, so every later use must see this one parse.
    fitted = cached = fit_to_table(rows, target, limits).cache()
    # One pass (parse, dedup, fit, cache) gives every count, per producer, and the unavailable columns.
    per_source = (
        fitted.groupBy(SOURCE)
        .agg(
            F.sum(COPIES).alias("received"),
            F.count(F.lit(1)).alias("distinct"),
            F.count(REASON).alias("quarantined"),
            F.count(CORRUPT).alias("corrupt"),
            F.min(SEQ).alias("low"),
            F.max(SEQ).alias("high"),
            F.array_distinct(F.flatten(F.collect_set(KEEP))).alias("unavailable"),
            *([F.collect_list(SEQ).alias("ids")] if ids else []),
        )
        .collect()
    )
    n_quarantined = sum(r["quarantined"] for r in per_source)
    unavailable = sorted({c for r in per_source for c in r["unavailable"] or []})
    if any(r["corrupt"] for r in per_source):
        fitted = explain_corrupt(fitted, after or StructType([]), target)
        again = fitted.agg(
            F.count(REASON).alias("quarantined"), F.array_distinct(F.flatten(F.collect_set(KEEP))).alias("unavailable")
        ).first()
        assert again is not None
        n_quarantined, unavailable = again["quarantined"], sorted(again["unavailable"] or [])
    return Fitted(
        fitted,
        received=sum(r["received"] or 0 for r in per_source),
        distinct=sum(r["distinct"] for r in per_source),
        quarantined=n_quarantined,
        unavailable=unavailable,
        ranges=[(r[SOURCE], r["low"], r["high"]) for r in per_source],
        ids={r[SOURCE]: r["ids"] for r in per_source} if ids else None,
        cached=cached,
    )


def mark_unavailable(rows: DataFrame) -> DataFrame:
    """Placeholder values become NULL, their column names listed in KEEP."""
    strings = [
        f.name
        for f in rows.schema.fields
        if f.name not in SYSTEM_COLUMNS + WORK_COLUMNS and f.dataType.simpleString() == "string"
    ]
    keep = F.filter(
        F.array(*[F.when(col(c) == UNAVAILABLE, F.lit(c)) for c in strings]) if strings else F.array(),
        lambda x: x.isNotNull(),
    ).cast("array<string>")
    cols = [
        F.when(col(c) == UNAVAILABLE, F.lit(None)).otherwise(col(c)).alias(c) if c in strings else col(c)
        for c in rows.columns
    ]
    return rows.select(*cols, keep.alias(KEEP))  # column order kept: it becomes the table's


def fit_to_table(rows: DataFrame, target: StructType, limits: Limits = names.DEFAULT) -> DataFrame:
    """Rows in the table's column order and types, plus REASON (null when every value fits).

    Columns the event lacks become NULL: an after-image is the whole row. Values read as the
    table's types (see :func:`read_staging`) fit as they are; the parser's refusals are
    :func:`explain_corrupt`'s. A value in a column or field the table did not take (the rule, the
    column budget: :func:`spark_jobs.columns.plan_columns`) quarantines its event.
    """
    present = {fold(f.name): f for f in rows.schema.fields if f.name not in WORK_COLUMNS}
    texts = companion_texts(present, target)
    cols: list[Column] = []
    reasons: list[Column] = []
    extras: list[Column] = []
    renamed: dict[str, str] = {}
    for f in target.fields:
        src = present.pop(fold(f.name), None)
        if src is not None and src.name != f.name:
            renamed[src.name] = f.name
        if fold(f.name) in texts:  # a retyped column's companion: its texts, else what the event sent
            sent = [] if src is None else [conform(col(src.name), src.dataType, f.dataType)[0]]
            cols.append(F.coalesce(texts[fold(f.name)][2], *sent).alias(f.name))
            continue
        if src is None:
            cols.append(F.lit(None).cast(f.dataType).alias(f.name))
            continue
        value, bad, why = _to_column(src, f, fold(companion(f.name)) in texts, limits)
        cols.append(value.alias(f.name))
        shown = F.substring(F.to_json(F.struct(col(src.name).alias(f.name))), 1, 200)
        reasons.append(F.when(bad, F.concat(F.lit(why), shown)))
        for where, name, holds in extra_values(col(src.name), src.dataType, f.dataType, f.name):
            extras.append(F.when(holds, F.lit(f"column {where}: {not_added(name, False, limits)}")))
    for src in present.values():  # the table has no such column
        if not isinstance(src.dataType, NullType):
            extras.append(
                F.when(col(src.name).isNotNull(), F.lit(f"column {src.name}: {not_added(src.name, True, limits)}"))
            )
    if UNFIT in rows.columns:
        extras.append(F.col(UNFIT))
    reasons += extras
    reason = F.concat_ws("; ", *reasons) if reasons else F.lit("")
    keep = F.col(KEEP) if KEEP in rows.columns else F.array().cast("array<string>")
    if renamed:  # KEEP names columns as the table spells them, which the MERGE and the fill look up

        def spelled(x: Column) -> Column:
            (first, name), *rest = renamed.items()
            out = F.when(x == first, F.lit(name))
            for sent, spelt in rest:
                out = out.when(x == sent, F.lit(spelt))
            return out.otherwise(x)

        keep = F.transform(keep, spelled)
    for name, text_name, _ in texts.values():  # a retyped column's value kept (a placeholder): its companion's too
        also = F.array_union(keep, F.array(F.lit(text_name)))
        keep = F.when(F.array_contains(keep, name), also).otherwise(keep)
    extra = [c for c in CARRIED if c in rows.columns]
    return rows.select(*cols, OP, OBJECT, keep.alias(KEEP), F.when(reason != "", reason).alias(REASON), *extra)


def _to_column(src: StructField, f: StructField, texts: bool, limits: Limits) -> tuple[Column, Column, str]:
    """(value, whether it does not fit, why) of the rows' column ``src`` in the table's ``f``.
    A retyped column (:mod:`spark_jobs.retyped`) fits where its value is exact, and everywhere
    when the table has its companion (``texts``): :func:`companion_texts` holds the rest."""
    if read_as_text(src.dataType, f.dataType):
        value, rest = exact(col(src.name), f.dataType)
        if texts:
            return value, F.lit(False), ""
        no = f"column {f.name}: text value is no {f.dataType.simpleString()}, and {no_companion(f.name, limits)}: "
        return value, rest.isNotNull(), no
    value, bad = conform(col(src.name), src.dataType, f.dataType)
    return value, bad, f"column {f.name}: {src.dataType.simpleString()} value does not fit {f.dataType.simpleString()} "


def companion_texts(present: dict[str, StructField], target: StructType) -> dict[str, tuple[str, str, Column]]:
    """Per companion (folded) the table has for a retyped column of the run (``present``: the
    rows' columns by folded name): the table's names of the column and of the companion, and the
    texts that are no value of the column's type (:func:`spark_jobs.retyped.exact`)."""
    have = {fold(f.name): f.name for f in target.fields}
    out = {}
    for f in target.fields:
        src, text = present.get(fold(f.name)), fold(companion(f.name))
        if src is not None and read_as_text(src.dataType, f.dataType) and text in have:
            out[text] = (f.name, have[text], exact(col(src.name), f.dataType)[1])
    return out


def no_companion(name: str, limits: Limits) -> str:
    """Why a retyped column's value that is no value of its type is quarantined: the table
    lacks its companion (the name rule or the column budget kept it out)."""
    return f"column {companion(name)}: {not_added(companion(name), True, limits)}"


def explain_corrupt(fitted: DataFrame, after: StructType, target: StructType) -> DataFrame:
    """``fitted`` (:func:`fit_to_table`'s rows) with its corrupt events (CORRUPT set) explained:
    REASON names each column whose value does not fit, with the value; the other columns keep
    their values. An unavailable placeholder fits any column: its value becomes NULL and its
    column goes to KEEP. A corrupt event with no such column found still gets a reason: nothing
    the parser refused is accepted. Meant for the few corrupt events on top of the cached rows.

    Every spelling of a column in ``after`` (the read type) is parsed on its own; fields are
    taken by position (:func:`spark_jobs.schema.slots`), spellings merge per table column."""
    table = {fold(f.name): f for f in target.fields}
    pairs = [(f, table[fold(f.name)]) for f in after.fields if fold(f.name) in table and not is_reserved(f.name)]
    typed = [j for j, (f, _) in enumerate(pairs) if not isinstance(f.dataType, StringType)]
    flags = _parse_corrupt(fitted, pairs, typed)
    reasons, values, kept = _column_verdicts(pairs, typed, target)
    line = F.col(CORRUPT)
    broken = line.isNotNull()
    explained = flags.select(
        "*",
        (F.concat_ws("; ", *reasons) if reasons else F.lit("")).alias("_cdc_w_named"),
        (F.filter(F.array(*kept), lambda x: x.isNotNull()) if kept else F.array()).alias("_cdc_w_held"),
    )
    named, found = F.col("_cdc_w_named"), F.col("_cdc_w_held")
    unknown = F.concat(F.lit("event does not fit the table: "), F.substring(line, 1, 200))
    reason = F.when(named != "", named).when(F.size(found) == 0, unknown)
    out = []
    for c in fitted.columns:
        if c in values:
            out.append(F.when(broken, values[c]).otherwise(col(c)).alias(c))
        elif c == REASON:
            out.append(F.when(broken, F.coalesce(F.col(REASON), reason)).otherwise(F.col(REASON)).alias(c))
        elif c == KEEP:
            keep = F.array_distinct(F.concat(F.col(KEEP), found.cast("array<string>")))
            out.append(F.when(broken, keep).otherwise(F.col(KEEP)).alias(c))
        else:
            out.append(col(c))
    return explained.select(*out)


# The columns _parse_corrupt adds, per after-image field j (its position in ``pairs``).
_REFUSED = "_cdc_refused"
_TEXTS, _KINDS = "_cdc_w_texts", "_cdc_w_kinds"


def _check(j: int) -> str:
    return f"_cdc_w_check{j}"


def _text(j: int) -> Column:
    return F.col(_TEXTS).getField(f"_{j}")


def _failed(j: int) -> Column:
    return F.col(_check(j)).getField(_REFUSED).isNotNull()


def _held(j: int) -> Column:
    return _text(j) == UNAVAILABLE


def _parse_corrupt(fitted: DataFrame, pairs: list[tuple[StructField, StructField]], typed: list[int]) -> DataFrame:
    """``fitted`` plus, for a corrupt line: every field as text, each typed field's JSON kind and
    whether its value alone is refused (``_cdc_w_bad{j}``, ``_cdc_w_kind{j}``)."""
    line = F.col(CORRUPT)
    broken = line.isNotNull()
    strict = {**JSON_OPTIONS, "mode": "PERMISSIVE", "columnNameOfCorruptRecord": _REFUSED}

    def image(fields: list[StructField], *extra: StructField) -> StructType:
        return StructType([StructField("after", StructType(fields)), *extra])

    def by_position(parsed: Column, fields: list[StructField]) -> Column:
        return parsed.cast(StructType([StructField(f"_{k}", f.dataType) for k, f in enumerate(fields)]))

    # Each parse once, of a corrupt line only: one projection per step keeps every later
    # reference a column (Spark does not inline an expensive expression used more than once).
    as_text = [StructField(f.name, StringType()) for f, _ in pairs]
    as_variant = [StructField(pairs[j][0].name, VariantType()) for j in typed]
    parsed = fitted.select(
        "*",
        F.when(broken, by_position(F.from_json(line, image(as_text), JSON_OPTIONS).getField("after"), as_text)).alias(
            _TEXTS
        ),
        F.when(
            broken, by_position(F.from_json(line, image(as_variant), JSON_OPTIONS).getField("after"), as_variant)
        ).alias(_KINDS),
        *[
            F.when(broken, F.from_json(line, image([pairs[j][0]], StructField(_REFUSED, StringType())), strict)).alias(
                _check(j)
            )
            for j in typed
        ],
    )
    shape = {j: F.schema_of_variant(F.col(_KINDS).getField(f"_{k}")) for k, j in enumerate(typed)}
    return parsed.select(
        "*",
        *[(_failed(j) & ~_held(j)).alias(f"_cdc_w_bad{j}") for j in typed],
        *[
            F.when(s.startswith("OBJECT"), "object")
            .when(s.startswith("ARRAY"), "array")
            .when(s == "STRING", "string")
            .when(s == "BOOLEAN", "boolean")
            .otherwise("number")
            .alias(f"_cdc_w_kind{j}")
            for j, s in shape.items()
        ],
    )


def _column_verdicts(
    pairs: list[tuple[StructField, StructField]], typed: list[int], target: StructType
) -> tuple[list[Column], dict[str, Column], list[Column]]:
    """Over :func:`_parse_corrupt`'s columns: the reasons (one per refused value), each table
    column's value and the table columns holding an unavailable placeholder."""
    reasons: list[Column] = []
    kept: list[Column] = []
    spelt = {fold(f.name): f.name for f in target.fields}
    # Per table column: is any spelling refused or unavailable, and the values its spellings give.
    dropped: dict[str, list[Column]] = {}
    given: dict[str, list[Column]] = {}
    for j, (f, t) in enumerate(pairs):
        if j in typed:
            bad, kind, shown = F.col(f"_cdc_w_bad{j}"), F.col(f"_cdc_w_kind{j}"), _text(j)
            shown = F.when(kind == "string", F.regexp_extract(F.to_json(F.array(shown)), r"^\[(.*)\]$", 1)).otherwise(
                shown
            )
            prefix, suffix = f"column {t.name}: ", f" does not fit {t.dataType.simpleString()}"
            why = F.concat(F.lit(prefix), kind, F.lit(" "), F.substring(shown, 1, 200), F.lit(suffix))
            reasons.append(F.when(bad, why))
            # Partial results kept the values of the columns that did parse; else the re-parse.
            value = conform(F.col(_check(j)).getField("after").getField(f.name), f.dataType, t.dataType)[0]
            dropped.setdefault(t.name, []).append(_failed(j) | _held(j))
        else:  # a string column takes any value (a non-string as its JSON text)
            value = _text(j)
            dropped.setdefault(t.name, []).append(_held(j))
            if read_as_text(f.dataType, t.dataType):  # retyped: the value where exact, else to the companion
                value, rest = exact(value, t.dataType)
                text = spelt.get(fold(companion(t.name)))
                if text is None:
                    no_text = f"column {t.name}: text value is no {t.dataType.simpleString()}"
                    reasons.append(F.when(rest.isNotNull(), F.lit(no_text)))
                else:
                    given.setdefault(text, []).append(rest)
                    dropped.setdefault(text, []).append(_held(j))
                    kept.append(F.when(_held(j), F.lit(text)))
        given.setdefault(t.name, []).append(value)
    values = {
        name: F.when(any_of(dropped[name]), F.lit(None).cast(target[name].dataType)).otherwise(
            F.coalesce(col(name), *given[name])
        )
        for name in given
    }
    kept += [F.when(_held(j), F.lit(t.name)) for j, (_, t) in enumerate(pairs)]
    return reasons, values, kept
