"""The receiver's Asset events to Airflow (receiver/notify.py): at most one per
CDCLAKE_NOTIFY_DEBOUNCE_MS, and the first after a quiet spell at once, so a lone batch's
``cdc_apply`` run does not wait out the interval first."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from receiver.notify import Notifier
from tests.support.airflow import FakeAirflow
from tests.support.receiver import env_settings

INTERVAL_MS = 60_000
"""Far longer than the test: an event before it ends came before the interval (no timing race)."""


def test_the_first_landing_is_announced_at_once_and_the_rest_wait_for_the_interval(
    tmp_path: Path, airflow: FakeAirflow
) -> None:
    from cdclake.service.metrics import Metrics

    notifier = Notifier(env_settings(tmp_path, airflow_password="pw", notify_debounce_ms=INTERVAL_MS), Metrics())

    async def scenario() -> None:
        task = asyncio.create_task(notifier.run())
        try:
            notifier.landed(["orders"])
            deadline = time.monotonic() + 30  # a wait on a condition: a busy machine only delays it
            while not airflow.asset_events and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            assert [tables for _, tables in airflow.asset_events] == [["orders"]], "announced before the interval"
            for t in ("customers", "orders", "products"):
                notifier.landed([t])
                await asyncio.sleep(0.2)
            assert len(airflow.asset_events) == 1, "the landings after it wait for the interval"
            assert notifier._pending == {"customers", "orders", "products"}, "and go in one event then"
        finally:
            task.cancel()

    asyncio.run(scenario())
