"""Landing a batch durably, exactly once, in the staging store (or the local fallback spool).

The protocol, per batch ``(source, sequenceNumber)``:

1. *claim*: create the batch's receipt exclusively (``put_if_absent``). The receipt names the
   staging objects the batch will be written to and a digest of their content.
2. write those objects; 3. ack.

A second landing of the same batch (client retry, restarted receiver, another replica on the same
bucket) loses the claim, reads the receipt and acks ``duplicate`` once every object it names
exists. A claim whose objects are still missing after :data:`IN_FLIGHT_S` belongs to a landing
that died: the next landing takes it over under the next receipt generation, keeping the objects
that were written and writing only the missing ones, under fresh names (a name older than the
apply job's landing grace could be skipped). So every acked batch is in staging exactly once.

Object names and claim times are the staging store's time (:mod:`cdclake.staging.clock`), never this
host's: a receiver whose clock is behind the apply's would otherwise name objects below a
watermark that already passed them.

If the store fails, the batch goes to the spool (a local folder, written durably) and is acked
``fallback``; :meth:`Lander.drain` lands spooled batches through the same protocol later.

Everything here blocks (fsync, S3 calls): the app runs it in worker threads.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import msgspec

from cdclake import staging
from cdclake.contracts.events import Batch, stage_lines
from cdclake.staging import Receipt
from cdclake.staging.clock import StoreClock

_PUTS = concurrent.futures.ThreadPoolExecutor(16, thread_name_prefix="cdclake-put")

IN_FLIGHT_S = 60.0
"""A claim younger than this may still be landing in another process: do not take it over."""
BREAKER_OPEN_S = 5.0
"""After a store failure, land to the spool without trying the store for this long."""
LOCK_STRIPES = 1024
"""Landings of one source are serialised by one of this many locks (a fixed number, however
many source ids clients send; two sources rarely share one)."""

Status = Literal["persisted", "duplicate", "fallback"]


class SequenceError(Exception):
    """The batch's sequenceNumber is not the next one for its producer."""

    def __init__(self, message: str, expected: int | None) -> None:
        super().__init__(message)
        self.expected = expected


class InFlight(Exception):
    """Another landing of the same batch is in progress (another replica): retry shortly."""


def _owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{time.time_ns()}"


def owner_dead(owner: str, me: str) -> bool:
    """True only when certain: the claim was made by another process on this host that is gone."""
    host, _, rest = owner.partition(":")
    pid_text = rest.partition(":")[0]
    if owner == me:
        return True  # landings of one source are serialised in this process: ours failed
    if host != socket.gethostname() or not pid_text.isdigit():
        return False
    if int(pid_text) == os.getpid():
        return True  # an earlier incarnation with our pid (container restart): not us
    try:
        os.kill(int(pid_text), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


class Spooled(msgspec.Struct):
    source: str
    sequenceNumber: int
    digest: str
    events: int
    objects: dict[str, str]


@dataclass(frozen=True)
class Prepared:
    """A decoded batch turned into staging payloads, ready to land."""

    source: str
    sequence_number: int
    events: int
    objects: dict[str, bytes]
    digest: str

    @classmethod
    def from_batch(cls, batch: Batch, by_identity: bool = False) -> Prepared:
        """``by_identity``: the batch number is derived from its events' identities (Debezium,
        :func:`cdclake.contracts.debezium.to_batch`), so two landings of one number are the same events
        whatever else changed: a Debezium restarted after a crash re-sends a change with a new
        processing time (``ts_ms``), and comparing content would refuse it forever."""
        objects = stage_lines(batch)
        if by_identity:
            ids = ",".join(str(e.sequence) for e in batch.events)
            digest = "ids:" + hashlib.sha256(ids.encode()).hexdigest()
        else:
            digest = _digest(objects)
        return cls(batch.source, batch.sequenceNumber, len(batch.events), objects, digest)


@dataclass(frozen=True)
class Landed:
    status: Status
    paths: list[str]
    """Where the events are: object URIs, or the spool file for ``fallback``."""


def _digest(objects: dict[str, bytes]) -> str:
    h = hashlib.sha256()
    for table in sorted(objects):
        h.update(table.encode() + b"\0")
        h.update(objects[table])
        h.update(b"\0")
    return h.hexdigest()


_spool_decoder = msgspec.json.Decoder(Spooled)


class Spool:
    """The fallback: one durable file per batch under ``root/<source>/<seq>.json``."""

    def __init__(self, root: Path) -> None:
        self.store = staging.LocalStaging(root)
        self.root = Path(root)

    @staticmethod
    def path(source: str, seq: int) -> str:
        return f"{source}/{seq:020d}.json"

    def put(self, p: Prepared) -> tuple[bool, str]:
        rec = Spooled(p.source, p.sequence_number, p.digest, p.events, {t: d.decode() for t, d in p.objects.items()})
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
                yield f, Prepared(rec.source, rec.sequenceNumber, rec.events, objects, rec.digest)

    def last_sequence(self, source: str) -> int | None:
        names = self.store.list_names(f"{source}/")
        seqs = [int(n[:20]) for n in names if n.endswith(".json") and n[:20].isdigit()]
        return max(seqs) if seqs else None

    def count(self) -> int:
        if not self.root.is_dir():
            return 0
        return sum(1 for _ in self.root.glob("*/*.json"))


class Lander:
    def __init__(
        self,
        store: staging.Store,
        spool: Spool | None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.spool = spool
        self.clock = clock
        # Object names and claim ages are in the store's time: replicas and the apply agree on
        # it whatever their own clocks say (``clock`` serves the breaker and status only).
        self.store_clock = StoreClock(store)
        self._locks = [threading.Lock() for _ in range(LOCK_STRIPES)]
        self._last: dict[str, int] = {}
        self._breaker_until = 0.0
        self.last_landing_ms: int | None = None
        self.owner = _owner()

    # ------------------------------------------------------------------ state

    def _lock(self, source: str) -> threading.Lock:
        return self._locks[hash(source) % LOCK_STRIPES]

    def forget(self, source: str) -> None:
        """Drop ``source``'s cached batch number (an idle source; re-read from its receipts)."""
        self._last.pop(source, None)

    @property
    def breaker(self) -> Literal["closed", "open"]:
        return "open" if self.clock() < self._breaker_until else "closed"

    def last_sequence(self, source: str, refresh: bool = False) -> int | None:
        """Highest batch sequence landed (or spooled) for ``source``; cached per process."""
        if refresh or source not in self._last:
            seqs = []
            try:
                names = self.store.list_names(staging.receipt_prefix(source))
                seqs = [p[0] for p in map(staging.parse_receipt_name, names) if p]
            except Exception:
                if self.spool is None:
                    raise
            if self.spool is not None:
                spooled = self.spool.last_sequence(source)
                if spooled is not None:
                    seqs.append(spooled)
            if not seqs:
                return self._last.get(source)
            self._last[source] = max(max(seqs), self._last.get(source, -1))
        return self._last.get(source)

    def cached_sequence(self, source: str) -> int | None:
        return self._last.get(source)

    def _note(self, source: str, seq: int) -> None:
        self._last[source] = max(seq, self._last.get(source, -1))
        self.last_landing_ms = int(self.clock() * 1000)

    # ------------------------------------------------------------------ landing

    def land(self, p: Prepared, check_sequence: bool = True) -> Landed:
        with self._lock(p.source):
            if check_sequence:
                dup = self._check_sequence(p)
                if dup is not None:
                    return dup
            if self.spool is not None and self.breaker == "open":
                return self._to_spool(p)
            try:
                landed = self._land_in_store(p)
            except (SequenceError, InFlight):
                raise
            except Exception:
                if self.spool is None:
                    raise
                self._breaker_until = self.clock() + BREAKER_OPEN_S
                return self._to_spool(p)
            self._note(p.source, p.sequence_number)
            return landed

    def _check_sequence(self, p: Prepared) -> Landed | None:
        last = self.last_sequence(p.source)
        if last is None or p.sequence_number == last + 1:
            return None
        if p.sequence_number > last + 1:
            # Another replica may have landed the batches in between.
            last = self.last_sequence(p.source, refresh=True)
            if last is not None and p.sequence_number > last + 1:
                raise SequenceError(
                    f"sequenceNumber {p.sequence_number} skips batches: the next batch of "
                    f"{p.source!r} must be {last + 1}",
                    last + 1,
                )
            return None
        # At or below the last landed batch: a resend, or a producer that lost its numbering.
        if self.spool is not None and (self.spool.root / Spool.path(p.source, p.sequence_number)).exists():
            return Landed("duplicate", [str(self.spool.root / Spool.path(p.source, p.sequence_number))])
        try:
            receipt = self._receipt(p.source, p.sequence_number)
        except Exception as exc:
            raise InFlight(f"cannot check batch {p.sequence_number} of {p.source!r} for a duplicate: {exc}") from exc
        if receipt is not None:
            self._same_content(p, receipt)
            if all(self._exists(self._key(k)) for k in receipt.keys):
                return Landed("duplicate", [self.store.uri(self._key(k)) for k in receipt.keys])
            return None  # claimed but not all written: landing takes it over (or waits for it)
        raise SequenceError(
            f"sequenceNumber {p.sequence_number} was never landed and is below the last landed batch "
            f"{last} of {p.source!r}: the next batch must be {last + 1}",
            last + 1,
        )

    def _receipt(self, source: str, seq: int) -> Receipt | None:
        prefix = f"{seq:020d}."
        gens = [n for n in self.store.list_names(staging.receipt_prefix(source)) if n.startswith(prefix)]
        if not gens:
            return None
        data = self.store.read(staging.receipt_prefix(source) + max(gens))
        return None if data is None else staging.decode_receipt(data)

    @staticmethod
    def _same_content(p: Prepared, receipt: Receipt) -> None:
        if receipt.digest != p.digest:
            raise SequenceError(
                f"batch {p.sequence_number} of {p.source!r} already landed with different events; "
                "a sequenceNumber must not be reused",
                None,
            )

    def check(self) -> None:
        """Raise unless the store can be reached and its clock read (readiness)."""
        self.store.check()
        self.store_clock.upper_ms()

    def _land_in_store(self, p: Prepared) -> Landed:
        now_ms = self.store_clock.upper_ms()
        keys = [staging.make_key(t, p.source, p.sequence_number, now_ms) for t in sorted(p.objects)]
        receipt = Receipt(
            p.source, p.sequence_number, 0, now_ms, p.digest, p.events, [k.path for k in keys], self.owner
        )
        for _ in range(10):
            path = staging.receipt_path(p.source, p.sequence_number, receipt.generation)
            if self.store.put_if_absent(path, staging.encode_receipt(receipt)):
                todo = [k for k in keys if receipt.generation == 0 or not self._exists(k)]
                if len(todo) == 1:
                    self.store.put(todo[0], p.objects[todo[0].table])
                else:  # independent objects: on S3 one round trip instead of one per table
                    list(_PUTS.map(lambda k: self.store.put(k, p.objects[k.table]), todo))
                return Landed("persisted", [self.store.uri(k) for k in keys])
            existing = self._receipt(p.source, p.sequence_number)
            if existing is None:  # raced with a clean-up; try again
                continue
            self._same_content(p, existing)
            have = [self._key(k) for k in existing.keys]
            missing = [k for k in have if not self._exists(k)]
            if not missing:
                return Landed("duplicate", [self.store.uri(k) for k in have])
            young = self.store_clock.lower_ms() - existing.landedMs < IN_FLIGHT_S * 1000
            if young and not owner_dead(existing.owner, self.owner):
                raise InFlight(f"batch {p.sequence_number} of {p.source!r} is being landed by another receiver")
            # Take over a dead claim: keep what it wrote, rename what it did not.
            now_ms = self.store_clock.upper_ms()
            fresh = [staging.make_key(k.table, p.source, p.sequence_number, now_ms) for k in missing]
            kept = [k for k in have if k not in missing]
            keys = kept + fresh
            receipt = Receipt(
                p.source,
                p.sequence_number,
                existing.generation + 1,
                now_ms,
                p.digest,
                p.events,
                [k.path for k in keys],
                self.owner,
            )
        raise InFlight(f"batch {p.sequence_number} of {p.source!r}: receipt keeps changing")

    def _exists(self, key: staging.ObjectKey) -> bool:
        return self.store.exists(key.path)

    @staticmethod
    def _key(path: str) -> staging.ObjectKey:
        table, name = path.split("/", 1)
        return staging.ObjectKey(table, name)

    def _to_spool(self, p: Prepared) -> Landed:
        assert self.spool is not None
        created, where = self.spool.put(p)
        self._note(p.source, p.sequence_number)
        return Landed("fallback" if created else "duplicate", [where])

    # ------------------------------------------------------------------ drain

    def drain(self) -> int:
        """Land spooled batches in the store; each spool file goes once its landing returned.

        Returns how many were drained. Stops at the first failure (the store is still down).
        """
        if self.spool is None:
            return 0
        drained = 0
        for file, p in self.spool.entries():
            with self._lock(p.source):
                try:
                    self._land_in_store(p)
                except InFlight:
                    continue
                except SequenceError:
                    # Same batch number, different events, already in the store: keep it aside
                    # for a human instead of dropping or double-landing it.
                    os.replace(file, file.with_suffix(".conflict"))
                    continue
                except Exception:
                    self._breaker_until = self.clock() + BREAKER_OPEN_S
                    return drained
                # The receipt now makes a re-drain (after a crash right here) a duplicate.
                os.unlink(file)
                drained += 1
        if drained:
            self._breaker_until = 0.0
        return drained
