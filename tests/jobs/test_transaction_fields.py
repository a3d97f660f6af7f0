"""Issue 31, part 1: staged lines that carry ``transaction`` (and batches that land a markers
object) apply exactly as before: the apply reads the field and ignores it for now."""

from __future__ import annotations

import json
from typing import Any

import pytest

from cdclake import staging
from cdclake.config.settings import Settings
from cdclake.dev.workload import generate
from tests.jobs.test_apply import assert_matches_reference
from tests.support import apply_all, stage, staged_event_count

pytestmark = pytest.mark.spark


@pytest.mark.parametrize("receipts", [True, False], ids=["recorded-types", "inferred-types"])
def test_staged_transactions_change_nothing_the_apply_lands(spark: Any, settings: Settings, receipts: bool) -> None:
    w = generate(events=600, seed=31)
    batches = [b | {"transaction": f"tx-{b['source']}-{b['sequenceNumber']}"} for b in w.batches]
    keys = stage(settings, batches, receipts=receipts)
    store = staging.LocalStaging(settings.staging_dir)
    # The field is really there (else this test proves nothing), and so are the markers objects.
    first = json.loads(store.get(next(k for k in keys if k.table != staging.TRANSACTIONS)).splitlines()[0])
    assert first["transaction"]["id"].startswith("tx-")
    assert len(list(store.list(staging.TRANSACTIONS))) == len(batches)
    assert staging.TRANSACTIONS not in store.tables()

    results = apply_all(spark, settings)
    assert all(r["committed"] for r in results)
    assert sum(r["received"] for r in results) == staged_event_count(settings)
    assert sum(r["quarantined"] for r in results) == 0
    assert_matches_reference(spark, settings, w.batches)
