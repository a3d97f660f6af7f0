"""What a table has consumed from staging, stored in the snapshot summary of the commit that
applied it (key :data:`SUMMARY_KEY`), so data and watermark commit atomically.

Listing order is not commit order: an object can become visible after a later-named object was
consumed. So the watermark is not a single position but ``low`` plus ``keys``:

* every object named ``<= low`` has been consumed, and
* ``keys`` are the consumed objects named ``> low``.

``low`` only advances over names older than the landing grace (objects named that long ago are
certainly visible), and only over a gap-free run of consumed names. Late objects therefore stay
pending until applied, exactly once.

Encoded (format 2), ``keys`` is one string: the sorted names, newline-joined, zlib-compressed,
base64. A table keeps every snapshot's summary until expiry (5 days by default), and ``keys`` are
every object landed in the last landing grace: as a JSON list (format 1, still read), each commit
of a busy table added its whole list again to the table's metadata file, which every statement
parses (docs/benchmarks.md, "A compressed watermark").
"""

from __future__ import annotations

import base64
import binascii
import json
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

SUMMARY_KEY = "cdclake.watermark"
FORMAT_VERSION = 2
KEYS_DECODED_AT_MOST = 64 << 20
"""Bytes the compressed ``keys`` may expand to, far more than a landing grace's names: a summary is
data a catalog writer chose, so reading it never allocates without bound."""

# A consistent publish (several tables in one catalog commit, whole source transactions only)
# stamps every snapshot it publishes with the position of each source the tables are consistent
# at, one key per source (a source name is a producer name: no dots or spaces). Readers pick a
# cut by these (`asOf` a position). The position is the source's own spelling (PostgreSQL LSN,
# MariaDB GTID set, binlog file:pos, a producer's counter), ordered by cdclake.lake.positions.
SOURCE_POSITION_PREFIX = "cdclake.source-position."


def position_properties(positions: Mapping[str, str]) -> dict[str, str]:
    """Each source's position as a snapshot-summary property."""
    return {SOURCE_POSITION_PREFIX + source: p for source, p in positions.items()}


def positions_of(summary: Mapping[str, str]) -> dict[str, str]:
    """The source positions a snapshot summary carries, by source."""
    n = len(SOURCE_POSITION_PREFIX)
    return {k[n:]: v for k, v in summary.items() if k.startswith(SOURCE_POSITION_PREFIX)}


# The apply's accounting sits beside the watermark in the same snapshot summary:
# received = applied + duplicate + superseded + late + quarantined.
EVENT_COUNTS = ("received", "applied", "duplicate", "superseded", "late", "quarantined")


def count_key(outcome: str) -> str:
    """The snapshot-summary key of one of :data:`EVENT_COUNTS`."""
    return f"cdclake.events-{outcome}"


def count_properties(counts: Mapping[str, int]) -> dict[str, str]:
    """An apply's counts as snapshot-summary properties."""
    return {count_key(k): str(v) for k, v in counts.items()}


def counts_of(summary: Mapping[str, str]) -> list[int | None]:
    """:data:`EVENT_COUNTS` read back from a snapshot summary, None where absent."""
    return [int(summary[count_key(k)]) if count_key(k) in summary else None for k in EVENT_COUNTS]


# Running totals over every apply of the table, in the same summary: Prometheus counters that
# survive snapshot expiry (the newest watermark snapshot is always kept) and need no memory in
# the process that exports them. A table applied before they existed counts from its next apply.
APPLIES_KEY = "cdclake.applies-total"


def total_key(outcome: str) -> str:
    """The snapshot-summary key of the running total of one of :data:`EVENT_COUNTS`."""
    return f"cdclake.events-total-{outcome}"


def total_properties(previous: Mapping[str, str], counts: Mapping[str, int]) -> dict[str, str]:
    """The running totals after an apply with ``counts``, from the ``previous`` watermark
    snapshot's summary (empty for a table's first apply)."""
    out = {total_key(k): str(int(previous.get(total_key(k), 0)) + v) for k, v in counts.items()}
    return out | {APPLIES_KEY: str(int(previous.get(APPLIES_KEY, 0)) + 1)}


def totals_of(summary: Mapping[str, str]) -> dict[str, int]:
    """The running totals a summary carries (:data:`EVENT_COUNTS` and ``applies``), absent ones left out."""
    out = {k: int(summary[total_key(k)]) for k in EVENT_COUNTS if total_key(k) in summary}
    return out | ({"applies": int(summary[APPLIES_KEY])} if APPLIES_KEY in summary else {})


# The apply's phases measured before its commit, in seconds (the merge itself ends with the commit,
# so only the task's CDCLAKE_RESULT line has it).
PHASE_PREFIX = "cdclake.phase-seconds-"


def phase_properties(seconds: Mapping[str, float]) -> dict[str, str]:
    return {PHASE_PREFIX + k: f"{v:.3f}" for k, v in seconds.items()}


def phases_of(summary: Mapping[str, str]) -> dict[str, float]:
    return {k[len(PHASE_PREFIX) :]: float(v) for k, v in summary.items() if k.startswith(PHASE_PREFIX)}


@dataclass(frozen=True)
class Watermark:
    low: str = ""
    keys: frozenset[str] = field(default_factory=frozenset)

    def consumed(self, name: str) -> bool:
        return name <= self.low or name in self.keys

    def advance(self, applied: Iterable[str], listed: Iterable[str], horizon: str) -> Watermark:
        """The watermark after ``applied`` commits.

        ``listed`` is every object name seen by the listing that found ``applied``; ``horizon``
        is :func:`cdclake.staging.horizon` of (listing time - landing grace).
        """
        done = set(self.keys) | set(applied)
        low = self.low
        for name in sorted(n for n in listed if n > self.low):
            if name >= horizon or name not in done:
                break
            low = name
        return Watermark(low, frozenset(n for n in done if n > low))

    def union(self, other: Watermark) -> Watermark:
        """Consumed by either: everything up to the higher ``low``, plus both key sets above it."""
        low = max(self.low, other.low)
        return Watermark(low, frozenset(n for n in self.keys | other.keys if n > low))

    def encode(self) -> str:
        if any("\n" in k for k in self.keys):
            raise ValueError(f"{SUMMARY_KEY}: a key holds a newline, the separator of the encoded keys")
        packed = zlib.compress("\n".join(sorted(self.keys)).encode(), 9)
        keys = base64.b64encode(packed).decode("ascii")
        return json.dumps({"v": FORMAT_VERSION, "low": self.low, "keys": keys}, separators=(",", ":"))

    @classmethod
    def decode(cls, text: str) -> Watermark:
        data = json.loads(text)
        version = data.get("v")
        if version == 1:
            return cls(str(data["low"]), frozenset(data["keys"]))
        if version != FORMAT_VERSION:
            raise ValueError(f"{SUMMARY_KEY}: unsupported format version {version!r}")
        return cls(str(data["low"]), _unpack(data["keys"]))


def _unpack(keys: str) -> frozenset[str]:
    try:
        inflate = zlib.decompressobj()
        text = inflate.decompress(base64.b64decode(keys, validate=True), KEYS_DECODED_AT_MOST)
    except (binascii.Error, zlib.error) as e:
        raise ValueError(f"{SUMMARY_KEY}: keys are not base64 zlib data: {e}") from None
    if inflate.unconsumed_tail:
        raise ValueError(f"{SUMMARY_KEY}: keys expand past {KEYS_DECODED_AT_MOST} bytes")
    if not inflate.eof or inflate.unused_data:
        # A cut stream decodes to some of the names: the rest would look unconsumed, applied again.
        raise ValueError(f"{SUMMARY_KEY}: keys are not one whole zlib stream")
    names = text.decode()
    return frozenset(names.split("\n")) if names else frozenset()


S = TypeVar("S")


def newest_carrying(ancestry_newest_first: Iterable[S], summary: Callable[[S], Mapping[str, str] | None]) -> S | None:
    """The newest snapshot of a table's ancestry (current snapshot first, then its parents) whose
    ``summary`` carries a watermark; None if none does.

    Compaction and expiry snapshots carry none, so the walk goes on past them. This is the one
    walk: the catalog's :func:`cdclake.lake.catalog.watermark_snapshot`, the reports and the
    expiry job (``spark_jobs/maintain.py``) all take their snapshot from here.
    """
    for snap in ancestry_newest_first:
        props = summary(snap)
        if props and SUMMARY_KEY in props:
            return snap
    return None


def from_summaries(summaries_newest_first: Iterable[Mapping[str, str] | None]) -> Watermark:
    """The watermark of the newest snapshot in a table's ancestry that carries one."""
    found = newest_carrying(summaries_newest_first, lambda s: s)
    return Watermark.decode(found[SUMMARY_KEY]) if found else Watermark()
