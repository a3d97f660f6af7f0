"""Unavailable values (a placeholder for a value the source did not capture, e.g. Debezium's
unchanged TOAST column): each takes the value its row had just before the event, from this run
or from the stored row, through a key change too; an event with nothing to keep is quarantined,
since a NULL there would invent a value."""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from cdclake.contracts.events import UNAVAILABLE
from spark_jobs.sqltext import col
from spark_jobs.system import KEEP, KEY, OP, ORDER, PAIR, PRESENT, REASON, SEQ, SOURCE, ordering, with_order

HELD = f"unavailable value ({UNAVAILABLE}: the source did not capture it) with no earlier value to keep"
MAX_KEY_CHANGE_HOPS = 32
"""Key changes chained in one run (a->b->c: each hop one more pass) whose placeholders are carried;
an event further down such a chain is quarantined."""


def pair_key_changes(valid: DataFrame) -> DataFrame:
    """PAIR = (old key, sequence) of the DELETE at the same source position (producer and ordering
    value) as an INSERT with unavailable values: Debezium sends a primary-key change as a delete of
    the old key and a create of the new one at one log position, and the create's placeholders
    stand for the old key's values. REASON for an INSERT whose position holds several deletes:
    which old key it was is unknowable, and guessing would invent a value."""
    n, old, old_seq = "_cdc_w_n", "_cdc_w_old", "_cdc_w_old_seq"
    wants = (F.col(OP) == "INSERT") & (F.size(F.col(KEEP)) > 0)
    positions = valid.where(wants).select(SOURCE, ORDER).distinct()
    deletes = (
        valid.where(F.col(OP) == "DELETE")
        .join(positions, [SOURCE, ORDER], "left_semi")
        .groupBy(SOURCE, ORDER)
        .agg(F.count(F.lit(1)).alias(n), F.min(KEY).alias(old), F.min(SEQ).alias(old_seq))
    )
    found = F.coalesce(F.col(n), F.lit(0))
    pair = F.when(
        wants & (found == 1) & (F.col(old) != F.col(KEY)),
        F.struct(F.col(old).alias("key"), F.col(old_seq).alias("seq")),
    )
    why = F.when(
        wants & (found > 1),
        F.concat(
            F.lit("column "),
            F.array_join(F.col(KEEP), ", "),
            F.lit(f": {HELD}: "),
            found.cast("string"),
            F.lit(" deletes at this event's source position, so the key change's old key is ambiguous"),
        ),
    )
    return valid.join(deletes, [SOURCE, ORDER], "left").select(*valid.columns, pair.alias(PAIR), why.alias(REASON))


def state_before(rows: DataFrame, columns: Sequence[str], stored: DataFrame, values: bool) -> DataFrame:
    """The not yet quarantined ``rows``, each with the row its key had just before it: the newest
    of the key's earlier events in this run and its stored row, if older than the event (a newer
    stored row is no state this event saw). PRESENT: whether that row exists; NULL while it hangs
    on a key change's INSERT not resolved yet. Per column ``i``: ``_cdc_w_ran{i}`` (its value
    comes from an event of this run) and ``_cdc_w_was{i}`` (struct of the value: from the run, or
    with ``values`` from the stored row; else NULL, the MERGE keeping the stored value).

    Only deletes, events without unavailable values and key changes' INSERTs set a key's
    existence: an unavailable value on a missing row quarantines its event (which then changes
    nothing), on an existing row it keeps the row existing."""
    live = rows.where(F.col(REASON).isNull())
    rk = F.expr(ordering())
    w = Window.partitionBy(KEY).orderBy(ORDER, SOURCE, SEQ).rowsBetween(Window.unboundedPreceding, -1)
    held = F.size(F.col(KEEP)) > 0
    gone, waits = F.col(OP) == "DELETE", F.col(PAIR).isNotNull() & held
    sets = gone | ~held | F.col(PAIR).isNotNull()
    mark = F.struct(rk.alias("rk"), gone.alias("gone"), waits.alias("open"))
    runs = [
        F.last(F.when(~F.array_contains(F.col(KEEP), c), F.struct(rk.alias("rk"), col(c).alias("v"))), True).over(w)
        for c in columns
    ]
    keys = F.broadcast(live.select(KEY).distinct())
    kept = [F.struct(col(c).alias("v")).alias(f"_cdc_w_sv{i}") for i, c in enumerate(columns)] if values else []
    store = with_order(stored).join(keys, KEY, "left_semi").select(KEY, F.expr(ordering()).alias("_cdc_w_srk"), *kept)
    out = live.select(
        "*",
        rk.alias("_cdc_w_rk"),
        F.last(F.when(sets, mark), True).over(w).alias("_cdc_w_last"),
        *[r.alias(f"_cdc_w_run{i}") for i, r in enumerate(runs)],
    ).join(store, KEY, "left")
    srk, last = F.col("_cdc_w_srk"), F.col("_cdc_w_last")
    stored_ok = srk.isNotNull() & (srk < F.col("_cdc_w_rk"))
    from_store = stored_ok & (last.isNull() | (last.getField("rk") < srk))
    present = (
        F.when(from_store, F.lit(True))
        .when(last.isNull(), F.lit(False))
        .when(last.getField("open"), F.lit(None).cast("boolean"))
        .otherwise(~last.getField("gone"))
    )
    state = [present.alias(PRESENT)]
    for i in range(len(columns)):
        run = F.col(f"_cdc_w_run{i}")
        ran = run.isNotNull() & (~stored_ok | (run.getField("rk") > srk))
        was = F.when(ran, F.struct(run.getField("v").alias("v")))
        if values:
            was = was.when(stored_ok, F.col(f"_cdc_w_sv{i}"))
        state += [ran.alias(f"_cdc_w_ran{i}"), was.alias(f"_cdc_w_was{i}")]
    return out.select(*live.columns, *state)


def carry_key_changes(rows: DataFrame, columns: Sequence[str], stored: DataFrame) -> DataFrame:
    """A key change's INSERT takes, for each unavailable value, the old key's value just before
    its DELETE (from this run or the stored row); REASON when the old key had no row then (say
    its delete applied in an earlier run: the row is gone, and nothing is invented). A chain of
    key changes resolves one hop per pass: an INSERT waits while the old key's state hangs on one."""
    d_key, d_seq, d_present = "_cdc_w_dkey", "_cdc_w_dseq", "_cdc_w_dpresent"
    d_was = [f"_cdc_w_dwas{i}" for i in range(len(columns))]
    open_ = F.col(PAIR).isNotNull() & (F.size(F.col(KEEP)) > 0) & F.col(REASON).isNull()
    why = F.concat(
        F.lit("column "),
        F.array_join(F.col(KEEP), ", "),
        F.lit(f": {HELD}: the key change's old key "),
        F.col(PAIR).getField("key"),
        F.lit(" has no row before its delete at this event's source position (deleted earlier, or never seen)"),
    )
    for _ in range(MAX_KEY_CHANGE_HOPS):
        if rows.where(open_).isEmpty():
            break
        old = rows.where(open_).select(F.col(PAIR).getField("key").alias(KEY)).distinct()
        before = state_before(rows.join(old, KEY, "left_semi"), columns, stored, values=True)
        deletes = before.where(F.col(OP) == "DELETE").select(
            F.col(SOURCE).alias("_cdc_w_dsource"),
            F.col(KEY).alias(d_key),
            F.col(SEQ).alias(d_seq),
            F.col(PRESENT).alias(d_present),
            *[F.col(f"_cdc_w_was{i}").alias(d_was[i]) for i in range(len(columns))],
        )
        hit = rows.join(
            deletes,
            (F.col(SOURCE) == F.col("_cdc_w_dsource"))
            & (F.col(PAIR).getField("key") == F.col(d_key))
            & (F.col(PAIR).getField("seq") == F.col(d_seq)),
            "left",
        )
        there = open_ & F.col(d_present)
        carried = {
            c: F.when(there & F.array_contains(F.col(KEEP), c), F.col(d_was[i]).getField("v")).otherwise(col(c))
            for i, c in enumerate(columns)
        }
        out = [carried[c].alias(c) if c in carried else col(c) for c in rows.columns if c not in (KEEP, REASON)]
        rows = hit.select(
            *out,
            F.when(there, F.array().cast("array<string>")).otherwise(F.col(KEEP)).alias(KEEP),
            F.when(open_ & ~F.col(d_present), why).otherwise(F.col(REASON)).alias(REASON),
        ).localCheckpoint(eager=True)
    return rows


def keep_or_quarantine(rows: DataFrame, columns: Sequence[str], stored: DataFrame) -> DataFrame:
    """Every other unavailable value takes its key's value just before the event: from this run
    (filled in here), or from the stored row (left in KEEP: the MERGE keeps what is stored).
    REASON when the key had no row just before: an unavailable value never becomes a NULL."""
    state = state_before(rows, columns, stored, values=False)
    held = (F.size(F.col(KEEP)) > 0) & (F.col(OP) != "DELETE")
    present = F.col(PRESENT)
    stuck = held & (present.isNull() | F.col(PAIR).isNotNull())
    ok = held & ~stuck & present
    ran = [F.col(f"_cdc_w_ran{i}") for i in range(len(columns))]
    filled = {
        c: F.when(ok & F.array_contains(F.col(KEEP), c) & ran[i], F.col(f"_cdc_w_was{i}").getField("v")).otherwise(
            col(c)
        )
        for i, c in enumerate(columns)
    }
    from_run = F.filter(F.array(*[F.when(r, F.lit(c)) for c, r in zip(columns, ran, strict=True)]), F.isnotnull)
    names_ = F.array_join(F.col(KEEP), ", ")
    absent = F.concat(
        F.lit("column "),
        names_,
        F.lit(f": {HELD}: the key has no row before this event"),
        F.when(
            F.col(OP) == "INSERT", F.lit(" and no other key is deleted at this event's source position in this run")
        ).otherwise(F.lit("")),
    )
    too_long = F.concat(
        F.lit("column "), names_, F.lit(f": {HELD}: more than {MAX_KEY_CHANGE_HOPS} key changes chained in one run")
    )
    reason = F.when(stuck, too_long).when(held & ~present, absent)
    resolved = state.select(
        *[filled[c].alias(c) if c in filled else col(c) for c in rows.columns if c not in (KEEP, REASON)],
        F.when(ok, F.array_except(F.col(KEEP), from_run.cast("array<string>"))).otherwise(F.col(KEEP)).alias(KEEP),
        reason.alias(REASON),
    )
    return resolved.unionByName(rows.where(F.col(REASON).isNotNull()))


def resolve_unavailable(valid: DataFrame, unavailable: Sequence[str], stored: DataFrame) -> DataFrame:
    """``valid`` with REASON: placeholders (top-level columns; a nested one stays the literal
    string) resolved to the value the row had just before the event, or the event quarantined
    with the column and why. Deterministic over the same input and table, so the re-run of a
    crashed run decides the same."""
    columns = [c for c in unavailable if c in valid.columns]
    if not unavailable:
        return valid.withColumn(REASON, F.lit(None).cast("string"))
    rows = carry_key_changes(pair_key_changes(valid), columns, stored)
    return keep_or_quarantine(rows, columns, stored).drop(PAIR)
