"""A batch as it lands: its staging payloads and their digest (:class:`Prepared`), and where it
landed (:class:`Landed`)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Literal

from cdclake.contracts.events import Batch, stage_lines, stage_markers, stage_types
from cdclake.contracts.numbers import check_number_lengths
from cdclake.staging.names import TRANSACTIONS
from cdclake.staging.receipts import TxEvents

Status = Literal["persisted", "duplicate", "fallback"]


@dataclass(frozen=True)
class Prepared:
    """A decoded batch turned into staging payloads, ready to land."""

    source: str
    sequence_number: int
    events: int
    objects: dict[str, bytes]
    """Per table, its object's NDJSON; and under :data:`~cdclake.staging.names.TRANSACTIONS` the
    batch's markers, so the claim, the receipt and the spool treat them as one more object: a
    resend finds them landed like the events (and a batch of markers only lands just them)."""
    digest: str
    types: dict[str, Any] | None = None
    """Per table, its object's JSON types (:func:`cdclake.contracts.events.stage_types`), for the
    receipt: the apply reads the object with them instead of inferring."""
    transactions: dict[str, dict[str, TxEvents]] | None = None
    """Per table, its object's distinct events per source transaction (:func:`transaction_counts`),
    for the receipt: what decides a transaction is whole without reading the objects."""

    @classmethod
    def from_batch(cls, batch: Batch, by_identity: bool = False) -> Prepared:
        """``by_identity``: the batch number is derived from its events' identities (Debezium,
        :func:`cdclake.debezium.envelope.to_batch`), so two landings of one number are the same events
        whatever else changed: a Debezium restarted after a crash re-sends a change with a new
        processing time (``ts_ms``), and comparing content would refuse it forever."""
        objects = stage_lines(batch)
        check_number_lengths(batch, objects)
        markers = stage_markers(batch)
        if markers is not None:
            objects[TRANSACTIONS] = markers
        if by_identity:
            ids = ",".join(str(e.sequence) for e in batch.events)
            # Markers are identified by id and status (Debezium re-sends them with the same ones).
            ids += "".join(f";{m.status}:{m.id}" for m in batch.transactions or [])
            digest = "ids:" + hashlib.sha256(ids.encode()).hexdigest()
        else:
            digest = content_digest(objects)
        counts = transaction_counts(batch)
        return cls(batch.source, batch.sequenceNumber, len(batch.events), objects, digest, stage_types(batch), counts)

    @property
    def tables(self) -> list[str]:
        """The tables the batch lands objects for (not its markers' folder), sorted."""
        return sorted(t for t in self.objects if t != TRANSACTIONS)


@dataclass(frozen=True)
class Landed:
    status: Status
    paths: list[str]
    """Where the events are: object URIs, or the spool file for ``fallback``."""


def transaction_counts(batch: Batch) -> dict[str, dict[str, TxEvents]] | None:
    """Per table (lower-cased, as staged), which distinct events of each source transaction the
    batch's object holds (:attr:`cdclake.staging.receipts.Receipt.transactions`): their
    ``tableOrder`` runs when every one carries it, else how many; None when no event is in a
    transaction.

    Distinct as the apply sees them: it keeps one delivery of each (source, sequence) of a table
    (``spark_jobs.read.drop_exact_duplicates``), so a transaction's END counts each of its events
    once and an event listed twice in a batch must count once too, or the transaction would look
    over-full. The first copy's transaction is the one counted (the apply keeps one copy; a
    producer that sends one sequence under two transactions is wrong either way)."""
    seen: set[tuple[str, int]] = set()
    orders: dict[str, dict[str, list[int | None]]] = {}
    for ev in batch.events:
        table = ev.table.lower()
        if (table, ev.sequence) in seen:
            continue
        seen.add((table, ev.sequence))
        if ev.transaction is not None:
            orders.setdefault(table, {}).setdefault(ev.transaction.id, []).append(ev.transaction.tableOrder)
    return {t: {tx: _events(found) for tx, found in per_tx.items()} for t, per_tx in orders.items()} or None


def _events(orders: list[int | None]) -> TxEvents:
    """``[first, last]`` runs of the orders when all are known and distinct, else the count."""
    known = sorted(o for o in orders if o is not None)
    if len(known) < len(orders) or len(set(known)) < len(known):
        return len(orders)
    runs: list[list[int]] = []
    for o in known:
        if runs and o == runs[-1][1] + 1:
            runs[-1][1] = o
        else:
            runs.append([o, o])
    return runs


def content_digest(objects: dict[str, bytes]) -> str:
    h = hashlib.sha256()
    for table in sorted(objects):
        h.update(table.encode() + b"\0")
        h.update(objects[table])
        h.update(b"\0")
    return h.hexdigest()
