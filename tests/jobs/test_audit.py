"""Audit before publish (spark_jobs.audit, cdclake.lake.holds): a failing expectation holds the
publish of every table of the run (nothing visible, the hold recorded for cdc_freshness and the
CLI), checking again holds again, and a release publishes the held run once. Rows against the
reference model (cdclake.dev.reference)."""

from __future__ import annotations

import dataclasses
import io
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import pytest

from cdclake.cli.main import main as cli
from cdclake.config.settings import Settings
from cdclake.dev.reference import diff, expected_tables
from cdclake.lake import holds
from cdclake.lake.catalog import load_table
from cdclake.lake.freshness import table_freshness
from cdclake.lake.spark import table_ident
from cdclake.staging.stores import open_store
from spark_jobs.apply import apply_together
from tests.jobs.test_consistent_apply import ev
from tests.support import stage, table_rows

pytestmark = pytest.mark.spark

CONFIG = """
[tables.orders.expectations]
key_not_null = true
key_unique = true
max_rows_added = 10
checks = { total_not_negative = "total >= 0" }
"""


def tx(n: int, order: dict[str, Any], line: dict[str, Any]) -> dict[str, Any]:
    """Batch ``n``: one source transaction writing an order and its line."""
    end = {"id": f"tx{n}", "status": "END", "eventCount": 2, "tables": {"orders": 1, "lines": 1}, "position": str(n)}
    return {
        "source": "pg",
        "sequenceNumber": n,
        "events": [ev(2 * n, "orders", f"o{n}", order, f"tx{n}"), ev(2 * n + 1, "lines", f"l{n}", line, f"tx{n}")],
        "transactions": [end],
    }


def configured(settings: Settings, tmp_path: Path) -> Settings:
    path = tmp_path / "tables.toml"
    path.write_text(CONFIG)
    return dataclasses.replace(settings, table_config=path)


def test_a_failing_expectation_holds_every_table_of_the_run_until_released_then_publishes_once(
    spark: Any, settings: Settings, tmp_path: Path
) -> None:
    s = configured(settings, tmp_path)
    good = tx(1, {"id": 1, "total": 5}, {"order": 1})
    stage(s, [good])
    apply_together(spark, s, ["orders", "lines"], 10_000)
    assert set(table_rows(spark, table_ident(s, "orders"))) == {"o1"}
    before = {t: load_table(s, t).current_snapshot().snapshot_id for t in ("orders", "lines")}  # type: ignore[union-attr]

    # A negative total and a second row with id 1: two expectations fail; lines is held with orders.
    bad = tx(2, {"id": 1, "total": -3}, {"order": 2})
    stage(s, [bad])
    results = apply_together(spark, s, ["orders", "lines"], 10_000)
    assert all(r["committed"] is False and r.get("held_by_expectation") for r in results)
    [orders] = [r for r in results if r["table"] == "orders"]
    assert orders["expectations_failed"] == [
        "checks.total_not_negative: 1 rows where total >= 0 is false",
        "key_unique: 1 keys (id) held by more than one row",
    ]
    after = {t: load_table(s, t).current_snapshot().snapshot_id for t in ("orders", "lines")}  # type: ignore[union-attr]
    assert after == before  # nothing of the run is visible, in either table
    [held] = holds.held(open_store(s)).values()
    assert held.table == "orders" and held.tables == ["lines", "orders"] and not held.released
    [fresh] = [f for f in table_freshness(s) if f.table == "orders"]
    assert "key_unique" in fresh.describe_held() and "cdclake holds release orders" in fresh.describe_held()

    # Checked again: held again (the next DAG run does not slip it through).
    again = apply_together(spark, s, ["orders"], 10_000)
    assert not any(r["committed"] for r in again)
    out = io.StringIO()
    with redirect_stdout(out):
        assert cli(["holds", "--format", "json"], settings=s) == 0
    assert "total_not_negative" in out.getvalue()

    # Released: the next run publishes the held data once, and the hold is gone.
    assert cli(["holds", "release", "orders"], settings=s) == 0
    released = apply_together(spark, s, ["orders"], 10_000)
    assert all(r["committed"] for r in released) and released[0]["released"] == ["orders"]
    assert holds.held(open_store(s)) == {}
    want = expected_tables([good, bad])
    for t in ("orders", "lines"):
        assert not diff(want[t], table_rows(spark, table_ident(s, t)))
    assert not any(r["committed"] for r in apply_together(spark, s, ["orders"], 10_000))
    assert cli(["holds", "release", "orders"], settings=s) == 1  # not held: nothing to release


def test_a_row_count_bound_is_checked_on_the_snapshots_summaries(
    spark: Any, settings: Settings, tmp_path: Path
) -> None:
    s = configured(settings, tmp_path)
    batches = [tx(n, {"id": n, "total": n}, {"order": n}) for n in range(1, 13)]  # 12 new orders > 10
    stage(s, batches)
    [orders] = [r for r in apply_together(spark, s, ["orders"], 10_000) if r["table"] == "orders"]
    assert orders["expectations_failed"] == ["max_rows_added: 12 rows added, at most 10 expected"]
    assert not spark.catalog.tableExists(table_ident(s, "orders")) or load_table(s, "orders").current_snapshot() is None  # type: ignore[union-attr]
