"""A table's quarantine after the apply (``cdclake quarantine list|replay``): what
``<table>__quarantine`` holds, by reason, and the replay of its events after a schema or
configuration change made them fit.

A replay lands the chosen events' staged lines again, unchanged (same source, batchSequence,
sequence, order: the line the apply kept in ``_cdc_event``), as new staging objects of the table,
then marks every quarantine row of those events replayed (``_cdc_replayed_at``, ``_cdc_replay``:
the object). Both happen under the table's lock (:mod:`cdclake.lake.locks`), so no apply reads the
objects before the rows are marked. The next apply decides a replayed event like any other, once:

- a quarantine row marked replayed no longer makes the event a duplicate
  (``spark_jobs.decide.logged_before``): it is applied, or superseded, late or a duplicate
  against the table as it is now, and logged in ``__changes``, or quarantined again (a new row,
  not replayed);
- once in ``__changes`` it is a duplicate of that decision: replaying it again (``--force``)
  applies nothing twice.

A replay that dies between landing and marking leaves objects whose events the apply counts as
duplicates (their rows are not marked); running the replay again lands them again.

Spark is the caller's session (``cdclake quarantine`` opens one as ``cdclake sql`` does); pyspark is
imported inside functions.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from cdclake import staging
from cdclake.config.settings import Settings
from cdclake.contracts.events import MAX_EVENTS_PER_BATCH, QUARANTINE_SUFFIX, TABLE_PATTERN
from cdclake.contracts.history import (
    EVENT,
    HISTORY_OBJECT,
    KEY,
    OPERATION,
    QUARANTINED_AT,
    REASON,
    REPLAY,
    REPLAYED_AT,
    SEQ,
    SOURCE,
)
from cdclake.lake.spark import table_ident

REPLAY_SOURCE = "cdclake-replay"
"""The source in a replay object's name; its lines keep their producers' sources."""
LOCK_TTL_S = 120.0
STATUSES = ("quarantined", "replayed", "no event")
"""A row's status in ``list``: still quarantined, replayed, or kept before the apply kept the
staged line (quarantined by an older cdclake: it cannot be replayed)."""


class QuarantineError(RuntimeError):
    """A table name or quarantine the user must fix; the message is one line."""


@dataclass
class Replayed:
    """What a replay did."""

    events: int = 0  # distinct events landed again
    rows: int = 0  # quarantine rows chosen (by ``reason``)
    already: int = 0  # of those, rows replayed before, left alone (no ``force``)
    no_event: int = 0  # of those, rows without their staged line
    objects: list[str] = field(default_factory=list)  # the staging objects landed, <table>/<name>


def _ident(settings: Settings, table: str) -> str:
    """``<table>__quarantine``'s identifier, for a name the door would let through: it goes into
    SQL text (REFRESH, ALTER, MERGE), so anything else is refused, not quoted."""
    if not re.fullmatch(TABLE_PATTERN, table):
        raise QuarantineError(f"not a CDC table name: {table!r} (letters, digits and _; see TABLE_PATTERN)")
    return table_ident(settings, table + QUARANTINE_SUFFIX)


def quarantine(spark: Any, settings: Settings, table: str, reason: str | None = None) -> Any:
    """``<table>__quarantine`` as it is now, every column present (NULL where an older table lacks
    one), its rows whose reason contains ``reason`` (case-sensitive) when given."""
    from pyspark.sql import functions as F

    ident = _ident(settings, table)
    if not spark.catalog.tableExists(ident):
        raise QuarantineError(f"no quarantine table {ident}: the next apply of {table} creates it")
    spark.sql(f"REFRESH TABLE {ident}")  # another session may have committed since this one read it
    df = spark.table(ident)
    types = {EVENT: "string", REPLAYED_AT: "timestamp", REPLAY: "string"}
    for name, t in types.items():
        if name not in df.columns:
            df = df.withColumn(name, F.lit(None).cast(t))
    return df if reason is None else df.where(F.col(REASON).contains(reason))


def _status() -> Any:
    from pyspark.sql import functions as F

    return (
        F.when(F.col(REPLAYED_AT).isNotNull(), STATUSES[1])
        .when(F.col(EVENT).isNull(), STATUSES[2])
        .otherwise(STATUSES[0])
    )


def by_reason(spark: Any, settings: Settings, table: str, reason: str | None = None) -> tuple[list[str], list[Any]]:
    """(columns, rows): per reason and status, the quarantine rows and when the first and the
    last were quarantined."""
    from pyspark.sql import functions as F

    q = quarantine(spark, settings, table, reason)
    out = (
        q.groupBy(F.col(REASON).alias("reason"), _status().alias("status"))
        .agg(
            F.count(F.lit(1)).alias("events"),
            F.min(QUARANTINED_AT).alias("first_quarantined"),
            F.max(QUARANTINED_AT).alias("last_quarantined"),
        )
        .orderBy("reason", "status")
    )
    return out.columns, [tuple(r) for r in out.collect()]


def events(spark: Any, settings: Settings, table: str, reason: str | None = None) -> tuple[list[str], list[Any]]:
    """(columns, rows): each quarantine row, oldest first, with its status."""

    q = quarantine(spark, settings, table, reason)
    cols = [KEY, SOURCE, SEQ, OPERATION, REASON, QUARANTINED_AT, REPLAYED_AT, REPLAY]
    out = q.select(*cols, _status().alias("status")).orderBy(QUARANTINED_AT, SOURCE, SEQ)
    return out.columns, [tuple(r) for r in out.collect()]


def replay(
    spark: Any,
    settings: Settings,
    table: str,
    reason: str | None = None,
    force: bool = False,
    say: Callable[[str], None] | None = None,
) -> Replayed:
    """Land the quarantined events whose reason contains ``reason`` again (those not replayed
    yet; with ``force`` also those that were) and mark their rows replayed, under the table's lock."""
    from pyspark.sql import functions as F

    from cdclake.lake.locks import table_lock

    with table_lock(settings, table, "replay", ttl_s=LOCK_TTL_S, say=say):
        q = quarantine(spark, settings, table, reason)
        n = q.agg(
            F.count(F.lit(1)).alias("rows"),
            F.count(REPLAYED_AT).alias("already"),
            F.count(F.when(F.col(EVENT).isNull() & F.col(REPLAYED_AT).isNull(), 1)).alias("no_event"),
        ).first()
        done = Replayed(rows=n["rows"], already=0 if force else n["already"], no_event=n["no_event"])
        chosen = q.where(F.col(EVENT).isNotNull() & (F.lit(force) | F.col(REPLAYED_AT).isNull()))
        lines = chosen.dropDuplicates([SOURCE, SEQ]).orderBy(HISTORY_OBJECT, SOURCE, SEQ).select(SOURCE, SEQ, EVENT)
        ids: list[tuple[str, int, str]] = []
        for key, chunk in _land(settings, table, lines.toLocalIterator()):
            done.objects.append(key.path)
            ids += [(source, seq, key.path) for source, seq, _ in chunk]
        done.events = len(ids)
        if ids:
            _mark(spark, settings, table, ids, force)
    return done


def _land(settings: Settings, table: str, rows: Iterator[Any]) -> Iterator[tuple[staging.ObjectKey, list[Any]]]:
    """Each run of up to MAX_EVENTS_PER_BATCH lines written as one staging object of ``table``,
    named in the store's clock as the receiver names objects (:mod:`receiver.claim`)."""
    from cdclake.staging import stores
    from cdclake.staging.clock import StoreClock

    store = stores.open_store(settings)
    clock = StoreClock(store)
    chunk: list[Any] = []

    def put(i: int) -> staging.ObjectKey:
        key = staging.make_key(table, REPLAY_SOURCE, i, clock.upper_ms())
        store.put(key, b"".join(r[EVENT].encode() + b"\n" for r in chunk))
        return key

    i = 0
    for r in rows:
        chunk.append(r)
        if len(chunk) == MAX_EVENTS_PER_BATCH:
            yield put(i), chunk
            chunk, i = [], i + 1
    if chunk:
        yield put(i), chunk


def _mark(spark: Any, settings: Settings, table: str, ids: list[tuple[str, int, str]], force: bool) -> None:
    """Every quarantine row of the landed events replayed into their object: all of them, so the
    apply decides the events again (``spark_jobs.decide.logged_before``); rows replayed before
    keep their first replay unless ``force``."""
    ident = _ident(settings, table)
    have = spark.table(ident).columns
    missing = [f"{c} {t}" for c, t in ((REPLAYED_AT, "timestamp"), (REPLAY, "string")) if c not in have]
    if missing:  # a quarantine written before replays existed
        spark.sql(f"ALTER TABLE {ident} ADD COLUMNS ({', '.join(missing)})")
    spark.createDataFrame(ids, f"{SOURCE} string, {SEQ} long, {REPLAY} string").createOrReplaceTempView(
        "cdclake_replayed"
    )
    only_new = "" if force else f" AND t.{REPLAYED_AT} IS NULL"
    spark.sql(
        f"""MERGE INTO {ident} t USING cdclake_replayed s ON t.{SOURCE} = s.{SOURCE} AND t.{SEQ} = s.{SEQ}
            WHEN MATCHED{only_new} THEN UPDATE SET t.{REPLAYED_AT} = current_timestamp(), t.{REPLAY} = s.{REPLAY}"""
    )
