"""Receipts: the record that a batch (source, sequence number) landed and under which object
keys, claimed before its objects are written. Read by the receiver's landing, the apply
(:func:`recorded_types`) and the clean-up."""

from __future__ import annotations

import builtins
import concurrent.futures
import re
from typing import Any

import msgspec

from cdclake.staging.names import ObjectKey
from cdclake.staging.store import Store

# --------------------------------------------------------------------------- receipts
# A receipt records that batch (source, sequenceNumber) landed and under which object keys. It is
# created with an exclusive create BEFORE the data objects are written (a claim), so a second
# landing of the same batch, by a retry, a restarted receiver or another replica sharing the
# store, finds it and acks ``duplicate`` instead of landing the events again. A claim whose owner
# died before writing all objects is taken over under the next generation number.
# The folder starts with a dot, so it is never mistaken for a table (table names cannot).
RECEIPTS = ".receipts"
_RECEIPT = re.compile(r"^(?P<seq>\d{20})\.(?P<gen>\d{3})\.json$")


def receipt_prefix(source: str) -> str:
    return f"{RECEIPTS}/{source}/"


def receipt_path(source: str, batch_sequence: int, generation: int = 0) -> str:
    return f"{receipt_prefix(source)}{batch_sequence:020d}.{generation:03d}.json"


def parse_receipt_name(name: str) -> tuple[int, int] | None:
    """``(batch_sequence, generation)`` of a receipt's file name (no folder), or None."""
    m = _RECEIPT.match(name)
    return (int(m["seq"]), int(m["gen"])) if m else None


TxEvents = int | list[list[int]]
"""A table object's events of one transaction: how many, or their ``tableOrder`` runs."""


class Receipt(msgspec.Struct, omit_defaults=True):
    """A receipt's content (JSON): written by the receiver's landing (:mod:`receiver.claim`),
    read back there, by the apply (:func:`recorded_types`), by the clean-up
    (:mod:`cdclake.lake.cleanup`) and by :mod:`cdclake.lake.wholeness`. Fields at their default
    are left out (an older reader fills them in from its own defaults)."""

    source: str
    sequenceNumber: int
    generation: int
    landedMs: int
    """When the batch was claimed, in the staging store's time."""
    digest: str
    events: int
    keys: list[str]
    """The staging objects the batch is (being) written to."""
    owner: str = ""
    """``host:pid:boot`` of the receiver that claimed it: a claim of a dead process on this host
    can be taken over at once instead of after the in-flight timeout."""
    types: dict[str, Any] | None = None
    """Per table, the JSON types of the batch's object for it
    (:func:`cdclake.contracts.jsontypes.record`): the apply reads objects with them instead of
    inferring. None (an older receiver): the apply infers."""
    transactions: dict[str, dict[str, TxEvents]] | None = None
    """Per table object, which distinct events (as the apply counts them: an exact duplicate
    once) it holds of each source transaction, ``{table: {transaction id: events}}``: a count, or,
    when every one of them carries its ``tableOrder``, those orders as ``[first, last]`` runs
    (so the same event landed again in another batch, as a restarted Debezium re-sends it, is
    counted once across objects). None when the batch has no event in a transaction (or an older
    receiver landed it). What :mod:`cdclake.lake.wholeness` judges a transaction's completeness
    by, without reading objects."""


_receipt_decoder = msgspec.json.Decoder(Receipt)


def encode_receipt(receipt: Receipt) -> bytes:
    return msgspec.json.encode(receipt)


def decode_receipt(data: bytes) -> Receipt:
    return _receipt_decoder.decode(data)


def newest_receipt(store: Store, source: str, batch_sequence: int) -> Receipt | None:
    """The batch's newest receipt generation, if it was ever claimed."""
    prefix = f"{batch_sequence:020d}."
    gens = [n for n in store.list_names(receipt_prefix(source)) if n.startswith(prefix)]
    data = store.read(receipt_prefix(source) + max(gens)) if gens else None
    return None if data is None else decode_receipt(data)


def recorded_types(
    store: Store, keys: builtins.list[ObjectKey], receipts: builtins.list[Receipt | None] | None = None
) -> builtins.list[Any] | None:
    """The JSON types each object's receipt records for it (:attr:`Receipt.types`), in the
    order of ``keys``; None when some object has none (the apply then infers them). ``receipts``:
    :func:`naming_receipts` of ``keys``, when the caller has read them already."""
    found = naming_receipts(store, keys) if receipts is None else receipts
    types = [r.types.get(k.table) if r is not None and r.types else None for r, k in zip(found, keys, strict=True)]
    return None if any(t is None for t in types) else types


def naming_receipts(store: Store, keys: builtins.list[ObjectKey]) -> builtins.list[Receipt | None]:
    """Each object's receipt, in the order of ``keys`` (None: none names it). One read per
    object, in parallel (an S3 GET each), of the first generation that names the object: the
    landing that wrote it (a take-over keeps the objects written before it and renames the
    others; its own types may describe a resend whose content differs, e.g. Debezium's)."""

    def one(key: ObjectKey) -> Receipt | None:
        found = store.read(receipt_path(key.source, key.batch_sequence))
        receipt = None if found is None else decode_receipt(found)
        if receipt is None or key.path not in receipt.keys:
            receipt = _first_naming(store, key)
        return receipt

    with concurrent.futures.ThreadPoolExecutor(min(16, max(1, len(keys)))) as pool:
        return builtins.list(pool.map(one, keys))


def _first_naming(store: Store, key: ObjectKey) -> Receipt | None:
    prefix = f"{key.batch_sequence:020d}."
    for name in sorted(n for n in store.list_names(receipt_prefix(key.source)) if n.startswith(prefix)):
        data = store.read(receipt_prefix(key.source) + name)
        receipt = None if data is None else decode_receipt(data)
        if receipt is not None and key.path in receipt.keys:
            return receipt
    return None
