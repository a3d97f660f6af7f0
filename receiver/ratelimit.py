"""Token bucket per producer, as the protocol's RateLimitConfig (burstCapacity, refillRate).

Buckets are dropped with :meth:`RateLimiter.forget` when their producer goes idle
(:mod:`receiver.sources`): an idle bucket is full, so forgetting it changes nothing.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from cdclake.contracts.protocol import RateLimit


@dataclass(frozen=True)
class Decision:
    allowed: bool
    limit: int
    remaining: int
    reset_s: float
    """Seconds until the bucket is full again."""
    retry_after_s: float
    """Seconds until one token is available (0 when allowed)."""

    def headers(self) -> dict[str, str]:
        h = {
            "X-RateLimit-Limit": str(self.limit),
            "X-RateLimit-Remaining": str(self.remaining),
            "X-RateLimit-Reset": str(int(time.time() + math.ceil(self.reset_s))),
        }
        if not self.allowed:
            h["Retry-After"] = str(max(1, math.ceil(self.retry_after_s)))
        return h

    def block(self) -> RateLimit:
        """The protocol's ``rateLimit`` block of an ack. ``resetAt`` is Unix milliseconds, like every
        other time in the protocol's messages (the ``X-RateLimit-Reset`` header is Unix seconds)."""
        reset_at = int(time.time() * 1000 + math.ceil(self.reset_s * 1000))
        return RateLimit(self.limit, self.remaining, reset_at)


class RateLimiter:
    def __init__(self, capacity: int, refill_per_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.capacity = capacity
        self.refill = refill_per_s
        self.clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}

    @property
    def refill_s(self) -> float:
        """Seconds an empty bucket takes to fill: idle this long, a producer's bucket is full."""
        return self.capacity / self.refill if self.refill > 0 else 0.0

    def take(self, key: str, cost: int = 1) -> Decision:
        """Take ``cost`` tokens if the bucket holds them (``cost`` <= capacity), else none."""
        if self.refill <= 0:
            return Decision(True, self.capacity, self.capacity, 0.0, 0.0)
        now = self.clock()
        tokens, at = self._buckets.get(key, (float(self.capacity), now))
        tokens = min(float(self.capacity), tokens + (now - at) * self.refill)
        allowed = tokens >= cost
        if allowed:
            tokens -= cost
        self._buckets[key] = (tokens, now)
        reset = (self.capacity - tokens) / self.refill
        retry = 0.0 if allowed else (cost - tokens) / self.refill
        return Decision(allowed, self.capacity, int(tokens), reset, retry)

    def give_back(self, key: str, cost: int) -> None:
        """Return tokens taken for work that did not happen (a landing that failed)."""
        if key in self._buckets:
            tokens, at = self._buckets[key]
            self._buckets[key] = (min(float(self.capacity), tokens + cost), at)

    def forget(self, key: str) -> None:
        self._buckets.pop(key, None)
