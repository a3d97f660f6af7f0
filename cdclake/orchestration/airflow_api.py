"""A small client for Airflow 3's REST API (``/api/v2``), authenticated with a JWT from the
simple auth manager's ``/auth/token``. Used by the local stack, the receiver's
Asset notifier, the demo and the tests."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import httpx

if TYPE_CHECKING:
    import tenacity

TERMINAL = {"success", "failed"}
IDEMPOTENT = ("GET", "PUT", "PATCH", "DELETE")


class AirflowError(RuntimeError):
    pass


def _sleep(seconds: float) -> None:
    time.sleep(seconds)  # looked up per call, so a test's monkeypatched time.sleep applies


def _last_answer(state: tenacity.RetryCallState) -> httpx.Response:
    """Out of attempts: the last answer (or the last transport error), not tenacity's RetryError."""
    assert state.outcome is not None
    response: httpx.Response = state.outcome.result()  # raises the attempt's exception, if any
    return response


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

    def request(self, method: str, path: str, *, resend: bool = False, **kwargs: Any) -> httpx.Response:
        # Airflow on SQLite answers 500 "Database error" when a write waits past SQLite's busy
        # timeout (the scheduler and task heartbeats hold the one writer lock), and a loaded
        # api-server can miss the read timeout: an idempotent request (or a POST the caller made
        # idempotent with its own key, ``resend=True``) is sent again after a pause, 4 times at
        # most; any other POST is not (it may have taken effect). The last answer is returned,
        # or the last transport error raised, for the caller to judge.
        import tenacity  # the pipeline's: `cdclake` imports this module in a client-only install too

        relogged = False

        def once() -> httpx.Response:
            nonlocal relogged
            r = self._send(method, path, **kwargs)
            if r.status_code == 401 and not relogged:
                self._token, relogged = None, True  # expired: log in again, once per request
                r = self._send(method, path, **kwargs)
            return r

        retrying = tenacity.Retrying(
            stop=tenacity.stop_after_attempt(5 if resend or method.upper() in IDEMPOTENT else 1),
            wait=tenacity.wait_fixed(2.0),
            retry=tenacity.retry_if_result(lambda r: r.status_code in (500, 503))
            | tenacity.retry_if_exception_type(httpx.TransportError),
            retry_error_callback=_last_answer,
            sleep=_sleep,
        )
        response: httpx.Response = retrying(once)
        return response

    def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        if self._token is None:
            self._token = self._login()
        return self._http.request(method, path, headers={"Authorization": f"Bearer {self._token}"}, **kwargs)

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
        """A new manual run. Its id is chosen here (random, so no one else holds it), which makes
        the POST safe to resend: a 409 for it means an earlier attempt created the run."""
        run_id = f"manual__{datetime.now(UTC).isoformat()}_{secrets.token_hex(4)}"
        body = {"dag_run_id": run_id, "logical_date": None, "conf": conf or {}}
        r = self.request("POST", f"/api/v2/dags/{dag_id}/dagRuns", resend=True, json=body)
        if r.status_code == 409:
            return run_id
        if r.status_code >= 300:
            raise AirflowError(f"POST /api/v2/dags/{dag_id}/dagRuns: HTTP {r.status_code} {r.text[:300]}")
        return str(r.json()["dag_run_id"])

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
