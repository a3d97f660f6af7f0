"""One table made by the apply job in two runs, for the read side's tests (``cdclake sql``, the
query API): snapshot s1 after the first half of the batches, s2 after all, and what the
reference model says the table holds at each."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cdclake.config.settings import Settings
from cdclake.dev.reference import expected_tables
from cdclake.dev.workload import generate
from cdclake.lake.catalog import load_table
from tests.support import apply_all, fresh_settings, stage


@dataclass
class Lake:
    settings: Settings
    table: str
    first: list[dict[str, Any]]
    second: list[dict[str, Any]]
    s1: int
    s1_ms: int
    s2: int
    s2_ms: int

    @property
    def ns(self) -> str:
        return f"{self.settings.catalog_name}.{self.settings.namespace}"

    def expected(self, upto: str = "all") -> dict[str, dict[str, Any]]:
        batches = self.first if upto == "first" else self.first + self.second
        return expected_tables(batches).get(self.table, {})


def two_run_lake(spark: Any, spark_home: Path, table: str) -> Lake:
    settings = fresh_settings(spark_home)
    w = generate(events=160, seed=5, tables=(table,), batch_size=20, keys_per_table=25)
    b = w.batches
    for ev in (e for batch in b for e in batch["events"]):
        if ev["sequence"] % 3 == 0:  # what a producer may attach: the change feed serves it back as sent
            ev["metadata"] = {"tx": ev["sequence"] // 7, "note": 'a "quoted" ✓', "path": ["a.b", {"c": None}]}
    # Split where no retried batch is parted from its original (it would count as late, not duplicate).
    cut = next(i for i in range(len(b) // 2, len(b)) if b[i]["sequenceNumber"] != b[i - 1]["sequenceNumber"])
    snaps = []
    for part in (b[:cut], b[cut:]):
        stage(settings, part)
        apply_all(spark, settings)
        t = load_table(settings, table)
        assert t is not None
        s = t.current_snapshot()
        assert s is not None
        snaps.append((s.snapshot_id, s.timestamp_ms))
    (s1, s1_ms), (s2, s2_ms) = snaps
    assert s1 != s2 and s2_ms > s1_ms + 1
    return Lake(settings, table, b[:cut], b[cut:], s1, s1_ms, s2, s2_ms)


def view(changes: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """A materialized view kept only from the change feed's changes (key -> row)."""
    rows: dict[str, dict[str, Any]] = {}
    for c in changes:
        if c["operation"] == "DELETE":
            rows.pop(c["key"], None)
        else:
            rows[c["key"]] = {"_cdc_row_id": c["key"], **c["after"]}
    return rows
