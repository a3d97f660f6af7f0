"""Issue 13, finding 9: ``POST /flush`` and WebSocket ``flush_request`` are coalesced. Repeated or
concurrent flushes make one ``cdc_apply`` run, and every caller is answered with a run that has
not started yet (so its plan sees what the caller landed)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from starlette.testclient import TestClient

from receiver.app import create_app
from tests.support.airflow import FakeAirflow
from tests.support.receiver import env_settings


def test_300_flushes_and_300_flush_requests_make_one_trigger_call(tmp_path: Path, airflow: FakeAirflow) -> None:
    s = env_settings(tmp_path, airflow_password="pw", notify_debounce_ms=0)
    with TestClient(create_app(s)) as c:
        http = [c.post("/flush") for _ in range(300)]
        with c.websocket_connect("/v1/stream") as ws:
            ws.send_json({"type": "connect", "sourceDoId": "app"})
            ws.receive_json()
            ws_runs = []
            for _ in range(300):
                ws.send_json({"type": "flush_request", "sourceDoId": "app"})
                ws_runs.append(ws.receive_json()["flush"]["dag_run_id"])
        assert {r.status_code for r in http} == {202}
        assert {r.json()["dag_run_id"] for r in http} | set(ws_runs) == {"manual__1"}
        assert airflow.triggers == 1

        # Once that run has started, its plan may already be made: the next flush needs a new run.
        airflow.runs["manual__1"] = "running"
        after = c.post("/flush").json()["dag_run_id"]
        assert after == "manual__2" and airflow.triggers == 2

        # Concurrent flushes while no run is queued share one trigger.
        airflow.runs["manual__2"] = "running"
        airflow.delay_s = 0.2
        with ThreadPoolExecutor(20) as pool:
            answers = list(pool.map(lambda _: c.post("/flush"), range(40)))
    assert {a.json()["dag_run_id"] for a in answers} == {"manual__3"}
    assert airflow.triggers == 3


def test_a_run_queued_by_someone_else_answers_the_flush(tmp_path: Path, airflow: FakeAirflow) -> None:
    airflow.runs = {"asset_triggered__x": "queued", "scheduled__y": "running"}
    s = env_settings(tmp_path, airflow_password="pw", notify_debounce_ms=0)
    with TestClient(create_app(s)) as c:
        r = c.post("/flush")
    assert r.status_code == 202 and r.json()["dag_run_id"] == "asset_triggered__x"
    assert airflow.triggers == 0
