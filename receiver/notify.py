"""Tell Airflow that data landed: an Asset event through its REST API, so ``cdc_apply`` (which is
scheduled on :data:`STAGING_ASSET_URI`) runs on arrival instead of waiting for its fallback
schedule.

Debounced (one event per ``CDCLAKE_NOTIFY_DEBOUNCE_MS`` at most) and off the ack path: a slow or
absent Airflow never delays or fails an ack; the apply DAG's periodic schedule is the safety net.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import anyio.to_thread

from cdclake import staging
from cdclake.settings import Settings
from receiver.metrics import Metrics

log = logging.getLogger("cdclake.receiver")

STAGING_ASSET_URI = staging.ASSET_URI
APPLY_DAG = "cdc_apply"
RETRY_S = 5.0


class Notifier:
    def __init__(self, settings: Settings, metrics: Metrics) -> None:
        self.settings = settings
        self.metrics = metrics
        self.enabled = bool(settings.airflow_password) and settings.notify_debounce_ms > 0
        self._pending: set[str] = set()
        self._wake = asyncio.Event()
        self._client: Any = None
        self._asset_id: int | None = None
        self.last_error: str | None = None
        self.sent = 0

    def landed(self, tables: list[str]) -> None:
        if self.enabled:
            self._pending.update(tables)
            self._wake.set()

    async def run(self) -> None:
        while True:
            await self._wake.wait()
            await asyncio.sleep(self.settings.notify_debounce_ms / 1000)
            self._wake.clear()
            tables, self._pending = sorted(self._pending), set()
            try:
                await anyio.to_thread.run_sync(self._send, tables)
                self.sent += 1
                self.last_error = None
                self.metrics.inc("cdclake_receiver_notify_total", result="ok")
            except Exception as exc:
                self.last_error = f"{type(exc).__name__}: {exc}"
                self.metrics.inc("cdclake_receiver_notify_total", result="error")
                log.warning("Airflow asset event failed, retrying in %ss: %s", RETRY_S, self.last_error)
                # Keep the tables and try again: Airflow may be starting, or the DAG not parsed yet.
                self._pending.update(tables)
                self._asset_id = None
                await asyncio.sleep(RETRY_S)
                self._wake.set()

    # ------------------------------------------------------------------ blocking helpers

    def client(self) -> Any:
        if self._client is None:
            from cdclake.airflow_api import AirflowClient

            self._client = AirflowClient(
                self.settings.airflow_url, self.settings.airflow_user, self.settings.airflow_password, timeout=10.0
            )
        return self._client

    def _send(self, tables: list[str]) -> None:
        c = self.client()
        if self._asset_id is None:
            # By name: Airflow normalises the URI (adds a trailing slash).
            found = c.json("GET", "/api/v2/assets", params={"name_pattern": staging.ASSET_NAME})
            ids = [a["id"] for a in found.get("assets", []) if a.get("name") == staging.ASSET_NAME]
            if not ids:
                raise RuntimeError(f"Airflow knows no asset {STAGING_ASSET_URI} (is the {APPLY_DAG} DAG parsed?)")
            self._asset_id = int(ids[0])
        c.json("POST", "/api/v2/assets/events", json={"asset_id": self._asset_id, "extra": {"tables": tables}})

    def trigger_apply(self) -> str:
        """Blocking: start a ``cdc_apply`` run now; returns its run id."""
        if not self.settings.airflow_password:
            raise RuntimeError("CDCLAKE_AIRFLOW_PASSWORD is not set: the receiver cannot call Airflow")
        run_id: str = self.client().trigger(APPLY_DAG)
        return run_id

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
