"""Which of a source's transactions are whole, and which staging objects may be published, from
the receipts and the transaction markers alone (no data object is read).

A source transaction is *whole* when its END has landed and, for each table, the distinct events
of it that landed are exactly as many as the END counts there (a table the END does not name:
none). The receipts count each object's events per transaction (:attr:`Receipt.transactions`);
the markers are the batches' objects in the staging folder ``.transactions``.

An object may be published only when every transaction it holds events of is whole and not held
for another reason; an object of no transaction always may. A whole transaction with events in
an object that may not be published is held too (its events there would be missing), which can
hold more objects, so the rule is applied until nothing changes. Held transactions' events are
never published, whatever later transaction is whole.

Held, with why: no END yet; a table with fewer events than the END counts; more events than it
counts (a producer bug, or the same events landed twice under different batch numbers, which the
counts cannot tell apart: never published silently); two ENDs of one id that disagree; an END
without counts (completeness cannot be checked); events sharing an object with a held one.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

import msgspec

from cdclake.contracts.events import StagedMarker
from cdclake.lake import positions
from cdclake.staging.names import TRANSACTIONS
from cdclake.staging.receipts import Receipt, TxEvents, decode_receipt, parse_receipt_name, receipt_prefix
from cdclake.staging.store import Store

Why = Literal["open", "short", "over", "conflict", "uncounted", "entangled"]
FAULTS: frozenset[Why] = frozenset({"over", "conflict"})
"""Reasons that are a producer's bug, not a transaction still landing: report them loudly."""


@dataclass(frozen=True)
class Holding:
    """A staged object and how many distinct events of each transaction it holds."""

    path: str
    table: str
    transactions: Mapping[str, TxEvents] = field(default_factory=dict)
    """Per transaction, how many of its events, or their ``tableOrder`` runs (the receipt's form)."""


@dataclass(frozen=True)
class Held:
    id: str
    why: Why
    detail: str
    """What a person reads: ``orders has 1 of 2 events``."""


@dataclass(frozen=True)
class Verdict:
    whole: frozenset[str]
    """Transactions whose every event may be published now."""
    held: Mapping[str, Held]
    publishable: frozenset[str]
    """Object paths that may be published: none holds an event of a held transaction."""
    position: str | None
    """The source position the published transactions reach (:func:`positions.greatest` of the
    whole ones' END positions); None: none, or positions with no common order."""
    behind: frozenset[str]
    """Held transactions whose END lies before :attr:`position`: the publish is not a prefix of
    the source (it lacks them), though every transaction in it is whole."""
    ended_at: Mapping[str, str] = field(default_factory=dict)
    """Each whole transaction's END position, where its END gives one."""

    @property
    def faults(self) -> list[Held]:
        return [h for h in self.held.values() if h.why in FAULTS]


@dataclass(frozen=True)
class _End:
    event_count: int | None
    tables: tuple[tuple[str, int], ...] | None
    position: str | None


def whole(markers: Iterable[StagedMarker], objects: Iterable[Holding]) -> Verdict:
    """The verdict on one source's landed markers and objects (each object once)."""
    objs = list(objects)
    ends, ids = _ends(markers)
    landed = _landed(objs)
    ids |= set(landed)
    held = {tx: h for tx in sorted(ids) if (h := _judge(tx, ends.get(tx, set()), landed.get(tx, {}))) is not None}
    _entangle(objs, held)
    ok = frozenset(ids - set(held))
    publishable = frozenset(o.path for o in objs if not any(tx in held for tx in o.transactions))
    reached = [p for tx in ok for e in ends[tx] if (p := e.position) is not None]
    position = positions.greatest(reached)
    behind = frozenset(
        tx
        for tx, h in held.items()
        if position is not None
        and any(e.position is not None and positions.before(e.position, position) for e in ends.get(tx, ()))
    )
    ended_at = {tx: p for tx in ok for e in ends.get(tx, ()) if (p := e.position) is not None}
    return Verdict(ok, held, publishable, position, behind, ended_at)


def _landed(objs: list[Holding]) -> dict[str, dict[str, int]]:
    """Per transaction and table, its distinct landed events: counts add up; ``tableOrder`` runs
    are united first, so an event landed in two objects (a re-sent post cut differently) counts
    once."""
    counted: dict[tuple[str, str], int] = {}
    ordered: dict[tuple[str, str], set[int]] = {}
    for o in objs:
        for tx, events in o.transactions.items():
            if isinstance(events, int):
                counted[(tx, o.table)] = counted.get((tx, o.table), 0) + events
            else:
                ordered.setdefault((tx, o.table), set()).update(n for lo, hi in events for n in range(lo, hi + 1))
    out: dict[str, dict[str, int]] = {}
    for tx, table in counted.keys() | ordered.keys():
        n = counted.get((tx, table), 0) + len(ordered.get((tx, table), ()))
        out.setdefault(tx, {})[table] = n
    return out


def _ends(markers: Iterable[StagedMarker]) -> tuple[dict[str, set[_End]], set[str]]:
    """Each transaction's distinct ENDs (a redelivered END is one; two that differ, a conflict),
    and every id a marker names."""
    ends: dict[str, set[_End]] = {}
    ids: set[str] = set()
    for m in markers:
        ids.add(m.id)
        if m.status == "END":
            tables = None if m.tables is None else tuple(sorted(m.tables.items()))
            ends.setdefault(m.id, set()).add(_End(m.eventCount, tables, m.position))
    return ends, ids


def _judge(tx: str, ends: set[_End], landed: Mapping[str, int]) -> Held | None:
    """Why ``tx`` is held on its own (before objects are shared), or None: it is whole."""
    if not ends:
        return Held(tx, "open", "no END yet")
    if len(ends) > 1:
        return Held(tx, "conflict", f"{len(ends)} ENDs with this id disagree (counts or position)")
    [end] = ends
    if end.tables is None:
        if end.event_count is None:
            return Held(tx, "uncounted", "the END counts no events: wholeness cannot be checked")
        want: dict[str, int] = {"*": end.event_count}
        have = {"*": sum(landed.values())}
    else:
        want = dict(end.tables)
        have = dict(landed)
    tables = sorted(set(want) | set(have))
    over = [t for t in tables if have.get(t, 0) > want.get(t, 0)]
    short = [t for t in tables if have.get(t, 0) < want.get(t, 0)]

    def told(ts: list[str]) -> str:
        named = {t: "all tables" if t == "*" else t for t in ts}
        return "; ".join(f"{named[t]} has {have.get(t, 0)} of {want.get(t, 0)} events" for t in ts)

    if over:
        return Held(tx, "over", f"more events than the END counts (a producer bug or a redelivery): {told(over)}")
    if short:
        return Held(tx, "short", told(short))
    return None


def _entangle(objs: list[Holding], held: dict[str, Held]) -> None:
    """Hold every transaction that shares an object with a held one, until none is added."""
    changed = True
    while changed:
        changed = False
        for o in sorted(objs, key=lambda o: o.path):
            blocker = min((tx for tx in o.transactions if tx in held), default=None)
            if blocker is None:
                continue
            for tx in sorted(o.transactions):
                if tx not in held:
                    held[tx] = Held(tx, "entangled", f"shares {o.path} with held transaction {blocker}")
                    changed = True


@dataclass(frozen=True)
class Landing:
    """What :func:`landed` found of one source in a store."""

    markers: list[StagedMarker]
    objects: list[Holding]
    missing: list[str]
    """Objects a newest receipt names that do not exist: still being written (or cleaned up)."""

    def verdict(self) -> Verdict:
        return whole(self.markers, self.objects)


_marker_decoder = msgspec.json.Decoder(StagedMarker)


def decode_markers(data: bytes) -> list[StagedMarker]:
    """The markers of one ``.transactions`` object (NDJSON)."""
    return [_marker_decoder.decode(line) for line in data.splitlines() if line]


def landed(store: Store, source: str) -> Landing:
    """``source``'s markers and table objects in ``store``, from the newest receipt generation of
    each of its batches (it names every object of the batch, a take-over's too): the receipts and
    the markers objects are read, each table object only checked for existence."""
    newest: dict[int, tuple[int, str]] = {}
    for name in store.list_names(receipt_prefix(source)):
        parsed = parse_receipt_name(name)
        if parsed is not None and (parsed[0] not in newest or newest[parsed[0]][0] < parsed[1]):
            newest[parsed[0]] = (parsed[1], name)

    def one(name: str) -> tuple[list[StagedMarker], list[Holding], list[str]]:
        data = store.read(receipt_prefix(source) + name)
        return ([], [], []) if data is None else _batch(store, decode_receipt(data))

    names = [name for _, name in sorted(newest.values(), key=lambda gn: gn[1])]
    out = Landing([], [], [])
    with concurrent.futures.ThreadPoolExecutor(min(16, max(1, len(names)))) as pool:
        for markers, holdings, missing in pool.map(one, names):
            out.markers.extend(markers)
            out.objects.extend(holdings)
            out.missing.extend(missing)
    return out


def _batch(store: Store, receipt: Receipt) -> tuple[list[StagedMarker], list[Holding], list[str]]:
    markers: list[StagedMarker] = []
    holdings: list[Holding] = []
    missing: list[str] = []
    counts = receipt.transactions or {}
    for path in receipt.keys:
        table = path.split("/", 1)[0]
        if table == TRANSACTIONS:
            data = store.read(path)
            if data is None:
                missing.append(path)
            else:
                markers.extend(decode_markers(data))
        elif store.exists(path):
            holdings.append(Holding(path, table, counts.get(table, {})))
        else:
            missing.append(path)
    return markers, holdings, missing
