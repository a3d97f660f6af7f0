"""A batch as it lands: its staging payloads and their digest (:class:`Prepared`), and where it
landed (:class:`Landed`)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Literal

from cdclake.contracts.events import Batch, stage_lines, stage_markers, stage_types
from cdclake.contracts.numbers import check_number_lengths
from cdclake.staging.names import TRANSACTIONS

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
        return cls(batch.source, batch.sequenceNumber, len(batch.events), objects, digest, stage_types(batch))

    @property
    def tables(self) -> list[str]:
        """The tables the batch lands objects for (not its markers' folder), sorted."""
        return sorted(t for t in self.objects if t != TRANSACTIONS)


@dataclass(frozen=True)
class Landed:
    status: Status
    paths: list[str]
    """Where the events are: object URIs, or the spool file for ``fallback``."""


def content_digest(objects: dict[str, bytes]) -> str:
    h = hashlib.sha256()
    for table in sorted(objects):
        h.update(table.encode() + b"\0")
        h.update(objects[table])
        h.update(b"\0")
    return h.hexdigest()
