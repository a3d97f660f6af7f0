"""The applied changes of a table, in commit order, after a cursor: what ``GET /v1/changes`` and
the subscribe stream serve (restcatalog/changes.py), read from the change history
(``<table>__changes``) with pyiceberg, no Spark.

A change is visible once the table's own commit holds it: the apply logs a run's events in the
history first, then commits the table (:mod:`spark_jobs.apply`); a change whose staging object
the table's watermark does not hold yet (a run in progress, or one that crashed before its table
commit) is not served until it does. Order: the run's commit time (``_cdc_committed_at``, one
value per run, runs of a table one at a time under its lock), then the key's ordering value, the
producer and its sequence: a total order, the same on every read. A position in it is a
:class:`Position`; a cursor is one per table, opaque to clients (:func:`encode`).
"""

from __future__ import annotations

import base64
import datetime as dt
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cdclake.config.settings import Settings
from cdclake.contracts import history as h
from cdclake.contracts.events import CHANGES_SUFFIX
from cdclake.contracts.watermark import Watermark
from cdclake.lake.catalog import load_table, table_watermark
from cdclake.lake.commit_order import Position, earliest, latest

OPERATIONS = ("INSERT", "UPDATE", "DELETE", "TRUNCATE")
"""A TRUNCATE's change has the key ``*`` and no ``after``: every row of the table before it is gone."""
ROWLESS = ("DELETE", "TRUNCATE")


class BadCursor(ValueError):
    pass


@dataclass(frozen=True)
class Change:
    table: str
    operation: str
    key: str
    after: dict[str, Any] | None  # the row as applied; None for a DELETE or TRUNCATE
    order: list[int]
    source: str
    sequence: int
    committed_at_us: int
    before: dict[str, Any] | None = None  # the producer's before image, as it sent it
    metadata: dict[str, Any] | None = None  # the producer's metadata (Debezium: source position, ...)
    transaction: str | None = None  # the source transaction's id, when the producer sent one

    @property
    def position(self) -> Position:
        return (self.committed_at_us, tuple(self.order), self.source, self.sequence)


def encode(cursor: Mapping[str, Position]) -> str:
    raw = json.dumps({t: [p[0], list(p[1]), p[2], p[3]] for t, p in sorted(cursor.items())}, separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


MAX_COMMIT_US = 253_402_300_799_999_999
"""9999-12-31T23:59:59.999999Z, the last commit time :func:`when` can give (an Iceberg timestamp
holds more, but no commit is made past it)."""
_LONG = (-(2**63), 2**63 - 1)  # ordering values and sequences are Iceberg longs


def _long(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and _LONG[0] <= value <= _LONG[1]


def decode(text: str) -> dict[str, Position]:
    """A cursor :func:`encode` made; BadCursor for anything else, numbers out of range included
    (a commit time 0..:data:`MAX_COMMIT_US` microseconds, an ordering value and a sequence each a
    long): they would reach the history's filter and overflow it."""
    try:
        data = json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
        out: dict[str, Position] = {}
        for table, (at, order, source, seq) in data.items():
            if not (isinstance(at, int) and isinstance(source, str) and isinstance(order, list)):
                raise TypeError
            if not (_long(at) and 0 <= at <= MAX_COMMIT_US and _long(seq) and all(_long(o) for o in order)):
                raise BadCursor(f"a position of table {str(table)[:80]!r} is out of range: {text[:80]!r}")
            out[str(table)] = (at, tuple(order), source, seq)
        return out
    except BadCursor:
        raise
    except (ValueError, TypeError, AttributeError) as exc:
        raise BadCursor(f"not a cursor this server gave: {text[:80]!r}") from exc


def read_changes(
    settings: Settings, table: str, after: Position | None, operations: Sequence[str], limit: int
) -> list[Change]:
    """Up to ``limit`` visible applied changes of ``table`` after ``after`` (None: from the
    first), oldest first, of the given operations."""
    from pyiceberg import expressions

    # pyiceberg's expressions are pydantic models whose generated signatures mypy misreads.
    ex: Any = expressions

    wm = table_watermark(settings, table)  # first: a run committing meanwhile shows up next time
    log = load_table(settings, table + CHANGES_SUFFIX)
    if wm is None or log is None or log.current_snapshot() is None:
        return []
    where = ex.EqualTo(h.OUTCOME, "applied")
    if after is not None:
        where = ex.And(where, ex.GreaterThanOrEqual(h.COMMITTED_AT, after[0]))

    def keep(rows: list[dict[str, Any]]) -> list[Change]:
        return [
            c for c in _changes(table, rows, wm) if c.operation in operations and (after is None or c.position > after)
        ]

    # Bounded by limit: only the history's files the page needs are read (commit_order).
    return earliest(log, log.scan(row_filter=where), limit, keep)


def last_position(settings: Settings, table: str) -> Position | None:
    """The position of ``table``'s last visible applied change (any operation); None: none yet.
    Runs of a table log and commit one at a time, so a change logged but not yet visible (its run
    has not committed the table) has a later commit time than every visible one: a cursor here
    misses nothing."""
    from pyiceberg import expressions

    ex: Any = expressions  # as in read_changes
    wm = table_watermark(settings, table)
    log = load_table(settings, table + CHANGES_SUFFIX)
    if wm is None or log is None or log.current_snapshot() is None:
        return None
    have = {f.name for f in log.schema().fields}  # histories written before ORDER existed lack it
    fields = tuple(
        f for f in (h.KEY, h.OPERATION, h.COMMITTED_AT, h.ORDER, h.SOURCE, h.SEQ, h.HISTORY_OBJECT) if f in have
    )
    scan = log.scan(row_filter=ex.EqualTo(h.OUTCOME, "applied"), selected_fields=fields)
    return latest(log, scan, lambda rows: _changes(table, rows, wm))


def _changes(table: str, rows: list[dict[str, Any]], wm: Watermark) -> list[Change]:
    out = []
    data_columns = None
    for r in rows:
        if not wm.consumed(r[h.HISTORY_OBJECT] or ""):
            continue
        if data_columns is None:
            data_columns = [c for c in r if c not in h.HISTORY_COLUMNS and c not in h.SYSTEM_COLUMNS]
        op = str(r[h.OPERATION])
        at = r[h.COMMITTED_AT]
        out.append(
            Change(
                table,
                op,
                str(r[h.KEY]),
                None if op in ROWLESS else {c: r[c] for c in data_columns},
                [int(o) for o in (r.get(h.ORDER) or [r[h.SEQ]])],
                str(r[h.SOURCE]),
                int(r[h.SEQ]),
                _micros(at),
                _json(r.get(h.BEFORE)),
                _json(r.get(h.METADATA)),
                r.get(h.TRANSACTION),
            )
        )
    return out


def _json(text: str | None) -> dict[str, Any] | None:
    # The apply stores what the door let in: a JSON object, or nothing.
    return None if text is None else json.loads(text)


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def _micros(at: Any) -> int:
    if isinstance(at, dt.datetime):
        aware = at if at.tzinfo is not None else at.replace(tzinfo=dt.UTC)
        return (aware - _EPOCH) // dt.timedelta(microseconds=1)
    return int(at)


def when(micros: int) -> dt.datetime:
    """A change's commit time from its microseconds."""
    return _EPOCH + dt.timedelta(microseconds=micros)
