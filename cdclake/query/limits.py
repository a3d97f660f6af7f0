"""What bounds one statement of the query API: one deadline from its parse to its last row, and
the size of its answer. pyspark and pyarrow are imported by the callers' sessions."""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from cdclake.query.statements import QueryError

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession


class TimedOut(QueryError):
    pass


class Cancelled(QueryError):
    pass


class TooLarge(QueryError):
    """The answer is larger than the server's byte cap."""


@contextlib.contextmanager
def deadline(spark: SparkSession, timeout_s: float, cancel: threading.Event | None = None) -> Iterator[None]:
    """Every Spark operation of the block is tagged, and interrupted after ``timeout_s``
    (TimedOut) or once ``cancel`` is set (Cancelled): parse, analysis, planning, execution and
    fetching alike."""
    tag = f"cdclake-query-{uuid.uuid4().hex}"
    fired: list[QueryError] = []
    done = threading.Event()

    def interrupt(why: QueryError) -> None:
        fired.append(why)
        # Again until the block ends: an interrupt stops the operations running when it is made,
        # and the block may start another one (the next step of a statement) after it.
        while True:
            spark.interruptTag(tag)
            if done.wait(0.1):
                return

    def watch() -> None:
        # One wait for both: the deadline, and the caller's cancel (checked every 0.1 s).
        end = time.monotonic() + timeout_s
        while not done.wait(min(0.1, max(0.0, end - time.monotonic()))):
            if cancel is not None and cancel.is_set():
                return interrupt(Cancelled("the query was cancelled: its client went away"))
            if time.monotonic() >= end:
                why = f"the query took longer than its timeout of {timeout_s:g} s and was cancelled"
                return interrupt(TimedOut(why))

    spark.addTag(tag)
    watcher = threading.Thread(target=watch, name=tag, daemon=True)
    watcher.start()
    try:
        yield
        if fired:  # interrupted between two operations: what ran after it is not an answer
            raise fired[0]
    except Exception:
        if fired:
            raise fired[0] from None
        raise
    finally:
        done.set()
        spark.removeTag(tag)


def fetch(spark: SparkSession, df: DataFrame, max_bytes: int | None) -> pa.Table:
    """``df`` as Arrow, TooLarge past ``max_bytes``: a Spark Connect answer is read batch by batch
    and abandoned at the cap, so the server never holds more than one batch past it."""
    import pyarrow as pa

    from cdclake.lake.spark import connect_client

    client = connect_client(spark)
    if client is None or max_bytes is None:
        table = df.toArrow()
        if max_bytes is not None and size_of(table) > max_bytes:
            raise TooLarge(f"the answer is larger than this server's limit of {max_bytes} bytes")
        return table
    plan: Any = df._plan  # what pyspark's own DataFrame.toArrow sends
    parts: list[pa.Table] = []
    size = 0
    for item in client.to_table_as_iterator(plan.to_proto(client), plan.observations):
        if isinstance(item, pa.Table):
            parts.append(item)
            size += size_of(item)
            if size > max_bytes:
                raise TooLarge(
                    f"the answer is larger than this server's limit of {max_bytes} bytes: ask for fewer "
                    "rows (maxRows) or columns"
                )
    from pyspark.sql.pandas.types import to_arrow_schema

    schema = to_arrow_schema(df.schema, error_on_duplicated_field_names_in_struct=True)
    return pa.concat_tables(parts).cast(schema) if parts else schema.empty_table()


def size_of(table: pa.Table) -> int:
    """The bytes of an answer's buffers. Not ``Table.nbytes``: pyarrow 26 crashes the process on it
    for an empty map column read from Spark Connect (measured; ``get_total_buffer_size`` reads
    the same buffers without walking their offsets)."""
    return int(table.get_total_buffer_size()) if table.num_rows else 0
