"""AirflowClient's retry rules, against a scripted transport (a SQLite lock timeout inside
Airflow cannot be caused on demand)."""

from __future__ import annotations

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
    with pytest.raises(AirflowError, match="HTTP 500"):
        _client([500, 200], seen).trigger("cdc_apply")
    assert seen == ["POST"]


def test_an_expired_token_is_renewed_once_per_request(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("cdclake.orchestration.airflow_api.time.sleep", lambda s: None)
    seen: list[str] = []
    _client([401, 500, 200], seen).unpause("cdc_apply")  # the 401's resend is no retry
    assert seen == ["PATCH"] * 3
    seen.clear()
    with pytest.raises(AirflowError, match="HTTP 401"):
        _client([401, 401, 200], seen).unpause("cdc_apply")
    assert seen == ["PATCH"] * 2
