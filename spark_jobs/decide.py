"""Deciding each fitted event's outcome: a duplicate of an event an earlier run logged, held
back for an unavailable value it cannot resolve, or, against the table and its tombstones,
applied, superseded (not the newest of its key in this run), late or a duplicate; then the
accounting every run must balance."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import reduce

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from cdclake.contracts.history import REPLAYED_AT
from spark_jobs.fit import Fitted
from spark_jobs.pending import CHANGES, HISTORY_OBJECT, QUARANTINE, TOMBSTONES, Run
from spark_jobs.schema import any_of
from spark_jobs.system import (
    CORRUPT,
    KEY,
    OBJECT,
    OP,
    ORDER,
    OUTCOME,
    RANK,
    REASON,
    SEEN,
    SEQ,
    SOURCE,
    TS,
    ordering,
    with_order,
)
from spark_jobs.unavailable import resolve_unavailable


class AccountingError(RuntimeError):
    """received != applied + duplicate + superseded + late + quarantined: a bug, never data."""


@dataclass
class Tally:
    counts: dict[str, int]  # received and each outcome, the run's snapshot properties
    changes: int  # events the change history logs
    deletes: int  # applied deletes: the tombstones written
    truncated: list[int] | None = None  # the ordering value of the TRUNCATE the run applies (None: none)


SEEN_COLLECTED_AT_MOST = 100_000
"""A run of at most this many distinct events brings the ids of those an earlier run logged to the
driver in one job; a bigger one checkpoints them (a job) and counts them (another)."""

IDS_AS_VALUES_AT_MOST = 1_000
"""A run staged with at most this many events (its receipts' bound) has :func:`spark_jobs.fit.fit`
bring every event's id back in the pass it makes anyway; the history is then filtered by those
values, where a join with the run's events broadcast them in a Spark job of its own. A bigger run
joins: its many literals cost the filter more than the job (docs/benchmarks.md, "A compressed
watermark")."""


def mark_seen(run: Run, fitted: Fitted, resumed: Sequence[str]) -> tuple[DataFrame, int, int]:
    """``fitted.rows`` with SEEN (:func:`logged_before`), how many events an earlier run logged
    and how many of those fitting counted as quarantined."""
    seen = logged_before(run, fitted, resumed)
    n_seen = 0
    if seen is not None and fitted.distinct <= SEEN_COLLECTED_AT_MOST:
        # The seen events are some of the run's own, so ``distinct`` bounds what comes back; and
        # usually nothing does. Brought back as values, they are a local relation for the join.
        ids = seen.select(SOURCE, SEQ)
        rows = ids.collect()
        n_seen = len(rows)
        if n_seen:
            seen = run.spark.createDataFrame(rows, ids.schema).withColumn(SEEN, F.lit(True))
    elif seen is not None:
        seen = seen.localCheckpoint(eager=True)
        n_seen = seen.count()
    if seen is None or not n_seen:
        return fitted.rows.withColumn(SEEN, F.lit(False)), n_seen, 0
    marked = fitted.rows.join(F.broadcast(seen), [SOURCE, SEQ], "left").select(
        *fitted.rows.columns, F.coalesce(F.col(SEEN), F.lit(False)).alias(SEEN)
    )
    again = marked.where(F.col(SEEN)).agg(F.count(REASON).alias("quarantined")).first()
    assert again is not None
    return marked, n_seen, again["quarantined"]


def logged_before(run: Run, fitted: Fitted, resumed: Sequence[str]) -> DataFrame | None:
    """(SOURCE, SEQ, SEEN) of the fitted events that ``__changes`` or ``__quarantine`` already
    hold: an earlier run decided them (an event delivered again, e.g. re-sent under a new batch
    number), so now they count as duplicates and are neither logged nor applied again. None: no
    history. A quarantined event marked replayed is not among them: a replay lands it to be
    decided again (and once in ``__changes``, a second replay of it is a duplicate).

    ``fitted.ranges`` (producer, lowest and highest sequence in this run) prune the history scan
    to the data files whose column metrics can hold such events. Then the run's own ids pick its
    events: as values when ``fitted.ids`` has them, else in a join whose broadcast side is this
    run's events (the history is the side that grows).
    In the re-run of a crashed run (``resumed``: its objects), what the crashed attempt logged
    from those objects is this run's own decision, not an earlier one."""
    window, by_values = history_window(fitted.ranges, fitted.ids)
    logged = []
    for suffix in (CHANGES, QUARANTINE):
        ident = run.ident(suffix)
        if not run.spark.catalog.tableExists(ident):
            continue
        history = run.spark.table(ident)
        where = window
        if suffix == QUARANTINE and REPLAYED_AT in history.columns:
            # A replayed event (`cdclake quarantine replay`) is decided again when it comes back.
            where = where & F.col(REPLAYED_AT).isNull()
        if resumed:
            obj = F.col(HISTORY_OBJECT) if HISTORY_OBJECT in history.columns else F.lit(None).cast("string")
            where = where & obj.isNotNull() & ~obj.isin(list(resumed))
        logged.append(history.where(where).select(SOURCE, SEQ))
    if not logged:
        return None
    found = reduce(lambda a, b: a.unionByName(b), logged)
    if not by_values:
        found = found.join(F.broadcast(fitted.rows.select(SOURCE, SEQ)), [SOURCE, SEQ], "left_semi")
    return found.distinct().withColumn(SEEN, F.lit(True))


def history_window(ranges: Sequence[tuple[str, int, int]], ids: dict[str, list[int]] | None) -> tuple[Column, bool]:
    """The filter on a history table that keeps what may be this run's events, and whether it
    keeps exactly those (the run's ids as values) or needs a join with them."""

    def term(source: str, lo: int, hi: int) -> Column:
        t = (F.col(SOURCE) == source) & F.col(SEQ).between(lo, hi)
        return t if ids is None else t & F.col(SEQ).isin(ids[source])

    return any_of([term(*r) for r in ranges]), ids is not None


def settle(marked: DataFrame, unavailable: Sequence[str], stored: DataFrame) -> tuple[DataFrame, DataFrame, int]:
    """The events to classify, the quarantined ones (in the history's columns) and how many
    were quarantined here for an unavailable value with nothing to keep."""
    valid = marked.where(F.col(REASON).isNull() & ~F.col(SEEN)).drop(REASON, SEEN, CORRUPT)
    resolved = resolve_unavailable(valid, unavailable, stored)
    n_unresolved = 0
    if unavailable:
        # Checkpointed: its decisions read the table, which the MERGE changes.
        resolved = resolved.localCheckpoint(eager=True)
        n_unresolved = resolved.where(F.col(REASON).isNotNull()).count()
    history = [KEY, SEQ, TS, SOURCE, OP, OBJECT, REASON]
    quarantined = (
        marked.where(F.col(REASON).isNotNull() & ~F.col(SEEN))
        .select(*history)
        .unionByName(resolved.where(F.col(REASON).isNotNull()).select(*history))
    )
    return resolved.where(F.col(REASON).isNull()).drop(REASON), quarantined, n_unresolved


NARROW_SHARE = 4
"""A batch of fewer distinct events than 1/NARROW_SHARE of the table's rows looks up only its own keys."""


def narrow_join(events: int, table_rows: int) -> bool:
    """Whether :func:`classify` broadcasts the batch's keys (``events`` distinct events) to read
    only their rows of the table (``table_rows``), or shuffles the table's keys to join them.
    Measured with ``make bench`` (docs/benchmarks.md, "Apply": the earlier rounds and the growth
    with table size): against a table no bigger than the batch the broadcast cost more than the
    shuffle; against one ten times bigger it is the shuffle that would grow with the table."""
    return events * NARROW_SHARE < table_rows


def decide(run: Run, valid: DataFrame, narrow: bool = True) -> DataFrame:
    """:func:`classify` of ``valid`` against the table and its tombstones as they are now."""
    spark, tomb_ident = run.spark, run.ident(TOMBSTONES)
    tombstones = (
        spark.table(tomb_ident)
        if spark.catalog.tableExists(tomb_ident)
        else spark.createDataFrame([], f"{KEY} string, {SEQ} long, {SOURCE} string, {ORDER} array<bigint>")
    )
    current = with_order(spark.table(run.ident())).select(KEY, SEQ, SOURCE, ORDER)
    truncate = F.col(OP) == TRUNCATE
    cut, prior = truncation(valid.where(truncate), tombstones)
    rows = classify(rank_per_key(valid.where(~truncate)), current, tombstones, narrow, cut, prior)
    # A TRUNCATE older than one an earlier run applied changes nothing; else it is applied, also
    # again in the re-run of a crashed run (its mark equals the recorded one): the MERGE's
    # removal of older rows is idempotent.
    late = _order() < _mark(prior) if prior is not None else F.lit(False)
    truncates = (
        valid.where(truncate).withColumn(RANK, F.lit(1)).withColumn(OUTCOME, F.when(late, "late").otherwise("applied"))
    )
    # Checkpointed, not just cached: the MERGE must not plan a source that reads its own target
    # (Spark 4.1 fails with "No plan for TableReference"), and the tombstone table changes before
    # the MERGE runs. Kept serialized (PySpark's MEMORY_AND_DISK): the default keeps a Java object
    # per row, and its stage spent more time in GC (docs/benchmarks.md, "Apply"; the apply as a
    # whole moved within noise).
    return rows.unionByName(truncates).localCheckpoint(eager=True, storageLevel=StorageLevel.MEMORY_AND_DISK)


TRUNCATE = "TRUNCATE"


def _order(prefix: str = "") -> Column:
    """An event's (a row's, a tombstone's) ordering value: what a TRUNCATE is compared by."""
    return F.coalesce(F.col(prefix + ORDER), F.array(F.col(prefix + SEQ)))


def truncation(truncates: DataFrame, tombstones: DataFrame) -> tuple[list[int] | None, list[int] | None]:
    """``(cut, prior)``: the ordering value of the run's newest TRUNCATE and of the newest one an
    earlier run applied (its tombstone has no key); None: none. Events ordered before ``cut`` are
    gone (superseded by it); before ``prior``, late. One small job, its two values brought to the
    driver: as literals they cost the classification no join (a cross join with them took a
    broadcast and two aggregation stages of their own, each a Spark job, in every run). Both
    maxima come from one aggregate over the union of the two inputs, each row tagged with what it
    is a candidate for: a cross join of two aggregates broadcast one of them, a job of its own."""
    is_cut = F.col("_cut")
    candidates = truncates.select(_order().alias("_o"), F.lit(True).alias("_cut")).unionByName(
        with_order(tombstones).where(F.col(KEY).isNull()).select(_order().alias("_o"), F.lit(False).alias("_cut"))
    )
    row = candidates.agg(
        F.max(F.when(is_cut, F.col("_o"))).alias("cut"), F.max(F.when(~is_cut, F.col("_o"))).alias("prior")
    ).first()
    assert row is not None  # a global aggregate has one row

    def value(v: list[int] | None) -> list[int] | None:
        return None if v is None else [int(x) for x in v]

    return value(row["cut"]), value(row["prior"])


def _mark(value: list[int]) -> Column:
    """An ordering value as an ``array<bigint>`` literal (a value, never SQL text)."""
    return F.array(*[F.lit(x).cast("bigint") for x in value])


def account(table: str, classified: DataFrame, fitted: Fitted, n_seen: int, n_quarantined: int) -> Tally:
    """Every event received is applied, a duplicate, superseded, late or quarantined, exactly
    once; else AccountingError."""
    # A TRUNCATE leaves a tombstone too (without a key): its mark for later runs. The same job
    # finds the newest applied TRUNCATE, the ordering value the MERGE removes older rows below.
    applied_truncate = (F.col(OP) == TRUNCATE) & (F.col(OUTCOME) == "applied")
    tally = (
        classified.groupBy(OUTCOME, F.col(OP).isin("DELETE", TRUNCATE).alias("del"))
        .agg(F.count(F.lit(1)).alias("count"), F.max(F.when(applied_truncate, _order())).alias("cut"))
        .collect()
    )
    cuts = [r["cut"] for r in tally if r["cut"] is not None]
    outcomes: dict[str, int] = {}
    for r in tally:
        outcomes[r[OUTCOME]] = outcomes.get(r[OUTCOME], 0) + r["count"]
    received, distinct = fitted.received, fitted.distinct
    counts = {
        "received": received,
        "applied": outcomes.get("applied", 0),
        "duplicate": received - distinct + n_seen + outcomes.get("duplicate", 0),
        "superseded": outcomes.get("superseded", 0),
        "late": outcomes.get("late", 0),
        "quarantined": n_quarantined,
    }
    accounted = sum(v for k, v in counts.items() if k != "received")
    if accounted != received:
        raise AccountingError(f"{table}: received {received} != accounted {accounted} {counts}")
    return Tally(
        counts,
        changes=distinct - n_seen - n_quarantined - outcomes.get("duplicate", 0),
        deletes=sum(r["count"] for r in tally if r[OUTCOME] == "applied" and r["del"]),
        truncated=[int(x) for x in max(cuts)] if cuts else None,
    )


def rank_per_key(valid: DataFrame) -> DataFrame:
    """RANK 1 = the event with the highest ordering value per key; ties broken by source id."""
    w = Window.partitionBy(KEY).orderBy(F.col(ORDER).desc(), F.col(SOURCE).desc(), F.col(SEQ).desc())
    return valid.withColumn(RANK, F.row_number().over(w))


def classify(
    ranked: DataFrame,
    current: DataFrame,
    tombstones: DataFrame,
    narrow: bool = True,
    cut: list[int] | None = None,
    prior: list[int] | None = None,
) -> DataFrame:
    """OUTCOME per event: superseded (not the newest of its key in this run, or ordered before
    the run's newest TRUNCATE), late (older than the stored row, the key's tombstone or a
    TRUNCATE an earlier run applied), duplicate (the stored row or tombstone IS this event),
    else applied. ``cut`` and ``prior``: :func:`truncation`'s (None: no such TRUNCATE).

    A DELETE equal to its tombstone while the row is still there is applied again: that is a
    re-run after a crash between the tombstone commit and the table commit.

    ``narrow`` (:func:`narrow_join`): look up only the batch's keys in the table and tombstones;
    else join them whole. The outcomes are the same.
    """
    joined = with_stored(ranked, current, tombstones, narrow)
    ev = F.expr(ordering())
    row, tb = F.col("_row"), F.col("_tomb")
    outcome = F.when(F.col(RANK) > 1, "superseded")
    if cut is not None:
        outcome = outcome.when(_order() < _mark(cut), "superseded")
    if prior is not None:
        outcome = outcome.when(_order() < _mark(prior), "late")
    outcome = (
        outcome.when(row.isNotNull() & (ev < row), "late")
        .when(row.isNotNull() & (ev == row), "duplicate")
        .when(tb.isNotNull() & (ev < tb), "late")
        .when(tb.isNotNull() & (ev == tb) & row.isNull(), "duplicate")
        .otherwise("applied")
    )
    return joined.withColumn(OUTCOME, outcome).drop("_row", "_tomb")


def with_stored(ranked: DataFrame, current: DataFrame, tombstones: DataFrame, narrow: bool) -> DataFrame:
    """``ranked`` with ``_row``, the ordering of its key's stored row, and ``_tomb``, of its key's
    newest tombstone (null: none); ``narrow``: see :func:`classify`."""
    # A key deleted in several runs has a tombstone per delete (appended): the newest counts.
    order = F.expr(ordering())
    if not narrow:
        # The batch is no small part of the table: shuffling the table's keys costs less than
        # collecting and broadcasting the batch's, twice (docs/benchmarks.md, "Apply", earlier
        # rounds). Grouping the table's rows with the tombstones (a max over a struct is a sort
        # aggregate) or joining them first would sort or shuffle the table once more.
        tomb = with_order(tombstones).groupBy(KEY).agg(F.max(order).alias("_tomb"))
        cur = with_order(current).select(KEY, order.alias("_row"))
        return ranked.join(cur, KEY, "left").join(tomb, KEY, "left")
    # Only the stored rows and tombstones of this batch's keys: a broadcast semi-join scans the
    # table without shuffling it, so the cost grows with the table's scan, not its shuffle. Both
    # are one relation, joined once: two were two broadcasts (under static plans each a Spark
    # job). A key has at most one stored row (the MERGE writes one per key).
    keys = F.broadcast(ranked.select(KEY).distinct())
    none = F.when(F.lit(False), order)  # a null of the ordering's type
    stored = (
        with_order(current)
        .join(keys, KEY, "left_semi")
        .select(KEY, order.alias("_row"), none.alias("_tomb"))
        .unionByName(
            with_order(tombstones).join(keys, KEY, "left_semi").select(KEY, none.alias("_row"), order.alias("_tomb"))
        )
        .groupBy(KEY)
        .agg(F.max("_row").alias("_row"), F.max("_tomb").alias("_tomb"))
    )
    return ranked.join(stored, KEY, "left")
