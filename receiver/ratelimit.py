"""Token bucket per producer, as the seed's RateLimitConfig (burstCapacity, refillRate)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass


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


class RateLimiter:
    def __init__(self, capacity: int, refill_per_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.capacity = capacity
        self.refill = refill_per_s
        self.clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}

    def take(self, key: str) -> Decision:
        if self.refill <= 0:
            return Decision(True, self.capacity, self.capacity, 0.0, 0.0)
        now = self.clock()
        tokens, at = self._buckets.get(key, (float(self.capacity), now))
        tokens = min(float(self.capacity), tokens + (now - at) * self.refill)
        allowed = tokens >= 1.0
        if allowed:
            tokens -= 1.0
        self._buckets[key] = (tokens, now)
        reset = (self.capacity - tokens) / self.refill
        retry = 0.0 if allowed else (1.0 - tokens) / self.refill
        return Decision(allowed, self.capacity, int(tokens), reset, retry)
