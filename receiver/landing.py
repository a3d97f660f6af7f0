"""Landing a batch durably, exactly once, in the staging store (or the local fallback spool).

:class:`Lander` serialises the landings of one source, checks that a batch's sequenceNumber is the
next one, and lands it through its claim in the store (:mod:`receiver.claim`: receipt first, then
objects; :mod:`receiver.service` then acks). If the store fails, the batch goes to the spool (:mod:`receiver.spool`)
and is acked ``fallback``; :meth:`Lander.drain` lands spooled batches through the same claim later.

Everything here blocks (fsync, S3 calls): the app runs it in worker threads.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Literal

from cdclake import staging
from cdclake.staging.clock import StoreClock
from receiver.claim import Claims, InFlight, SequenceError, new_owner, same_content
from receiver.prepared import Landed, Prepared
from receiver.spool import Spool

BREAKER_OPEN_S = 5.0
"""After a store failure, land to the spool without trying the store for this long."""
LOCK_STRIPES = 1024
"""Landings of one source are serialised by one of this many locks (a fixed number, however
many source ids clients send; two sources rarely share one)."""


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
        self.owner = new_owner()
        self.claims = Claims(store, self.store_clock, self.owner)
        self._locks = [threading.Lock() for _ in range(LOCK_STRIPES)]
        self._last: dict[str, int] = {}
        self._breaker_until = 0.0
        self.last_landing_ms: int | None = None

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

    def check(self) -> None:
        """Raise unless the store can be reached and its clock read (readiness)."""
        self.store.check()
        self.store_clock.upper_ms()

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
                landed = self.claims.land(p)
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
        """A duplicate of a landed batch, None for the next batch, or :class:`SequenceError`."""
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
        return self._resent(p, last)

    def _resent(self, p: Prepared, last: int) -> Landed | None:
        if self.spool is not None and (self.spool.root / Spool.path(p.source, p.sequence_number)).exists():
            return Landed("duplicate", [str(self.spool.root / Spool.path(p.source, p.sequence_number))])
        try:
            receipt = self.claims.receipt(p.source, p.sequence_number)
        except Exception as exc:
            raise InFlight(f"cannot check batch {p.sequence_number} of {p.source!r} for a duplicate: {exc}") from exc
        if receipt is not None:
            same_content(p, receipt)
            # Claimed but not all written: landing takes it over (or waits for it).
            return self.claims.complete(receipt)
        raise SequenceError(
            f"sequenceNumber {p.sequence_number} was never landed and is below the last landed batch "
            f"{last} of {p.source!r}: the next batch must be {last + 1}",
            last + 1,
        )

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
                    self.claims.land(p)
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
