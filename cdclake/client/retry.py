"""The SDK's own retry loop and failover: it follows the receiver's hints (a nack's
``retryDelayMs``, ``Retry-After``) and moves to the next replica, round robin, when one failed.

The receiver and proxies in front of it tell a producer when and where to come back, which a
generic retry library would not read; so the loop is here, and nowhere else in the SDK.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from typing import TypeVar

from cdclake.client.batch import Batch
from cdclake.client.errors import ProducerError, Retry

# The SDK logs under one name, as it did when it was one module.
log = logging.getLogger("cdclake.client")
T = TypeVar("T")


class Retrier:
    """Runs a transport operation until it succeeds or ``max_attempts`` are spent; ``use`` points
    the transport at another replica."""

    def __init__(
        self,
        source: str,
        urls: tuple[str, ...],
        use: Callable[[str], None],
        *,
        max_attempts: int,
        base_delay_s: float,
        max_delay_s: float,
        sleep: Callable[[float], None],
        rng: random.Random,
    ) -> None:
        self.source, self.urls, self._use = source, urls, use
        self.index = 0
        self.failovers = 0
        self._max_attempts, self._base_delay, self._max_delay = max_attempts, base_delay_s, max_delay_s
        self._sleep, self._rng = sleep, rng

    @property
    def url(self) -> str:
        return self.urls[self.index]

    def fail_over(self, exc: Retry) -> bool:
        """Move to the next replica (round robin); False when there is no other."""
        if len(self.urls) < 2:
            return False
        left = self.url
        self.index = (self.index + 1) % len(self.urls)
        self.failovers += 1
        self._use(self.url)
        log.warning("%s: receiver %s failed (%s); failing over to %s", self.source, left, exc, self.url)
        return True

    def run(self, op: Callable[[], T], batch: Batch | None = None) -> T:
        for attempt in range(1, self._max_attempts + 1):
            try:
                return op()
            except Retry as exc:
                if batch is not None:
                    batch.retry_count += 1
                # Also after the last attempt: the next flush then starts on a replica that may be up.
                switched = exc.switch and self.fail_over(exc)
                if attempt == self._max_attempts:
                    raise ProducerError(
                        exc.reason, f"gave up after {attempt} attempts: {exc.message}", retryable=True
                    ) from None
                cap = min(self._max_delay, self._base_delay * 2 ** (attempt - 1))
                # Full jitter spreads producers that failed together; a server hint wins over it,
                # unless it came from the replica just left.
                hint = None if switched else exc.delay_s
                delay = hint if hint is not None else self._rng.uniform(0, cap)
                log.info("%s: %s; attempt %d, retrying in %.3fs", self.source, exc, attempt, delay)
                self._sleep(delay)
        raise AssertionError("unreachable")
