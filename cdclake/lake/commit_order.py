"""A change history's data files read in commit-time order, no more of them than an answer needs.

Each file's manifest entry holds the lowest and highest ``_cdc_committed_at`` in it. Reading the
files by lowest commit time, a change is *settled* once every file not read yet starts later than
its commit time: nothing unread can sort before it. So the first ``limit`` changes after a cursor
are known as soon as ``limit`` of them are settled, however long the history behind them is; the
last change is known as soon as the files not read yet all end before it. Memory holds the answer
and the files of one read. A file without bounds (metrics off) counts as spanning all time: it is
read first, as before. Files are read in groups that double up to :data:`MAX_GROUP`, so a page at
the head of the history opens one file and a long one is read in parallel like a whole scan.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from cdclake.contracts import history as h

if TYPE_CHECKING:
    from pyiceberg.table import DataScan, FileScanTask, Table

MAX_GROUP = 16
_MIN, _MAX = -(2**63), 2**63 - 1

Rows = list[dict[str, Any]]
Position = tuple[int, tuple[int, ...], str, int]
"""(commit time in microseconds, ordering value, producer, sequence)."""


class Positioned(Protocol):
    """What this module reads of a change (:class:`cdclake.lake.changes.Change` is one)."""

    @property
    def committed_at_us(self) -> int: ...
    @property
    def position(self) -> Position: ...


C = TypeVar("C", bound=Positioned)


def _bound(task: FileScanTask, field_id: int, upper: bool) -> int:
    from pyiceberg.conversions import from_bytes
    from pyiceberg.types import TimestamptzType

    bounds = task.file.upper_bounds if upper else task.file.lower_bounds
    raw = (bounds or {}).get(field_id)
    if raw is None:
        return _MAX if upper else _MIN
    return int(from_bytes(TimestamptzType(), raw))  # microseconds


def _groups(tasks: Sequence[FileScanTask]) -> list[list[FileScanTask]]:
    out, i, step = [], 0, 1
    while i < len(tasks):
        out.append(list(tasks[i : i + step]))
        i, step = i + step, min(2 * step, MAX_GROUP)
    return out


def _read(log: Table, scan: DataScan, group: list[FileScanTask]) -> Rows:
    from pyiceberg.io.pyarrow import ArrowScan

    reader = ArrowScan(log.metadata, log.io, scan.projection(), scan.row_filter, scan.case_sensitive)
    rows: Rows = reader.to_table(group).to_pylist()
    return rows


def earliest(log: Table, scan: DataScan, limit: int, keep: Callable[[Rows], list[C]]) -> list[C]:
    """The first ``limit`` (by position) of the changes ``keep`` makes of ``scan``'s rows."""
    field_id = log.schema().find_field(h.COMMITTED_AT).field_id
    tasks = sorted(scan.plan_files(), key=lambda t: _bound(t, field_id, upper=False))
    groups = _groups(tasks)
    found: list[C] = []
    for n, group in enumerate(groups):
        found = sorted(found + keep(_read(log, scan, group)), key=lambda c: c.position)[:limit]
        if n + 1 < len(groups):
            unread_from = _bound(groups[n + 1][0], field_id, upper=False)
            if len(found) == limit and found[-1].committed_at_us < unread_from:
                break  # every kept change is settled: no unread file holds an earlier one
    return found


def latest(log: Table, scan: DataScan, keep: Callable[[Rows], list[C]]) -> Position | None:
    """The greatest position among the changes ``keep`` makes of ``scan``'s rows."""
    field_id = log.schema().find_field(h.COMMITTED_AT).field_id
    tasks = sorted(scan.plan_files(), key=lambda t: _bound(t, field_id, upper=True), reverse=True)
    groups = _groups(tasks)
    best: Position | None = None
    for n, group in enumerate(groups):
        best = max([c.position for c in keep(_read(log, scan, group))] + ([best] if best else []), default=None)
        # A file ending at best's own commit time may hold a later change of the same run.
        if best is not None and n + 1 < len(groups) and best[0] > _bound(groups[n + 1][0], field_id, upper=True):
            break
    return best
