"""How many tables a batch and a producer may touch: CDCLAKE_MAX_TABLES_PER_BATCH,
CDCLAKE_MAX_NEW_TABLES_PER_SOURCE (per hour) and CDCLAKE_MAX_TABLES (lake-wide).

Every table a batch names is one staging object and, in the apply, one more job and three side
tables: a producer naming thousands of new tables filled the backlog and the apply plan for
everyone (issue 13, finding 3). A table is new when it does not count yet (:mod:`receiver.slots`:
an Iceberg table, staging objects, or a landing in flight); a batch's new tables are held while it
lands and given back if it does not (issue 28).

The lake-wide cap is capacity, not the batch's fault: ``503 buffer_full``, retried, like the
backlog's limit (the batch is valid; it lands once a slot frees or an operator raises the cap).
"""

from __future__ import annotations

from cdclake.config.settings import Settings
from cdclake.contracts.events import Batch
from receiver.backlog import Backlog
from receiver.ratelimit import RateLimiter
from receiver.rejected import Rejected

HOUR_S = 3600.0


def batch_tables(batch: Batch, limit: int) -> dict[str, int]:
    """The batch's distinct tables (lower-cased, as staged), each with the index of the first
    event naming it; a 400 naming the first table past ``limit``."""
    first: dict[str, int] = {}
    for i, ev in enumerate(batch.events):
        table = ev.table.lower()
        if table in first:
            continue
        if len(first) >= limit:
            raise Rejected(
                400,
                "invalid_format",
                f"a batch may name at most {limit} distinct tables (CDCLAKE_MAX_TABLES_PER_BATCH); "
                f"{table!r} is one more: split the batch",
                f"$.events[{i}].table",
            )
        first[table] = i
    return first


class NewTables:
    """The new-table budgets: per producer and hour, and for the whole lake."""

    def __init__(self, settings: Settings, backlog: Backlog) -> None:
        self.settings = settings
        self.backlog = backlog
        per_hour = settings.max_new_tables_per_source
        self.limiter = RateLimiter(max(1, per_hour), per_hour / HOUR_S)

    def claim(self, source: str, tables: dict[str, int]) -> tuple[list[str], Rejected | None]:
        """The batch's new tables, charged to ``source``; or why it may not create them."""
        known = self.backlog.slots.known
        if known is None:  # never listed (the store is down): a budget is no reason to refuse
            return [], None
        new = [t for t in tables if t not in known]
        if not new:
            return [], None
        cap = self.settings.max_tables
        if cap and len(known) + len(new) > cap:
            past = new[max(0, cap - len(known))]
            why = (
                f"the lake has {len(known)} tables (Iceberg tables, tables staged and not yet applied, "
                f"and landings in flight); {past!r} would pass the limit {cap} (CDCLAKE_MAX_TABLES)"
            )
            return [], Rejected(503, "buffer_full", why, f"$.events[{tables[past]}].table", {"retryDelayMs": 30_000})
        per_hour = self.settings.max_new_tables_per_source
        if per_hour and len(new) > per_hour:
            past = new[per_hour]
            why = (
                f"this batch creates {len(new)} new tables; a producer may create {per_hour} per hour "
                f"(CDCLAKE_MAX_NEW_TABLES_PER_SOURCE): {past!r} is one more, send fewer new tables per batch"
            )
            return [], Rejected(400, "invalid_format", why, f"$.events[{tables[past]}].table")
        if per_hour:
            d = self.limiter.take(source, len(new))
            if not d.allowed:
                why = (
                    f"producer {source!r} may create {per_hour} new tables per hour "
                    f"(CDCLAKE_MAX_NEW_TABLES_PER_SOURCE); this batch creates {len(new)}, {d.remaining} are left"
                )
                delay = {"retryDelayMs": int(d.retry_after_s * 1000) + 1}
                return [], Rejected(429, "rate_limited", why, f"$.events[{tables[new[0]]}].table", delay)
        self.backlog.slots.hold(new)
        return new, None

    def landed(self, new: list[str]) -> None:
        """The landing that claimed ``new`` succeeded: the tables exist."""
        self.backlog.slots.release(new, landed=True)

    def give_back(self, source: str, new: list[str], existed: bool = False) -> None:
        """The landing did not create the tables (failed, refused; ``existed``: a duplicate's
        batch, whose tables landed before): the hourly budget and the slots come back."""
        if new and self.settings.max_new_tables_per_source:
            self.limiter.give_back(source, len(new))
        self.backlog.slots.release(new, landed=existed)

    def forget(self, source: str) -> None:
        self.limiter.forget(source)
