"""The quarantine's rows (``<table>__quarantine``): each quarantined event with its reason and its
whole staged line, so that ``cdclake quarantine replay`` can land it again after the staging
object it came in is cleaned up (:mod:`cdclake.lake.quarantine`)."""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from cdclake.contracts import history
from spark_jobs.system import KEY, OBJECT, OP, REASON, SEQ, SOURCE, TS

Lines = Callable[[list[str]], DataFrame]  # (OBJECT, SOURCE, SEQ, EVENT) of the given objects' lines


def quarantine_rows(quarantined: DataFrame, lines: Lines | None) -> Callable[[list[str]], DataFrame]:
    """The rows of the ``todo`` objects' quarantined events; ``lines`` None: the run quarantined
    nothing (the rows serve as the table's schema), so the staging objects are not read again."""

    def build(todo: list[str]) -> DataFrame:
        rows = quarantined.where(F.col(OBJECT).isin(todo))
        if lines is None:
            rows = rows.withColumn(history.EVENT, F.lit(None).cast("string"))
        else:
            # Left: a quarantined event is kept even if its line were not found (it always is).
            rows = rows.join(lines(todo), [OBJECT, SOURCE, SEQ], "left")
        return rows.select(
            KEY,
            SEQ,
            TS,
            SOURCE,
            F.col(OP).alias(history.OPERATION),
            F.col(OBJECT).alias(history.HISTORY_OBJECT),
            F.col(REASON).alias(history.REASON),
            F.current_timestamp().alias(history.QUARANTINED_AT),
            F.col(history.EVENT),
            F.lit(None).cast("timestamp").alias(history.REPLAYED_AT),
            F.lit(None).cast("string").alias(history.REPLAY),
        )

    return build


def staged_lines(spark: SparkSession, uris: dict[str, str], quarantined: DataFrame) -> Lines:
    """The staged lines of the quarantined events, read again as text from the objects that hold
    one (a run quarantines few events: the other objects are not read). A line is found by its
    object, ``source`` and ``sequence``; of an event staged twice in one object, one line."""

    def lines(todo: list[str]) -> DataFrame:
        held = [r[0] for r in quarantined.where(F.col(OBJECT).isin(todo)).select(OBJECT).distinct().collect()]
        if not held:
            return spark.createDataFrame([], f"{OBJECT} string, {SOURCE} string, {SEQ} long, {history.EVENT} string")
        text = spark.read.text([uris[n] for n in sorted(held)]).where(F.col("value") != "")
        return text.select(
            # <day>/<hour>/<file>, as spark_jobs.read names a line's object.
            F.substring_index(F.col("_metadata.file_path"), "/", -3).alias(OBJECT),
            F.get_json_object("value", "$.source").alias(SOURCE),
            F.get_json_object("value", "$.sequence").cast("long").alias(SEQ),
            F.col("value").alias(history.EVENT),
        ).dropDuplicates([OBJECT, SOURCE, SEQ])

    return lines
