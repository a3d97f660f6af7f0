"""The fallback spool: where a batch lands, durably, while the staging store is down; the
lander drains it into the store later (:meth:`receiver.landing.Lander.drain`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec

from cdclake import staging
from cdclake.staging.receipts import TxEvents
from receiver.prepared import Prepared


class Spooled(msgspec.Struct):
    source: str
    sequenceNumber: int
    digest: str
    events: int
    objects: dict[str, str]
    types: dict[str, Any] | None = None
    transactions: dict[str, dict[str, TxEvents]] | None = None
    """:attr:`Prepared.transactions`: without it the drained batch's receipt would count no
    events of its transactions, and they would never look whole."""


_spool_decoder = msgspec.json.Decoder(Spooled)


class Spool:
    """One durable file per batch under ``root/<source>/<seq>.json``."""

    def __init__(self, root: Path) -> None:
        self.store = staging.LocalStaging(root)
        self.root = Path(root)

    @staticmethod
    def path(source: str, seq: int) -> str:
        return f"{source}/{seq:020d}.json"

    def put(self, p: Prepared) -> tuple[bool, str]:
        objects = {t: d.decode() for t, d in p.objects.items()}
        rec = Spooled(p.source, p.sequence_number, p.digest, p.events, objects, p.types, p.transactions)
        path = self.path(p.source, p.sequence_number)
        return self.store.put_if_absent(path, msgspec.json.encode(rec)), str(self.root / path)

    def entries(self) -> Iterator[tuple[Path, Prepared]]:
        if not self.root.is_dir():
            return
        for src in sorted(self.root.iterdir()):
            if not src.is_dir():
                continue
            for f in sorted(src.glob("*.json")):
                rec = _spool_decoder.decode(f.read_bytes())
                objects = {t: d.encode() for t, d in rec.objects.items()}
                yield (
                    f,
                    Prepared(
                        rec.source, rec.sequenceNumber, rec.events, objects, rec.digest, rec.types, rec.transactions
                    ),
                )

    def last_sequence(self, source: str) -> int | None:
        names = self.store.list_names(f"{source}/")
        seqs = [int(n[:20]) for n in names if n.endswith(".json") and n[:20].isdigit()]
        return max(seqs) if seqs else None

    def count(self) -> int:
        if not self.root.is_dir():
            return 0
        return sum(1 for _ in self.root.glob("*/*.json"))
