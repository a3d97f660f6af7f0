"""Airflow's REST API faked in-process (the ``airflow`` fixture in tests/conftest.py installs it)."""

from __future__ import annotations

import threading
import time
from typing import Any


class FakeAirflow:
    """Airflow's REST API as the receiver uses it: runs of cdc_apply and their states."""

    def __init__(self) -> None:
        self.runs: dict[str, str] = {}
        self.triggers = 0
        self.delay_s = 0.0
        self.lock = threading.Lock()
        self.asset_events: list[tuple[float, list[str]]] = []  # (monotonic time, tables) per Asset event

    def client(self, *args: Any, **kwargs: Any) -> FakeAirflow:
        return self

    def trigger(self, dag_id: str, conf: dict[str, Any] | None = None) -> str:
        assert dag_id == "cdc_apply"
        time.sleep(self.delay_s)  # concurrent callers overlap with a slow API
        with self.lock:
            self.triggers += 1
            run_id = f"manual__{self.triggers}"
            self.runs[run_id] = "queued"
        return run_id

    def active_runs(self, dag_id: str) -> list[dict[str, Any]]:
        with self.lock:
            return [{"dag_run_id": r, "state": s} for r, s in self.runs.items() if s in ("queued", "running")]

    def json(self, method: str, path: str, **kwargs: Any) -> Any:
        if method == "GET" and path == "/api/v2/dags/cdc_apply/dagRuns":
            states = kwargs.get("params", {}).get("state") or ["queued", "running"]
            return {"dag_runs": [r for r in self.active_runs("cdc_apply") if r["state"] in states]}
        if method == "GET" and path == "/api/v2/assets":
            return {"assets": [{"id": 1, "name": kwargs["params"]["name_pattern"]}]}
        if method == "POST" and path == "/api/v2/assets/events":
            with self.lock:
                self.asset_events.append((time.monotonic(), list(kwargs["json"]["extra"]["tables"])))
            return {}
        raise AssertionError(f"unexpected Airflow call {method} {path}")

    def close(self) -> None:
        pass
