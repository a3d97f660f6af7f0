"""The staging store's clock: the one time that names staging objects and bounds the apply's
landing horizon, so that no host's wall clock decides what counts as consumed.

Object names start with a time (:mod:`cdclake.staging`) and the apply's watermark passes over
names older than (listing time - CDCLAKE_LANDING_GRACE_S) (:mod:`cdclake.contracts.watermark`). If the
receiver named objects by its own clock and the apply listed by its own, a receiver clock behind
the apply's by more than the grace would name objects below a watermark that had already passed:
never applied, then deleted by clean-up as consumed. Both sides read the store's clock instead.

A reading writes a probe object and takes its modification time (a file's mtime, S3's
LastModified) between two readings of this host's elapsed-time clock (:data:`ELAPSED`, which no
clock step moves); from then on the store's time is that mtime plus the time elapsed, within
bounds that cover the round trip, the mtime's resolution and clock drift, and the reading is
repeated every :data:`REFRESH_S`. Each
side takes the bound that can only delay a watermark, never lose an object: the receiver names
objects with the *upper* bound (a name at or after its true landing time) and the apply lists
with the *lower* bound (a horizon at or before its true listing time). What is left is the one
assumption the grace always stood for: a landing finishes within CDCLAKE_LANDING_GRACE_S of its
naming; clean-up keeps what broke it (:mod:`cdclake.lake.cleanup`).

The wall clock is never used for either, so a host with a wrong or stepping clock stays correct;
its offset to the store is only reported (receiver ``/status``) and logged when large. Nor is a
host refused for a large offset: that would cost availability and buy no safety here.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cdclake.staging.store import Store

log = logging.getLogger("cdclake.staging.clock")

REFRESH_S = 60.0
"""Read the store's clock again after this long (bounds drift; a probe costs one small write)."""
DRIFT = 1e-4
"""Worst rate difference assumed between this host's monotonic clock and the store's (100 ppm)."""
WARN_OFFSET_S = 5.0
"""A wall clock this far from the store's is logged: harmless here, a sign of a broken NTP."""


def _since_boot() -> float:
    # Unlike CLOCK_MONOTONIC, CLOCK_BOOTTIME keeps counting while the host is suspended: after a
    # resume the reading is stale at once instead of naming objects as if no time had passed.
    return time.clock_gettime(time.CLOCK_BOOTTIME)


ELAPSED: Callable[[], float] = _since_boot if hasattr(time, "CLOCK_BOOTTIME") else time.monotonic


class StoreClockError(OSError):
    """The store's clock could not be read (the store is unreachable): nothing can be landed."""


@dataclass(frozen=True)
class Reading:
    store_ms: int
    """The probe's modification time, in the store's clock."""
    before: float
    after: float
    """The elapsed-time clock just before the probe write and after its time was read."""
    slack_ms: int
    """How far the probe's recorded time may be from the instant of its write (resolution)."""
    wall_ms: float
    """This host's wall clock at the middle of the probe, for the offset report only."""


class StoreClock:
    def __init__(
        self,
        store: Store,
        refresh_s: float = REFRESH_S,
        monotonic: Callable[[], float] = ELAPSED,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.refresh_s = refresh_s
        self._monotonic = monotonic
        self._wall = wall
        self._reading: Reading | None = None
        self._lock = threading.Lock()

    def _current(self) -> tuple[Reading, float]:
        with self._lock:
            now = self._monotonic()
            r = self._reading
            if r is None or now - r.after > self.refresh_s:
                r = self._reading = self._probe()
                now = self._monotonic()
            return r, now

    def _probe(self) -> Reading:
        before = self._monotonic()
        wall = self._wall()
        try:
            stamp = self.store.clock_probe()
        except Exception as exc:
            raise StoreClockError(f"cannot read the staging store's clock: {type(exc).__name__}: {exc}") from exc
        after = self._monotonic()
        wall += (after - before) / 2
        r = Reading(stamp, before, after, self.store.MTIME_SLACK_MS, wall * 1000)
        offset_s = (r.store_ms - r.wall_ms) / 1000
        if abs(offset_s) > WARN_OFFSET_S:
            log.warning(
                "this host's clock is %.1f s %s the staging store's; staging object names use the store's "
                "clock, so nothing is lost, but the host's time is wrong",
                abs(offset_s),
                "behind" if offset_s > 0 else "ahead of",
            )
        return r

    def upper_ms(self) -> int:
        """A time at or after the store's present time: what object names use."""
        r, now = self._current()
        return int(r.store_ms + r.slack_ms + (now - r.before) * 1000 * (1 + DRIFT)) + 1

    def lower_ms(self) -> int:
        """A time at or before the store's present time: what the apply's horizon uses."""
        r, now = self._current()
        return int(r.store_ms - r.slack_ms + (now - r.after) * 1000 * (1 - DRIFT))

    @property
    def offset_s(self) -> float | None:
        """The store's clock minus this host's wall clock at the last reading (None: none yet)."""
        r = self._reading
        return None if r is None else round((r.store_ms - r.wall_ms) / 1000, 3)
