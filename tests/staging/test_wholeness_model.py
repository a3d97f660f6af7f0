"""cdclake.lake.wholeness against a brute-force model, over random landings (hypothesis,
derandomized): transactions interleaved across batches and tables, events not landed yet, exact
duplicates within a batch, ENDs lost, late, redelivered, wrong or contradicted.

The code under test sees what the receiver records: each batch through ``Prepared.from_batch``
(its receipt's per-object counts) and its markers as staged. The model sees the events
themselves: it counts distinct events per transaction and table, and finds the publishable
objects by trying every subset of them (the largest set closed under "every transaction in it
is whole and all its objects are in it"), not by the fixpoint the code runs."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from cdclake.contracts.events import Batch, CDCEvent, EventTransaction, StagedMarker, TransactionMarker, stage_markers
from cdclake.lake.wholeness import Holding, whole
from receiver.prepared import Prepared

TABLES = ("a", "b", "c")
BATCHES = 4


@dataclass(frozen=True)
class Ev:
    seq: int
    table: str
    tx: str | None
    batch: int | None  # None: not landed (yet)
    copies: int  # an exact duplicate within its batch: copies > 1


@dataclass(frozen=True)
class World:
    events: list[Ev]
    ends: list[tuple[int, TransactionMarker]]  # (batch, END) as landed, redeliveries and conflicts included
    begins: list[tuple[int, str]]


@st.composite
def worlds(draw: st.DrawFn) -> World:
    n_tx = draw(st.integers(1, 4))
    events: list[Ev] = []
    ends: list[tuple[int, TransactionMarker]] = []
    begins: list[tuple[int, str]] = []
    seq = itertools.count(1)
    for i in range(n_tx):
        tx = f"t{i}"
        mine = [
            Ev(next(seq), draw(st.sampled_from(TABLES)), tx, draw(st.one_of(st.none(), st.integers(0, BATCHES - 1))), 1)
            for _ in range(draw(st.integers(0, 4)))
        ]
        mine = [e if draw(st.integers(0, 5)) else Ev(e.seq, e.table, tx, e.batch, 2) for e in mine]
        events += mine
        counts = {t: sum(1 for e in mine if e.table == t) for t in TABLES if any(e.table == t for e in mine)}
        if draw(st.integers(0, 5)) == 0 and counts:  # a wrong END: one table's count off by one
            t = draw(st.sampled_from(sorted(counts)))
            counts[t] += draw(st.sampled_from([-1, 1]))
        marker = TransactionMarker(tx, "END", eventCount=sum(counts.values()), tables=counts, position=str(10 * i))
        begins.append((draw(st.integers(0, BATCHES - 1)), tx))
        for _ in range(draw(st.sampled_from([0, 1, 1, 1, 2]))):  # lost, landed, redelivered
            ends.append((draw(st.integers(0, BATCHES - 1)), marker))
        if draw(st.integers(0, 9)) == 0:  # another END of this id that says otherwise
            other = TransactionMarker(tx, "END", eventCount=0, tables={}, position=marker.position)
            ends.append((draw(st.integers(0, BATCHES - 1)), other))
    plain = draw(st.lists(st.tuples(st.sampled_from(TABLES), st.integers(0, BATCHES - 1)), max_size=3))
    events += [Ev(next(seq), t, None, b, 1) for t, b in plain]
    return World(events, ends, begins)


def landed_as_the_receiver_records(w: World) -> tuple[list[StagedMarker], list[Holding]]:
    markers: list[StagedMarker] = []
    holdings: list[Holding] = []
    for b in range(BATCHES):
        evs = [
            CDCEvent(e.seq, 0, "INSERT", e.table, str(e.seq), after={"id": e.seq}, transaction=tx_of(e))
            for e in w.events
            if e.batch == b
            for _ in range(e.copies)
        ]
        marks = [TransactionMarker(tx, "BEGIN") for bb, tx in w.begins if bb == b]
        marks += [m for bb, m in w.ends if bb == b]
        p = Prepared.from_batch(Batch("src", b, evs, marks or None))
        staged = stage_markers(Batch("src", b, evs, marks or None))
        if staged is not None:
            markers += [msgspec.json.decode(line, type=StagedMarker) for line in staged.splitlines()]
        holdings += [Holding(f"{t}/{b}", t, (p.transactions or {}).get(t, {})) for t in p.tables]
    return markers, holdings


def tx_of(e: Ev) -> EventTransaction | None:
    return None if e.tx is None else EventTransaction(e.tx)


def model(w: World) -> tuple[set[str], set[str], str | None]:
    """(whole transactions, publishable objects, position) by brute force over the events."""
    objects: dict[str, set[str | None]] = {}
    for e in w.events:
        if e.batch is not None:
            objects.setdefault(f"{e.table}/{e.batch}", set()).add(e.tx)
    txs = {e.tx for e in w.events if e.tx is not None} | {tx for _, tx in w.begins}

    def alone(tx: str) -> bool:
        said = {(m.eventCount, tuple(sorted((m.tables or {}).items()))) for _, m in w.ends if m.id == tx}
        if len(said) != 1:
            return False
        [(_, tables)] = said
        landed = [e for e in w.events if e.tx == tx and e.batch is not None]
        return all(len({e.seq for e in landed if e.table == t}) == dict(tables).get(t, 0) for t in TABLES)

    def closed(subset: set[str]) -> bool:
        return all(
            tx is None or (alone(tx) and all(o in subset for o, held in objects.items() if tx in held))
            for o in subset
            for tx in objects[o]
        )

    names = sorted(objects)
    best: set[str] = set()
    for r in range(len(names) + 1):
        for combo in itertools.combinations(names, r):
            if closed(set(combo)):
                best |= set(combo)
    ok = {tx for tx in txs if alone(tx) and all(o in best for o, held in objects.items() if tx in held)}
    ends = [int(m.position or 0) for _, m in w.ends if m.id in ok]
    return ok, best, (str(max(ends)) if ends else None)


@settings(max_examples=400, derandomize=True, deadline=None)
@given(worlds())
def test_the_verdict_matches_the_brute_force_model(w: World) -> None:
    markers, holdings = landed_as_the_receiver_records(w)
    v = whole(markers, holdings)
    ok, publishable, position = model(w)
    assert (set(v.whole), set(v.publishable), v.position) == (ok, publishable, position)
    # Every transaction the model does not call whole is held, with a reason.
    assert set(v.held) == ({e.tx for e in w.events if e.tx} | {tx for _, tx in w.begins}) - ok
