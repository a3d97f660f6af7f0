"""Tell Airflow that data landed: an Asset event through its REST API, so ``cdc_apply`` (which is
scheduled on :data:`STAGING_ASSET_URI`) runs on arrival instead of waiting for its fallback
schedule.

Throttled (one event per ``CDCLAKE_NOTIFY_DEBOUNCE_MS`` at most, the first after a quiet spell at
once) and off the ack path: a slow or
absent Airflow never delays or fails an ack; the apply DAG's periodic schedule is the safety net.

``POST /flush`` and WebSocket ``flush_request`` go through :meth:`Notifier.flush`, coalesced.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.to_thread

from cdclake.config.settings import Settings
from cdclake.orchestration import assets
from cdclake.service.metrics import Metrics

log = logging.getLogger("cdclake.receiver")

STAGING_ASSET_URI = assets.ASSET_URI
APPLY_DAG = "cdc_apply"
RETRY_S = 5.0


@dataclass
class FlushRound:
    """One look at Airflow on behalf of every flush that arrived before it started."""

    done: anyio.Event = field(default_factory=anyio.Event)
    run_id: str = ""
    error: Exception | None = None


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
        self._next_flush: FlushRound | None = None
        self._flush_turn = anyio.Lock()

    def landed(self, tables: list[str]) -> None:
        if self.enabled:
            self._pending.update(tables)
            self._wake.set()

    async def run(self) -> None:
        # Throttled on the leading edge: a landing after a quiet spell is announced at once (a
        # lone batch no longer waits out the interval before its run can start), later ones
        # wait until the interval since the last event has passed, all in one event.
        last = -math.inf
        while True:
            await self._wake.wait()
            await asyncio.sleep(max(0.0, last + self.settings.notify_debounce_ms / 1000 - time.monotonic()))
            last = time.monotonic()
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
            from cdclake.orchestration.airflow_api import AirflowClient

            self._client = AirflowClient(
                self.settings.airflow_url, self.settings.airflow_user, self.settings.airflow_password, timeout=10.0
            )
        return self._client

    def _send(self, tables: list[str]) -> None:
        c = self.client()
        if self._asset_id is None:
            # By name: Airflow normalises the URI (adds a trailing slash).
            found = c.json("GET", "/api/v2/assets", params={"name_pattern": assets.ASSET_NAME})
            ids = [a["id"] for a in found.get("assets", []) if a.get("name") == assets.ASSET_NAME]
            if not ids:
                raise RuntimeError(f"Airflow knows no asset {STAGING_ASSET_URI} (is the {APPLY_DAG} DAG parsed?)")
            self._asset_id = int(ids[0])
        c.json("POST", "/api/v2/assets/events", json={"asset_id": self._asset_id, "extra": {"tables": tables}})

    async def flush(self) -> str:
        """The id of a ``cdc_apply`` run that has not started yet, so its plan sees everything
        landed before this call: one already queued, else a new one.

        Coalesced: a flush joins the round that has not looked at Airflow yet, or starts one,
        which waits for the round before it. However many flushes arrive, there is one round at
        a time and one waiting, each at most one listing and one trigger, and at most one queued
        run (``max_active_runs=1`` holds it while another runs): repeated flushes cannot pile
        up runs, and none is answered with a run that planned before its data landed.
        """
        r = self._next_flush
        if r is None:
            r = self._next_flush = FlushRound()
            # Shielded: the round answers every flush that joined it even if this caller goes.
            with anyio.CancelScope(shield=True):
                async with self._flush_turn:
                    self._next_flush = None  # from here on, flushes need a look after this one
                    try:
                        r.run_id = await anyio.to_thread.run_sync(self._queued_or_new_run)
                    except Exception as exc:
                        r.error = exc
                    finally:
                        r.done.set()
        await r.done.wait()
        if r.error is not None:
            raise r.error
        return r.run_id

    def _queued_or_new_run(self) -> str:
        """Blocking: a queued (not started) ``cdc_apply`` run, else a new one."""
        if not self.settings.airflow_password:
            raise RuntimeError("CDCLAKE_AIRFLOW_PASSWORD is not set: the receiver cannot call Airflow")
        c = self.client()
        queued = [r for r in c.active_runs(APPLY_DAG) if r.get("state") == "queued"]
        if queued:
            return str(queued[0]["dag_run_id"])
        run_id: str = c.trigger(APPLY_DAG)
        return run_id

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
