"""A batch's claim in the staging store: its receipt, created exclusively, then its objects.

Per batch ``(source, sequenceNumber)``:

1. *claim*: create the batch's receipt exclusively (``put_if_absent``). The receipt names the
   staging objects the batch will be written to and a digest of their content.
2. write those objects (then :mod:`receiver.service` acks).

A second landing of the same batch (client retry, restarted receiver, another replica on the same
bucket) loses the claim, reads the receipt and is a ``duplicate`` once every object it names
exists. A claim whose objects are still missing after :data:`IN_FLIGHT_S` belongs to a landing
that died: the next landing takes it over under the next receipt generation, keeping the objects
that were written and writing only the missing ones, under fresh names (a name older than the
apply job's landing grace could be skipped). So every acked batch is in staging exactly once.

Object names and claim times are the staging store's time (:mod:`cdclake.staging.clock`), never this
host's: a receiver whose clock is behind the apply's would otherwise name objects below a
watermark that already passed them.
"""

from __future__ import annotations

import concurrent.futures
import os
import socket
import time

from cdclake import staging
from cdclake.staging import Receipt
from cdclake.staging.clock import StoreClock
from receiver.prepared import Landed, Prepared

_PUTS = concurrent.futures.ThreadPoolExecutor(16, thread_name_prefix="cdclake-put")

IN_FLIGHT_S = 60.0
"""A claim younger than this may still be landing in another process: do not take it over."""
ATTEMPTS = 10
"""Claims tried in a row before giving up (each lost to a clean-up or a takeover)."""


class SequenceError(Exception):
    """The batch's sequenceNumber is not the next one for its producer."""

    def __init__(self, message: str, expected: int | None) -> None:
        super().__init__(message)
        self.expected = expected


class InFlight(Exception):
    """Another landing of the same batch is in progress (another replica): retry shortly."""


def new_owner() -> str:
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


def same_content(p: Prepared, receipt: Receipt) -> None:
    if receipt.digest != p.digest:
        raise SequenceError(
            f"batch {p.sequence_number} of {p.source!r} already landed with different events; "
            "a sequenceNumber must not be reused",
            None,
        )


def object_key(path: str) -> staging.ObjectKey:
    table, name = path.split("/", 1)
    return staging.ObjectKey(table, name)


class Claims:
    """Claims made in ``store`` by ``owner`` (this process), timed by the store's clock. Blocks."""

    def __init__(self, store: staging.Store, store_clock: StoreClock, owner: str) -> None:
        self.store = store
        self.store_clock = store_clock
        self.owner = owner

    def receipt(self, source: str, seq: int) -> Receipt | None:
        """The batch's newest receipt generation, if it was ever claimed."""
        return staging.newest_receipt(self.store, source, seq)

    def complete(self, receipt: Receipt) -> Landed | None:
        """The batch as a duplicate when every object its receipt names exists, else None."""
        keys = [object_key(k) for k in receipt.keys]
        if all(self.exists(k) for k in keys):
            return Landed("duplicate", [self.store.uri(k) for k in keys])
        return None

    def exists(self, key: staging.ObjectKey) -> bool:
        return self.store.exists(key.path)

    def land(self, p: Prepared) -> Landed:
        """Claim the batch and write its objects; a batch claimed before is a duplicate, or
        taken over when its claim died (:data:`IN_FLIGHT_S`)."""
        now_ms = self.store_clock.upper_ms()
        keys = [staging.make_key(t, p.source, p.sequence_number, now_ms) for t in sorted(p.objects)]
        paths = [k.path for k in keys]
        receipt = Receipt(
            p.source, p.sequence_number, 0, now_ms, p.digest, p.events, paths, self.owner, p.types, p.transactions
        )
        for _ in range(ATTEMPTS):
            path = staging.receipt_path(p.source, p.sequence_number, receipt.generation)
            if self.store.put_if_absent(path, staging.encode_receipt(receipt)):
                return self._write(p, receipt, keys)
            existing = self.receipt(p.source, p.sequence_number)
            if existing is None:  # raced with a clean-up; try again
                continue
            same_content(p, existing)
            have = [object_key(k) for k in existing.keys]
            missing = [k for k in have if not self.exists(k)]
            if not missing:
                return Landed("duplicate", [self.store.uri(k) for k in have])
            receipt, keys = self._take_over(p, existing, have, missing)
        raise InFlight(f"batch {p.sequence_number} of {p.source!r}: receipt keeps changing")

    def _write(self, p: Prepared, receipt: Receipt, keys: list[staging.ObjectKey]) -> Landed:
        todo = [k for k in keys if receipt.generation == 0 or not self.exists(k)]
        if len(todo) == 1:
            self.store.put(todo[0], p.objects[todo[0].table])
        else:  # independent objects: on S3 one round trip instead of one per table
            list(_PUTS.map(lambda k: self.store.put(k, p.objects[k.table]), todo))
        return Landed("persisted", [self.store.uri(k) for k in keys])

    def _take_over(
        self, p: Prepared, existing: Receipt, have: list[staging.ObjectKey], missing: list[staging.ObjectKey]
    ) -> tuple[Receipt, list[staging.ObjectKey]]:
        """The next generation of a dead claim: keep what it wrote, rename what it did not."""
        young = self.store_clock.lower_ms() - existing.landedMs < IN_FLIGHT_S * 1000
        if young and not owner_dead(existing.owner, self.owner):
            raise InFlight(f"batch {p.sequence_number} of {p.source!r} is being landed by another receiver")
        now_ms = self.store_clock.upper_ms()
        fresh = [staging.make_key(k.table, p.source, p.sequence_number, now_ms) for k in missing]
        keys = [k for k in have if k not in missing] + fresh
        receipt = Receipt(
            p.source,
            p.sequence_number,
            existing.generation + 1,
            now_ms,
            p.digest,
            p.events,
            [k.path for k in keys],
            self.owner,
            p.types,
            p.transactions,
        )
        return receipt, keys
