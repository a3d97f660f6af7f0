"""Which pending staging objects one apply run takes when its tables share a source's transactions,
and the source position the run's tables reach.

The rule (the consistent publish, docs/consistency.md): a run takes all of a transaction's pending
objects or none of them; never an object holding an event of a held transaction
(:mod:`cdclake.lake.wholeness`: no END yet, events still landing, a producer's fault); never a
transaction with events in a table the run does not write (its other half would be published
later, alone). Whatever shares an object with something left out is left out too, until nothing
changes. Objects of no transaction are taken as before: the first ``cap`` of each table.

The run's tables are the *unit* of the tables it was asked for: every table linked to them by a
landed transaction (:func:`unit`), so a transaction's tables are applied, and published, together.

Pure functions over what :func:`survey` read from the staging store (receipts and markers only).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from cdclake.lake import positions
from cdclake.lake.wholeness import Holding, Landing, Verdict, landed
from cdclake.staging.names import TRANSACTIONS, parse_name
from cdclake.staging.store import Store

TxKey = tuple[str, str]  # (source, transaction id): ids are a source's own


def survey(store: Store) -> dict[str, Landing]:
    """Every source that has staged transaction markers, and what of it has landed."""
    sources = sorted({parse_name(k.name)[2] for k in store.list(TRANSACTIONS)})
    return {s: landed(store, s) for s in sources}


def unit(tables: Iterable[str], landings: Mapping[str, Landing]) -> list[str]:
    """``tables`` and every table a landed transaction links to them, sorted."""
    members = _members(landings)
    linked: dict[str, set[str]] = {}
    for paths in members.values():
        ts = {_table(p) for p in paths}
        for t in ts:
            linked.setdefault(t, set()).update(ts)
    out = set(tables)
    todo = list(out)
    while todo:
        for t in linked.get(todo.pop(), ()):
            if t not in out:
                out.add(t)
                todo.append(t)
    return sorted(out)


@dataclass(frozen=True)
class Choice:
    objects: dict[str, list[str]]
    """Per table, the object names the run applies, in listing order."""
    positions: dict[str, str]
    """Per source, the greatest END position of the transactions the run applies."""
    waiting: dict[str, int]
    """Per table, pending objects left for a later run: held, or tied to what is."""
    held: dict[str, str]
    """``<source>:<transaction>`` -> why it is held (wholeness), for the run's report."""


def choose(
    pending: Mapping[str, Sequence[str]],
    cap: int,
    landings: Mapping[str, Landing],
    consumed: Callable[[str], bool] = lambda path: False,
) -> Choice:
    """The objects of ``pending`` (table -> unconsumed names, in listing order) one run takes.
    ``consumed(path)``: the table's watermark holds the object. An object of the run's tables
    that is neither pending nor consumed landed after its table was listed (the survey, read
    after the listings, sees it): its transactions wait for the next run, or this run would
    publish the halves it did list."""
    verdicts = {s: landing.verdict() for s, landing in landings.items()}
    by_path: dict[str, tuple[str, Holding]] = {h.path: (s, h) for s, ld in landings.items() for h in ld.objects}
    members = _members(landings)
    pending_paths = {f"{t}/{n}" for t, names in pending.items() for n in names}
    unlisted = {p for p in by_path if _table(p) in pending and p not in pending_paths and not consumed(p)}
    blocked = _blocked(by_path, members, verdicts, set(pending), unlisted)
    chosen: set[str] = set()
    for t, names in pending.items():
        chosen.update([p for n in names if (p := f"{t}/{n}") not in blocked][:cap])
    frontier = list(chosen)
    while frontier:  # a transaction's objects all or none, whichever table's cap they fall past
        found = by_path.get(frontier.pop())
        if found is None:
            continue
        source, holding = found
        for tx in holding.transactions:
            for q in members[(source, tx)]:
                if q in pending_paths and q not in chosen:
                    chosen.add(q)
                    frontier.append(q)
    objects = {t: [n for n in names if f"{t}/{n}" in chosen] for t, names in pending.items()}
    waiting = {t: n for t, names in pending.items() if (n := sum(f"{t}/{x}" in blocked for x in names))}
    return Choice(objects, _reached(chosen, by_path, verdicts), waiting, _held(verdicts))


def _members(landings: Mapping[str, Landing]) -> dict[TxKey, set[str]]:
    members: dict[TxKey, set[str]] = {}
    for s, landing in landings.items():
        for h in landing.objects:
            for tx in h.transactions:
                members.setdefault((s, tx), set()).add(h.path)
    return members


def _blocked(
    by_path: Mapping[str, tuple[str, Holding]],
    members: Mapping[TxKey, set[str]],
    verdicts: Mapping[str, Verdict],
    tables: set[str],
    unlisted: set[str],
) -> set[str]:
    """Paths the run may not take: held by wholeness, not listed, or tied (through shared
    objects, until nothing changes) to a transaction with events outside ``tables``."""
    blocked = {p for p, (s, _) in by_path.items() if p not in verdicts[s].publishable} | unlisted
    txs = {k for k, paths in members.items() if any(_table(p) not in tables for p in paths)}
    txs |= {(s, tx) for p in blocked for s, h in [by_path[p]] for tx in h.transactions}
    todo = list(txs)
    while todo:
        for p in members.get(todo.pop(), ()):
            if p in blocked:
                continue
            blocked.add(p)
            source, holding = by_path[p]
            for tx in holding.transactions:
                if (source, tx) not in txs:
                    txs.add((source, tx))
                    todo.append((source, tx))
    return blocked


def _reached(
    chosen: set[str], by_path: Mapping[str, tuple[str, Holding]], verdicts: Mapping[str, Verdict]
) -> dict[str, str]:
    ends: dict[str, list[str]] = {}
    for p in chosen:
        if p in by_path:
            s, h = by_path[p]
            ends.setdefault(s, []).extend(e for tx in h.transactions if (e := verdicts[s].ended_at.get(tx)) is not None)
    return {s: g for s, found in ends.items() if (g := positions.greatest(found)) is not None}


def _held(verdicts: Mapping[str, Verdict]) -> dict[str, str]:
    return {f"{s}:{tx}": f"{h.why}: {h.detail}" for s, v in verdicts.items() for tx, h in sorted(v.held.items())}


def _table(path: str) -> str:
    return path.split("/", 1)[0]
