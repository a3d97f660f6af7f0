"""A small client for Airflow 3's REST API (``/api/v2``), authenticated with a JWT from the
simple auth manager's ``/auth/token``. Used by the demo, ``cdclake trigger`` and the tests."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx

TERMINAL = {"success", "failed"}


class AirflowError(RuntimeError):
    pass


class AirflowClient:
    def __init__(self, base_url: str, username: str, password: str, timeout: float = 30.0) -> None:
        self.base_url = base_url.rstrip("/")
        self._auth = {"username": username, "password": password}
        self._http = httpx.Client(base_url=self.base_url, timeout=timeout)
        self._token: str | None = None

    def close(self) -> None:
        self._http.close()

    def _login(self) -> str:
        r = self._http.post("/auth/token", json=self._auth)
        if r.status_code not in (200, 201):
            raise AirflowError(f"login to {self.base_url} failed: HTTP {r.status_code} {r.text[:200]}")
        token: str = r.json()["access_token"]
        return token

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        # Airflow on SQLite answers 500 "Database error" when a write waits past SQLite's busy
        # timeout (the scheduler and task heartbeats hold the one writer lock): an idempotent
        # request is sent again after a pause; a POST is not (it may have taken effect).
        retries = 4 if method.upper() in ("GET", "PUT", "PATCH", "DELETE") else 0
        relogged = False
        while True:
            if self._token is None:
                self._token = self._login()
            r = self._http.request(method, path, headers={"Authorization": f"Bearer {self._token}"}, **kwargs)
            if r.status_code == 401 and not relogged:
                self._token, relogged = None, True  # expired: log in again once
                continue
            if r.status_code in (500, 503) and retries:
                retries -= 1
                time.sleep(2.0)
                continue
            return r

    def json(self, method: str, path: str, **kwargs: Any) -> Any:
        r = self.request(method, path, **kwargs)
        if r.status_code >= 300:
            raise AirflowError(f"{method} {path}: HTTP {r.status_code} {r.text[:300]}")
        return r.json()

    # ------------------------------------------------------------------ waits

    def wait_healthy(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            try:
                r = self._http.get("/api/v2/monitor/health")
                if r.status_code == 200:
                    return
                last = f"HTTP {r.status_code}"
            except httpx.TransportError as exc:
                last = str(exc)
            time.sleep(1)
        raise AirflowError(f"Airflow API at {self.base_url} not healthy after {timeout:.0f}s: {last}")

    def wait_dag(self, dag_id: str, timeout: float = 180.0) -> dict[str, Any]:
        """Wait until the dag-processor has parsed ``dag_id``; surface import errors."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            r = self.request("GET", f"/api/v2/dags/{dag_id}")
            if r.status_code == 200:
                dag: dict[str, Any] = r.json()
                return dag
            errors = self.json("GET", "/api/v2/importErrors").get("import_errors", [])
            if errors:
                raise AirflowError(f"DAG import errors: {errors}")
            time.sleep(1)
        raise AirflowError(f"DAG {dag_id} not parsed after {timeout:.0f}s")

    # ------------------------------------------------------------------ runs

    def unpause(self, dag_id: str) -> None:
        self.json("PATCH", f"/api/v2/dags/{dag_id}", json={"is_paused": False})

    def pause(self, dag_id: str) -> None:
        self.json("PATCH", f"/api/v2/dags/{dag_id}", json={"is_paused": True})

    def active_runs(self, dag_id: str) -> list[dict[str, Any]]:
        """Queued and running runs, oldest first."""
        runs: list[dict[str, Any]] = self.json(
            "GET", f"/api/v2/dags/{dag_id}/dagRuns", params={"state": ["queued", "running"], "order_by": "run_after"}
        )["dag_runs"]
        return runs

    def trigger(self, dag_id: str, conf: dict[str, Any] | None = None) -> str:
        run = self.json("POST", f"/api/v2/dags/{dag_id}/dagRuns", json={"logical_date": None, "conf": conf or {}})
        run_id: str = run["dag_run_id"]
        return run_id

    def run(self, dag_id: str, run_id: str) -> dict[str, Any]:
        run: dict[str, Any] = self.json("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}")
        return run

    def task_instances(self, dag_id: str, run_id: str) -> list[dict[str, Any]]:
        tis: list[dict[str, Any]] = self.json("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances")[
            "task_instances"
        ]
        return tis

    def wait_run(
        self,
        dag_id: str,
        run_id: str,
        timeout: float = 900.0,
        progress: Callable[[str], None] | None = None,
    ) -> str:
        """Poll until the run ends; report task states whenever they change."""
        deadline = time.monotonic() + timeout
        t0 = time.monotonic()
        last = ""
        while time.monotonic() < deadline:
            state = self.run(dag_id, run_id)["state"]
            tis = self.task_instances(dag_id, run_id)
            line = ", ".join(
                f"{ti['task_id']}{'' if ti.get('map_index', -1) < 0 else '[' + str(ti['map_index']) + ']'}="
                f"{ti.get('state') or 'none'}"
                for ti in sorted(tis, key=lambda t: (t["task_id"], t.get("map_index", -1)))
            )
            summary = f"{dag_id} {state}: {line or 'waiting for scheduler'}"
            if progress and summary != last:
                progress(f"[{time.monotonic() - t0:5.0f}s] {summary}")
                last = summary
            if state in TERMINAL:
                return str(state)
            time.sleep(2)
        raise AirflowError(f"{dag_id} run {run_id} still not finished after {timeout:.0f}s")
