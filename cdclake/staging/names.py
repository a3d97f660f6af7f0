"""The staging layout: the ONLY place that knows how staging objects are named and ordered.

An object holds the events of one (batch, table) as NDJSON of :class:`cdclake.contracts.events.StagedEvent`.
Its key, relative to the staging root, is::

    <table>/<YYYY-MM-DD>/<HH>/<landed_ms:013d>-<batch_sequence:020d>-<source>.ndjson

so the lexicographic order of keys within a table is the order in which the receiver named them
(UTC time first). That order is NOT a commit order: a slow writer can make an object visible after
a later-named one was consumed. :mod:`cdclake.contracts.watermark` deals with that; nothing else should
assume listings are complete up to "now". ``landed_ms`` is the staging store's time, never a
host's (:mod:`cdclake.staging.clock`): the apply compares it with its listing time in that clock.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from datetime import UTC, datetime

SUFFIX = ".ndjson"
_NAME = re.compile(
    r"^(?P<day>\d{4}-\d{2}-\d{2})/(?P<hour>\d{2})/(?P<ms>\d{13})-(?P<seq>\d{20})-(?P<source>[A-Za-z0-9][A-Za-z0-9._-]*)"
    + re.escape(SUFFIX)
    + r"\Z"  # not "$": it also matches before a trailing newline, and a name is one line
)


@dataclass(frozen=True, order=True)
class ObjectKey:
    """Identity of one staging object. Ordering follows :attr:`name`."""

    table: str
    name: str

    @property
    def path(self) -> str:
        return f"{self.table}/{self.name}"

    @property
    def landed_ms(self) -> int:
        return parse_name(self.name)[0]

    @property
    def batch_sequence(self) -> int:
        return parse_name(self.name)[1]

    @property
    def source(self) -> str:
        return parse_name(self.name)[2]


def _prefix(ms: int) -> str:
    t = datetime.fromtimestamp(ms / 1000, UTC)
    return f"{t:%Y-%m-%d}/{t:%H}/{ms:013d}"


def object_name(landed_ms: int, batch_sequence: int, source: str) -> str:
    return f"{_prefix(landed_ms)}-{batch_sequence:020d}-{source}{SUFFIX}"


def make_key(table: str, source: str, batch_sequence: int, landed_ms: int | None = None) -> ObjectKey:
    ms = int(time.time() * 1000) if landed_ms is None else landed_ms
    return ObjectKey(table, object_name(ms, batch_sequence, source))


def is_object_name(name: str) -> bool:
    """Whether ``name`` (``<day>/<hour>/<file>``) is a staging object's name."""
    return _NAME.match(name) is not None


def parse_name(name: str) -> tuple[int, int, str]:
    """``(landed_ms, batch_sequence, source)`` of an object name; ValueError if it is not one."""
    m = _NAME.match(name)
    if not m:
        raise ValueError(f"not a staging object name: {name!r}")
    return int(m["ms"]), int(m["seq"]), m["source"]


def horizon(ms: int) -> str:
    """Every object named before this string (same table) was named before ``ms``."""
    return _prefix(ms)


TRANSACTIONS = ".transactions"
"""The folder of transaction markers: one object per batch that carries BEGIN/END markers, named
like a table's (:func:`make_key` with this as its table), lines of
:class:`cdclake.contracts.events.StagedMarker`. A dot folder, so never a table (``tables()`` skips
it, and the clean-up with it: the apply that reads the markers will own their clean-up)."""

CLOCK_FOLDER = ".clock"
"""Probe objects of :mod:`cdclake.staging.clock`, each removed right after its time is read."""
