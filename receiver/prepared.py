"""A batch as it lands: its staging payloads and their digest (:class:`Prepared`), and where it
landed (:class:`Landed`)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Literal

from cdclake.contracts.events import Batch, check_number_lengths, stage_lines, stage_types

Status = Literal["persisted", "duplicate", "fallback"]


@dataclass(frozen=True)
class Prepared:
    """A decoded batch turned into staging payloads, ready to land."""

    source: str
    sequence_number: int
    events: int
    objects: dict[str, bytes]
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
        if by_identity:
            ids = ",".join(str(e.sequence) for e in batch.events)
            digest = "ids:" + hashlib.sha256(ids.encode()).hexdigest()
        else:
            digest = content_digest(objects)
        return cls(batch.source, batch.sequenceNumber, len(batch.events), objects, digest, stage_types(batch))


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
