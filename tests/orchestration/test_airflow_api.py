"""AirflowClient's retry rules, against a scripted transport (a SQLite lock timeout inside
Airflow cannot be caused on demand)."""

from __future__ import annotations

import json

import httpx
import pytest

from cdclake.orchestration.airflow_api import AirflowClient, AirflowError


def _client(answers: list[int], seen: list[str]) -> AirflowClient:
    def handle(req: httpx.Request) -> httpx.Response:
        if req.url.path == "/auth/token":
            return httpx.Response(201, json={"access_token": "t"})
        seen.append(req.method)
        code = answers.pop(0)
        return httpx.Response(code, json={"is_paused": False} if code == 200 else {"detail": "Database error"})

    c = AirflowClient("http://airflow.test", "admin", "pw")
    c._http = httpx.Client(base_url="http://airflow.test", transport=httpx.MockTransport(handle))
    return c


def test_an_idempotent_request_is_retried_through_database_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    waited: list[float] = []
    monkeypatch.setattr("cdclake.orchestration.airflow_api.time.sleep", waited.append)
    seen: list[str] = []
    _client([500, 500, 200], seen).unpause("cdc_apply")
    assert seen == ["PATCH"] * 3
    assert waited == [2.0, 2.0]


def test_retries_end_and_a_post_is_never_resent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("cdclake.orchestration.airflow_api.time.sleep", lambda s: None)
    seen: list[str] = []
    with pytest.raises(AirflowError, match="HTTP 500"):
        _client([500] * 5, seen).unpause("cdc_apply")
    assert seen == ["PATCH"] * 5
    seen.clear()
    c = _client([500, 200], seen)
    with pytest.raises(AirflowError, match="HTTP 500"):
        c.json("POST", "/api/v2/assets/events", json={"asset_id": 1})
    assert seen == ["POST"]


def test_a_trigger_names_its_run_so_a_resend_is_safe(monkeypatch: pytest.MonkeyPatch) -> None:
    """The trigger POST is resent (a 500 may or may not have created the run); a 409 for the
    run id the client chose means an earlier attempt did, and that run is the answer."""
    monkeypatch.setattr("cdclake.orchestration.airflow_api.time.sleep", lambda s: None)
    bodies: list[dict[str, object]] = []
    answers = [500, 409]

    def handle(req: httpx.Request) -> httpx.Response:
        if req.url.path == "/auth/token":
            return httpx.Response(201, json={"access_token": "t"})
        if req.method == "POST":
            bodies.append(json.loads(req.content))
            if answers:
                return httpx.Response(answers.pop(0), json={"detail": "x"})
            return httpx.Response(200, json={"dag_run_id": bodies[-1]["dag_run_id"]})
        return httpx.Response(200, json={"dag_run_id": req.url.path.rsplit("/", 1)[1], "state": "queued"})

    c = AirflowClient("http://airflow.test", "admin", "pw")
    c._http = httpx.Client(base_url="http://airflow.test", transport=httpx.MockTransport(handle))
    run_id = c.trigger("cdc_apply")
    assert len(bodies) == 2 and bodies[0] == bodies[1]
    assert run_id == bodies[0]["dag_run_id"] and str(run_id).startswith("manual__")
    assert c.trigger("cdc_apply") != run_id  # fresh ids: a 409 on the first try of a new id is not possible


def test_a_transport_error_is_retried_then_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("cdclake.orchestration.airflow_api.time.sleep", lambda s: None)
    calls: list[str] = []

    def handle(req: httpx.Request) -> httpx.Response:
        if req.url.path == "/auth/token":
            return httpx.Response(201, json={"access_token": "t"})
        calls.append(req.method)
        if len(calls) < 3:
            raise httpx.ReadTimeout("slow api-server", request=req)
        return httpx.Response(200, json={"dag_runs": []})

    c = AirflowClient("http://airflow.test", "admin", "pw")
    c._http = httpx.Client(base_url="http://airflow.test", transport=httpx.MockTransport(handle))
    assert c.active_runs("cdc_apply") == []
    assert calls == ["GET"] * 3
    calls.clear()
    with pytest.raises(httpx.ReadTimeout):
        c.json("POST", "/api/v2/assets/events", json={})  # a plain POST: one try
    assert calls == ["POST"]


def test_an_expired_token_is_renewed_once_per_request(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("cdclake.orchestration.airflow_api.time.sleep", lambda s: None)
    seen: list[str] = []
    _client([401, 500, 200], seen).unpause("cdc_apply")  # the 401's resend is no retry
    assert seen == ["PATCH"] * 3
    seen.clear()
    with pytest.raises(AirflowError, match="HTTP 401"):
        _client([401, 401, 200], seen).unpause("cdc_apply")
    assert seen == ["PATCH"] * 2
