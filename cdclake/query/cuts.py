"""Consistent reads for the query engine: the tables a statement reads, pinned at one cut
(:mod:`cdclake.lake.cut`), as an ``asOf`` with each table's own snapshot.

The tables are those of Spark's analyzed plan of the statement (the relations it resolved, and
``<table>__history`` names, which read ``<table>__changes``), so the cut is read for what the
statement reads and nothing else: a position cut fails for a table without one, and must not fail
for a word that only looks like a table. The cut is read once per query; the rewrite then asks
for ``VERSION AS OF`` each pinned snapshot, and the plan check proves each scan reads it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from cdclake.contracts.events import CHANGES_SUFFIX, HISTORY_SUFFIX
from cdclake.query import relations
from cdclake.query.statements import AsOf, Cut, QueryError

if TYPE_CHECKING:
    from cdclake.config.settings import Settings

Pin = Callable[[Cut, list[str]], Mapping[str, int | None]]


def read_tables(extended: str, catalog: str, namespace: str) -> list[str]:
    """The tables of ``catalog``.``namespace`` that ``EXPLAIN EXTENDED`` text says the statement
    reads, lower-case, in order of appearance (a metadata table counts as its table)."""
    found = relations.touched(extended)
    if found is None:
        return []
    out: list[str] = []
    for name in found.resolved + found.unresolved:
        t = relations.table_of(name, catalog, namespace)
        if t is None or t[0].lower() != namespace.lower():
            continue
        table = t[1].lower()
        if name in found.unresolved:
            if not table.endswith(HISTORY_SUFFIX):
                continue  # not there: analysis fails on it, nothing to pin
            table = table.removesuffix(HISTORY_SUFFIX) + CHANGES_SUFFIX
        out.append(table)
    return list(dict.fromkeys(out))


def pinned(
    pin: Pin | None,
    cut: Cut,
    extended: str,
    catalog: str,
    namespace: str,
    may_read: Callable[[str, str], bool] = lambda *_: True,
) -> AsOf:
    """The ``asOf`` that reads every table of the statement explained in ``extended`` at ``cut``.
    Only tables the client may read are pinned: a cut's answer (a table missing, its positions)
    must say nothing of the others, which the rights check then refuses whether they exist or not."""
    if pin is None:
        raise QueryError(f"{cut.label()}: no catalog to read the tables' state from here")
    tables = [t for t in read_tables(extended, catalog, namespace) if may_read(namespace, t)]
    return AsOf.pin(pin(cut, tables) if tables else {}, cut.label())


def pin_tables(settings: Settings, cut: Cut, tables: list[str]) -> Mapping[str, int | None]:
    """:func:`cdclake.lake.cut.current_snapshots` or :func:`~cdclake.lake.cut.snapshots_at_position`
    of ``tables``; a table without a snapshot at the position is the request's error."""
    from pyiceberg.exceptions import NoSuchTableError

    from cdclake.lake import cut as cuts

    try:
        if cut.source is None:
            return cuts.current_snapshots(settings, tables)
        return cuts.snapshots_at_position(settings, tables, cut.source, cut.position)
    except cuts.NoSnapshotAtPosition as exc:
        raise QueryError(f"{cut.label()}: {exc}") from None
    except NoSuchTableError as exc:  # dropped since Spark planned the statement
        raise QueryError(f"{cut.label()}: {exc}") from None
