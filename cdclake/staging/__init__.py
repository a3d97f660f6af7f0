"""The staging layout: the ONLY place that knows how staging objects are named and ordered.

An object holds the events of one (batch, table) as NDJSON of :class:`cdclake.contracts.events.StagedEvent`.
Its key, relative to the staging root, is::

    <table>/<YYYY-MM-DD>/<HH>/<landed_ms:013d>-<batch_sequence:020d>-<source>.ndjson

so the lexicographic order of keys within a table is the order in which the receiver named them
(UTC time first). That order is NOT a commit order: a slow writer can make an object visible after
a later-named one was consumed. :mod:`cdclake.contracts.watermark` deals with that; nothing else should
assume listings are complete up to "now". ``landed_ms`` is the staging store's time, never a
host's (:mod:`cdclake.staging.clock`): the apply compares it with its listing time in that clock.
"""

from __future__ import annotations

import builtins
import concurrent.futures
import contextlib
import os
import re
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import msgspec

SUFFIX = ".ndjson"
# The Airflow Asset the receiver updates after landings; cdc_apply is scheduled on it.
ASSET_URI = "cdclake://staging"
ASSET_NAME = "cdclake_staging"
_NAME = re.compile(
    r"^(?P<day>\d{4}-\d{2}-\d{2})/(?P<hour>\d{2})/(?P<ms>\d{13})-(?P<seq>\d{20})-(?P<source>[A-Za-z0-9][A-Za-z0-9._-]*)"
    + re.escape(SUFFIX)
    + "$"
)


@dataclass(frozen=True, order=True)
class ObjectKey:
    """Identity of one staging object. Ordering follows :attr:`name`."""

    table: str
    name: str

    @property
    def path(self) -> str:
        return f"{self.table}/{self.name}"

    @property
    def landed_ms(self) -> int:
        return parse_name(self.name)[0]

    @property
    def batch_sequence(self) -> int:
        return parse_name(self.name)[1]

    @property
    def source(self) -> str:
        return parse_name(self.name)[2]


def _prefix(ms: int) -> str:
    t = datetime.fromtimestamp(ms / 1000, UTC)
    return f"{t:%Y-%m-%d}/{t:%H}/{ms:013d}"


def object_name(landed_ms: int, batch_sequence: int, source: str) -> str:
    return f"{_prefix(landed_ms)}-{batch_sequence:020d}-{source}{SUFFIX}"


def make_key(table: str, source: str, batch_sequence: int, landed_ms: int | None = None) -> ObjectKey:
    ms = int(time.time() * 1000) if landed_ms is None else landed_ms
    return ObjectKey(table, object_name(ms, batch_sequence, source))


def parse_name(name: str) -> tuple[int, int, str]:
    """``(landed_ms, batch_sequence, source)`` of an object name; ValueError if it is not one."""
    m = _NAME.match(name)
    if not m:
        raise ValueError(f"not a staging object name: {name!r}")
    return int(m["ms"]), int(m["seq"]), m["source"]


def horizon(ms: int) -> str:
    """Every object named before this string (same table) was named before ``ms``."""
    return _prefix(ms)


# --------------------------------------------------------------------------- receipts
# A receipt records that batch (source, sequenceNumber) landed and under which object keys. It is
# created with an exclusive create BEFORE the data objects are written (a claim), so a second
# landing of the same batch, by a retry, a restarted receiver or another replica sharing the
# store, finds it and acks ``duplicate`` instead of landing the events again. A claim whose owner
# died before writing all objects is taken over under the next generation number.
# The folder starts with a dot, so it is never mistaken for a table (table names cannot).
RECEIPTS = ".receipts"
CLOCK_FOLDER = ".clock"
"""Probe objects of :mod:`cdclake.staging.clock`, each removed right after its time is read."""
_RECEIPT = re.compile(r"^(?P<seq>\d{20})\.(?P<gen>\d{3})\.json$")


def receipt_prefix(source: str) -> str:
    return f"{RECEIPTS}/{source}/"


def receipt_path(source: str, batch_sequence: int, generation: int = 0) -> str:
    return f"{receipt_prefix(source)}{batch_sequence:020d}.{generation:03d}.json"


def parse_receipt_name(name: str) -> tuple[int, int] | None:
    """``(batch_sequence, generation)`` of a receipt's file name (no folder), or None."""
    m = _RECEIPT.match(name)
    return (int(m["seq"]), int(m["gen"])) if m else None


class Receipt(msgspec.Struct):
    """A receipt's content (JSON): written by the receiver's landing (:mod:`receiver.claim`),
    read back there, by the apply (:func:`recorded_types`) and by the clean-up
    (:mod:`cdclake.lake.cleanup`)."""

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


def recorded_types(store: Store, keys: builtins.list[ObjectKey]) -> builtins.list[Any] | None:
    """The JSON types each object's receipt records for it (:attr:`Receipt.types`), in the
    order of ``keys``; None when some object has none (the apply then infers them). One read
    per object, in parallel (an S3 GET each), of the first generation that names the object:
    the landing that wrote it (a take-over keeps the objects written before it and renames the
    others; its own types may describe a resend whose content differs, e.g. Debezium's)."""

    def one(key: ObjectKey) -> Any:
        found = store.read(receipt_path(key.source, key.batch_sequence))
        receipt = None if found is None else decode_receipt(found)
        if receipt is None or key.path not in receipt.keys:
            receipt = _first_naming(store, key)
        if receipt is None or not receipt.types:
            return None
        return receipt.types.get(key.table)

    with concurrent.futures.ThreadPoolExecutor(min(16, max(1, len(keys)))) as pool:
        found = builtins.list(pool.map(one, keys))
    return None if any(t is None for t in found) else found


def _first_naming(store: Store, key: ObjectKey) -> Receipt | None:
    prefix = f"{key.batch_sequence:020d}."
    for name in sorted(n for n in store.list_names(receipt_prefix(key.source)) if n.startswith(prefix)):
        data = store.read(receipt_prefix(key.source) + name)
        receipt = None if data is None else decode_receipt(data)
        if receipt is not None and key.path in receipt.keys:
            return receipt
    return None


class Store(Protocol):
    """Where staging objects and receipts live: :class:`LocalStaging` or ``cdclake.staging.s3``
    (the configured one: :func:`cdclake.staging.stores.open_store`).

    Paths are relative to the store's root and use ``/``. ``put`` and ``put_if_absent`` return
    only once the data is durable.
    """

    def uri(self, key: ObjectKey) -> str: ...
    def put(self, key: ObjectKey, data: bytes) -> None: ...
    def get(self, key: ObjectKey) -> bytes: ...
    def tables(self) -> builtins.list[str]: ...
    def list(self, table: str, after: str = "") -> Iterator[ObjectKey]: ...
    def put_if_absent(self, path: str, data: bytes) -> bool:
        """Create ``path`` durably unless it exists; False (and nothing written) if it does."""
        ...

    def read(self, path: str) -> bytes | None:
        """Content of ``path``, or None if it does not exist."""
        ...

    def exists(self, path: str) -> bool: ...
    def delete(self, path: str) -> None:
        """Remove ``path`` if it exists (staging clean-up)."""
        ...

    def list_names(self, prefix: str) -> builtins.list[str]:
        """Names (not paths) of the objects directly under folder ``prefix`` (ends with ``/``), sorted."""
        ...

    def folders(self, prefix: str) -> builtins.list[str]:
        """Names of the folders directly under folder ``prefix`` (ends with ``/``), sorted."""
        ...

    def remove_folder(self, prefix: str) -> None:
        """Remove folder ``prefix`` (ends with ``/``) if it is empty (clean-up of a forgotten
        producer's receipts)."""
        ...

    def check(self) -> None:
        """Raise if the store cannot be reached (readiness)."""
        ...

    MTIME_SLACK_MS: int
    """How far a modification time may be from the instant of the write (resolution, coarse clocks)."""

    def modified_ms(self, path: str) -> int | None:
        """When ``path`` was written, in the store's clock; None if it does not exist."""
        ...

    def clock_probe(self) -> int:
        """Write a probe object under :data:`CLOCK_FOLDER` and return its modification time in
        the store's clock (ms); the probe is removed. See :mod:`cdclake.staging.clock`."""
        ...


class LocalStaging:
    """Staging objects in a local folder. Writes are durable before :meth:`put` returns."""

    # The kernel stamps mtimes from a coarse clock (one tick, 1-10 ms, behind the real one).
    MTIME_SLACK_MS = 50

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def uri(self, key: ObjectKey) -> str:
        return (self.root / key.path).as_uri()

    def put(self, key: ObjectKey, data: bytes) -> None:
        """Write atomically and durably: temp file, fsync, rename, fsync the directory."""
        final = self.root / key.path
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.parent / f".tmp-{uuid.uuid4().hex}"
        _write_durably(tmp, data)
        os.rename(tmp, final)
        _fsync_dir(final.parent)
        # The hour and day folders may be new too; their entries must survive a crash as well.
        _fsync_dir(final.parent.parent)
        _fsync_dir(final.parent.parent.parent)

    def get(self, key: ObjectKey) -> bytes:
        return (self.root / key.path).read_bytes()

    def put_if_absent(self, path: str, data: bytes) -> bool:
        final = self.root / path
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.parent / f".tmp-{uuid.uuid4().hex}"
        _write_durably(tmp, data)
        try:
            # link() fails if the target exists: an atomic, exclusive create of complete content.
            os.link(tmp, final)
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp)
        _fsync_dir(final.parent)
        _fsync_dir(final.parent.parent)
        return True

    def read(self, path: str) -> bytes | None:
        try:
            return (self.root / path).read_bytes()
        except FileNotFoundError:
            return None

    def exists(self, path: str) -> bool:
        return (self.root / path).is_file()

    def delete(self, path: str) -> None:
        (self.root / path).unlink(missing_ok=True)

    def remove_folder(self, prefix: str) -> None:
        # Only an empty one. A landing racing this between its mkdir and its write fails
        # retryably, before any ack.
        with contextlib.suppress(OSError):
            (self.root / prefix).rmdir()

    def list_names(self, prefix: str) -> list[str]:
        try:
            return sorted(n for n in os.listdir(self.root / prefix) if not n.startswith(".tmp-"))
        except FileNotFoundError:
            return []

    def folders(self, prefix: str) -> list[str]:
        base = self.root / prefix
        if not base.is_dir():
            return []
        return sorted(p.name for p in base.iterdir() if p.is_dir())

    def modified_ms(self, path: str) -> int | None:
        try:
            return os.stat(self.root / path).st_mtime_ns // 1_000_000
        except FileNotFoundError:
            return None

    def clock_probe(self) -> int:
        folder = self.root / CLOCK_FOLDER
        folder.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=folder)
        try:
            os.write(fd, b"0")  # stamps the mtime now (no fsync: the probe's time is all it is for)
            return os.fstat(fd).st_mtime_ns // 1_000_000
        finally:
            os.close(fd)
            os.unlink(name)

    def check(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        if not os.access(self.root, os.W_OK):
            raise OSError(f"staging folder {self.root} is not writable")

    def tables(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if p.is_dir() and not p.name.startswith("."))

    def list(self, table: str, after: str = "") -> Iterator[ObjectKey]:
        """Objects of ``table`` whose name sorts after ``after``, in key order."""
        base = self.root / table
        if not base.is_dir():
            return
        after_day, after_hour = after[:10], after[11:13]
        for day in sorted(d.name for d in base.iterdir() if d.is_dir()):
            if day < after_day:
                continue
            for hour in sorted(h.name for h in (base / day).iterdir() if h.is_dir()):
                if (day, hour) < (after_day, after_hour):
                    continue
                for f in sorted(os.listdir(base / day / hour)):
                    if f.endswith(SUFFIX) and not f.startswith("."):
                        name = f"{day}/{hour}/{f}"
                        if name > after and _NAME.match(name):
                            yield ObjectKey(table, name)


def _write_durably(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
