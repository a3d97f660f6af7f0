"""The apply's shared vocabulary: its system and working columns, a row's ordering key, and the
crash points tests inject to prove that a re-run converges."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from cdclake.contracts.history import KEY, ORDER, SEQ, SOURCE, SYSTEM_COLUMNS, TS

__all__ = ["KEY", "ORDER", "SEQ", "SOURCE", "SYSTEM_COLUMNS", "TS"]  # and the names defined below
# Working columns, never stored in the main table:
OP = "_cdc_w_op"
OBJECT = "_cdc_w_object"
RANK = "_cdc_w_rank"
REASON = "_cdc_w_reason"
OUTCOME = "_cdc_w_outcome"
KEEP = "_cdc_w_keep"  # names of columns whose value was unavailable: keep what is stored
PAIR = "_cdc_w_pair"  # a key change's INSERT: (key, sequence) of the old key's DELETE
PRESENT = "_cdc_w_present"  # whether the event's key had a row just before it
COPIES = "_cdc_w_copies"  # deliveries of one distinct event
CORRUPT = "_cdc_w_line"  # the staged line of an event with a value the read types do not take
SEEN = "_cdc_w_seen"  # an earlier run already logged this event (accepted or quarantined)
UNFIT = "_cdc_w_unfit"  # why an event's reserved top-level names cannot be columns
IMAGE_BEFORE = "_cdc_w_before"  # the event's before image, JSON text, for the change history
METADATA = "_cdc_w_metadata"  # the event's metadata, JSON text, for the change history
TRANSACTION = "_cdc_w_transaction"  # the event's source transaction id, for the change history
# Carried unchanged from the read to the change history (and the counts), past every step.
CARRIED = (COPIES, CORRUPT, IMAGE_BEFORE, METADATA, TRANSACTION)
WORK_COLUMNS = (OP, OBJECT, RANK, REASON, OUTCOME, KEEP, SEEN, UNFIT, PAIR, PRESENT, *CARRIED)

# after-aux: the side tables staged, not the table; before-commit: the MERGE's files written, its
# snapshot not staged for the run; after-stage: every table staged, nothing published.
CRASH_POINTS = ("before-write", "after-aux", "before-commit", "after-stage", "after-commit")
# The side tables published alone, then a crash: what an older cdclake (one commit per table)
# could leave, which pending.py's resume path finishes. Not a state this version can reach.
OLDER_AUX_CRASH = "side-tables-published"
# Between a default backfill's table property and its column (spark_jobs.backfill): only a run
# that adds such a column passes it, so it is not among the points every run passes.
MARK_CRASH = "after-default-mark"


class SimulatedCrash(RuntimeError):
    """Raised at a CRASH_POINT by tests that prove re-runs converge."""


def crash(point: str, crash_at: str | None) -> None:
    if crash_at == point:
        raise SimulatedCrash(point)


def ordering(prefix: str = "") -> str:
    """SQL of a row's full ordering key: ordering value, then source, then sequence (a total,
    deterministic order). Rows stored before ORDER existed compare by ``[sequence]``."""
    p = prefix
    return f"named_struct('o', coalesce({p}{ORDER}, array({p}{SEQ})), 's', {p}{SOURCE}, 'q', {p}{SEQ})"


def with_order(df: DataFrame) -> DataFrame:
    """Tables written before ORDER existed lack it: they compare by ``[sequence]``."""
    return df if ORDER in df.columns else df.withColumn(ORDER, F.lit(None).cast("array<bigint>"))
