"""The Lakehouse page's read model (cdclake/lakehouse/status.py) over tables written with pyiceberg,
and its app's authentication (cdclake/lakehouse/app.py) under Starlette's test client.
No JVM, no server: the browser test (tests/e2e/test_browser.py) runs the page in the api-server."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar

import pytest

from cdclake.config.settings import Settings
from cdclake.contracts.watermark import SUMMARY_KEY, Watermark, count_properties
from tests.support import make_settings, stage

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
T0_MS = int(T0.timestamp() * 1000)


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return make_settings(tmp_path)


def _schema(*extra: Any) -> Any:
    import pyarrow as pa

    return pa.schema([pa.field("id", pa.int64(), nullable=False), *extra])


def cdc_table(settings: Settings, appends: int, counts: dict[str, int]) -> None:
    """``orders``: ``appends`` files, each with a ``_cdc_ts``; the last carries a watermark and counts."""
    import pyarrow as pa

    from cdclake.lake.catalog import open_catalog

    catalog = open_catalog(settings)
    catalog.create_namespace_if_not_exists(settings.namespace)
    schema = _schema(pa.field("_cdc_ts", pa.timestamp("us", tz="UTC")))
    t = catalog.create_table((settings.namespace, "orders"), schema=schema)
    for i in range(appends):
        props = {SUMMARY_KEY: Watermark(low="x").encode(), **count_properties(counts)} if i == appends - 1 else {}
        ts = datetime(2026, 3, 1, 11, i, tzinfo=UTC)
        t.append(pa.table({"id": [i], "_cdc_ts": [ts]}, schema=schema), snapshot_properties=props)


def quarantine_table(settings: Settings, reasons: list[str], replayed: int = 0) -> None:
    """Rows with ``reasons``; the last ``replayed`` of them replayed (``_cdc_replayed_at`` set)."""
    import pyarrow as pa

    from cdclake.lake.catalog import open_catalog

    when = pa.field("_cdc_replayed_at", pa.timestamp("us", tz="UTC"))
    schema = _schema(pa.field("_cdc_reason", pa.string()), when)
    t = open_catalog(settings).create_table((settings.namespace, "orders__quarantine"), schema=schema)
    at = [None] * (len(reasons) - replayed) + [datetime(2026, 3, 1, 11, tzinfo=UTC)] * replayed
    t.append(pa.table({"id": list(range(len(reasons))), "_cdc_reason": reasons, "_cdc_replayed_at": at}, schema=schema))


def batch(n: int, table: str) -> dict[str, Any]:
    ev = {"table": table, "operation": "INSERT", "rowId": str(n), "after": {"id": n}, "sequence": n, "timestamp": T0_MS}
    return {"source": "s", "sequenceNumber": n, "events": [ev]}


def test_status_reads_files_accounting_freshness_pending_and_quarantine(settings: Settings) -> None:
    from cdclake.lakehouse.status import lake_status

    counts = {"received": 9, "applied": 4, "duplicate": 2, "superseded": 1, "late": 1, "quarantined": 1}
    cdc_table(settings, appends=6, counts=counts)
    reasons = ["type mismatch: v", "type mismatch: v", "null key", "too long", "type mismatch: v", "too long"]
    quarantine_table(settings, reasons, replayed=1)  # the replayed "too long" waits no more
    # orders' watermark "x" sorts above every staging name: its object is consumed, not pending;
    # two objects for a table that has none yet, landed 90 s and 30 s before now.
    stage(settings, [batch(1, "fresh")], landed_ms=T0_MS - 90_000)
    stage(settings, [batch(2, "fresh")], landed_ms=T0_MS - 30_000)
    stage(settings, [batch(3, "orders")], landed_ms=T0_MS - 60_000)

    by_name = {s.table: s for s in lake_status(settings, T0_MS)}
    assert sorted(by_name) == ["fresh", "orders", "orders__quarantine"]
    orders = by_name["orders"]
    assert (orders.exists, orders.rows, orders.data_files, orders.small_files) == (True, 6, 6, 6)
    assert (orders.delete_files, orders.snapshots, orders.compaction_candidate) == (0, 6, True)
    assert orders.last_apply is not None and orders.last_apply.counts == counts
    assert sum(counts[k] for k in counts if k != "received") == counts["received"]
    assert orders.valid_through_ms == int(datetime(2026, 3, 1, 11, 5, tzinfo=UTC).timestamp() * 1000)
    assert orders.freshness_event_s == 55 * 60  # 12:00 - 11:05
    assert (orders.pending_objects, orders.freshness_commit_s) == (0, 0.0)
    assert orders.quarantined == 5
    assert orders.top_reasons == [("type mismatch: v", 3), ("null key", 1), ("too long", 1)]

    fresh = by_name["fresh"]
    assert (fresh.exists, fresh.data_files, fresh.last_apply, fresh.quarantined) == (False, 0, None, None)
    assert (fresh.pending_objects, fresh.oldest_pending_ms, fresh.freshness_commit_s) == (2, T0_MS - 90_000, 90.0)
    assert fresh.freshness_event_s is None and fresh.since_commit_s is None


def test_fewer_small_files_than_the_minimum_is_no_candidate(settings: Settings) -> None:
    from cdclake.lakehouse.status import lake_status

    cdc_table(settings, appends=4, counts={"received": 1, "applied": 1})
    (orders,) = lake_status(settings, T0_MS)
    assert orders.data_files == 4 and not orders.compaction_candidate
    assert orders.quarantined is None and orders.top_reasons == []
    assert orders.last_apply is not None and orders.last_apply.counts["duplicate"] is None  # not recorded


def test_the_page_escapes_and_labels_both_freshness_figures(settings: Settings) -> None:
    from cdclake.lakehouse.page import render
    from cdclake.lakehouse.status import lake_status

    cdc_table(settings, appends=1, counts={"received": 1, "applied": 1})
    quarantine_table(settings, ["<script>alert(1)</script>"])
    html = render(lake_status(settings, T0_MS), None, T0_MS)
    assert "<script>alert(1)" not in html and "&lt;script&gt;alert(1)" in html
    assert "freshness by commit time" in html and "freshness by event time" in html
    rows = {r.split('"')[0]: r for r in html.split('<tr data-table="')[1:]}
    assert sorted(rows) == ["orders", "orders__quarantine"]
    assert (
        'received <span data-count="received">1</span> = applied <span data-count="applied">1</span>' in rows["orders"]
    )
    assert '<span data-count="duplicate">-</span>' in rows["orders"]  # not recorded: shown as such, not 0
    assert ">Apply</button>" in rows["orders"] and ">Compact</button>" in rows["orders"]
    assert ">Apply</button>" not in rows["orders__quarantine"]  # a side table: its CDC table's apply writes it
    error = render([], "OperationalError: unable to open database file", T0_MS)
    assert 'data-role="error"' in error and "unable to open database file" in error


def test_an_unreachable_catalog_is_said_not_raised(tmp_path: Path) -> None:
    from cdclake.lakehouse.app import _statuses

    broken = make_settings(tmp_path, catalog_url=f"sqlite:///{tmp_path}/missing/dir/catalog.db")
    statuses, error, _ = _statuses(broken)
    assert statuses == [] and error is not None and "OperationalError" in error


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/"),
        ("GET", "/v1/tables"),
        ("GET", "/v1/compaction/candidates"),
        ("GET", "/v1/compaction/metrics"),
        ("POST", "/v1/compaction/run"),
        ("POST", "/v1/compaction/auto"),
        ("POST", "/v1/apply"),
        ("POST", "/v1/expire"),
        ("POST", "/v1/holds/release"),
    ],
)
def test_anonymous_requests_are_refused(settings: Settings, method: str, path: str) -> None:
    from fastapi.testclient import TestClient

    from cdclake.lakehouse.app import create_app

    client = TestClient(create_app(lambda: settings))
    r = client.request(method, path, json={"table": "orders"})
    assert r.status_code == 401, (r.status_code, r.text)
    assert r.json() == {"detail": "Not authenticated"}


class FakeUser:
    def __init__(self, name: str) -> None:
        self.name = name

    def get_id(self) -> str:
        return self.name

    def get_name(self) -> str:
        return self.name


class FakeAuthManager:
    """Airflow's auth manager as ``get_user`` and ``requires_access_dag`` ask it: a token names
    its user; only ``admin`` may trigger runs, anyone but ``stranger`` may read."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, str, str | None]] = []

    async def get_user_from_token(self, token: str) -> FakeUser:
        return FakeUser(token.removeprefix("token-of-"))

    def is_authorized_dag(self, *, method: str, access_entity: Any, details: Any, user: FakeUser) -> bool:
        self.asked.append((user.get_name(), method, details.id))
        return user.get_name() == "admin" or (method == "GET" and user.get_name() != "stranger")


class RecordingAirflow:
    """The app's REST client, recording what it would send."""

    calls: ClassVar[list[tuple[str, str, str, dict[str, Any]]]] = []

    def __init__(self, base_url: str, token: str) -> None:
        self.base_url, self.token = base_url, token

    def __enter__(self) -> RecordingAirflow:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def recent_runs(self, dag_id: str) -> list[dict[str, Any]]:
        RecordingAirflow.calls.append((self.base_url, self.token, dag_id, {}))
        return [{"dag_run_id": "scheduled__1", "state": "success"}]

    def trigger(self, dag_id: str, conf: dict[str, Any]) -> dict[str, str]:
        RecordingAirflow.calls.append((self.base_url, self.token, dag_id, conf))
        return {"dag_id": dag_id, "run_id": "manual__1", "url": f"../dags/{dag_id}/runs/manual__1"}


@pytest.fixture
def authed(monkeypatch: pytest.MonkeyPatch, settings: Settings) -> tuple[Any, FakeAuthManager]:
    import airflow.api_fastapi.core_api.security as security
    from airflow.models.dag import DagModel
    from fastapi.testclient import TestClient

    import cdclake.lakehouse.app as lakehouse

    fake = FakeAuthManager()
    monkeypatch.setattr(security, "get_auth_manager", lambda: fake)
    monkeypatch.setattr(DagModel, "get_team_name", staticmethod(lambda dag_id, **_: None))  # no metadata DB here
    monkeypatch.setattr(lakehouse, "Airflow", RecordingAirflow)
    RecordingAirflow.calls = []
    return TestClient(lakehouse.create_app(lambda: settings)), fake


def test_a_user_who_may_not_trigger_gets_403_and_no_run(authed: tuple[Any, FakeAuthManager]) -> None:
    client, fake = authed
    viewer = {"Authorization": "Bearer token-of-viewer"}
    for path, body in (("/v1/compaction/run", {"table": "orders"}), ("/v1/apply", {"table": "orders"})):
        r = client.post(path, json=body, headers=viewer)
        assert r.status_code == 403, r.text
    assert RecordingAirflow.calls == []
    assert ("viewer", "POST", "iceberg_compaction") in fake.asked and ("viewer", "POST", "cdc_apply") in fake.asked
    assert client.get("/v1/compaction/candidates", headers=viewer).json() == {"min_input_files": 5, "candidates": []}


def test_a_user_who_may_not_read_cdc_apply_sees_no_table(authed: tuple[Any, FakeAuthManager]) -> None:
    """Logged in is not enough: the page and the read API show counts and quarantine reasons
    (which quote values), for users who may read cdc_apply's runs."""
    client, fake = authed
    stranger = {"Authorization": "Bearer token-of-stranger"}
    for path in ("/", "/v1/tables", "/v1/compaction/candidates", "/v1/compaction/metrics"):
        r = client.get(path, headers=stranger)
        assert r.status_code == 403, (path, r.text)
    assert ("stranger", "GET", "cdc_apply") in fake.asked
    assert RecordingAirflow.calls == []


def test_an_action_triggers_its_dag_with_the_callers_own_token(
    authed: tuple[Any, FakeAuthManager], settings: Settings
) -> None:
    client, _ = authed
    cdc_table(settings, appends=1, counts={"received": 1, "applied": 1})
    r = client.post(
        "/v1/compaction/run",
        json={"table": "orders", "where": "created_at >= '2026-01-02'"},
        cookies={"_token": "token-of-admin"},
        headers=PAGE_FETCH,
    )
    assert r.status_code == 200, r.text
    assert r.json()["url"] == "../dags/iceberg_compaction/runs/manual__1"
    r = client.post("/v1/expire", json={"table": "orders"}, headers={"Authorization": "Bearer token-of-admin"})
    assert r.status_code == 200, r.text
    assert RecordingAirflow.calls == [
        (
            settings.airflow_url,
            "token-of-admin",
            "iceberg_compaction",
            {"tables": ["orders"], "min_input_files": 5, "where": "created_at >= '2026-01-02'"},
        ),
        (settings.airflow_url, "token-of-admin", "iceberg_expire", {"tables": ["orders"]}),
    ]


def test_auto_compaction_triggers_one_run_over_the_current_candidates(
    authed: tuple[Any, FakeAuthManager], settings: Settings
) -> None:
    client, _ = authed
    admin = {"Authorization": "Bearer token-of-admin"}
    assert client.post("/v1/compaction/auto", headers=admin).json() == {"candidates": [], "run": None}
    cdc_table(settings, appends=6, counts={"received": 1, "applied": 1})  # 6 small files: a candidate
    r = client.post("/v1/compaction/auto", headers=admin)
    assert r.status_code == 200, r.text
    assert r.json()["candidates"] == ["orders"]
    assert RecordingAirflow.calls == [
        (settings.airflow_url, "token-of-admin", "iceberg_compaction", {"tables": ["orders"], "min_input_files": 5})
    ]
    (found,) = client.get("/v1/compaction/candidates", headers=admin).json()["candidates"]
    assert (found["table"], found["data_files"], found["small_files"]) == ("orders", 6, 6)


def test_compaction_metrics_are_file_counts_and_the_recent_runs(
    authed: tuple[Any, FakeAuthManager], settings: Settings
) -> None:
    client, _ = authed
    cdc_table(settings, appends=2, counts={"received": 1, "applied": 1})
    r = client.get("/v1/compaction/metrics", headers={"Authorization": "Bearer token-of-viewer"})
    assert r.status_code == 200, r.text
    assert r.json() == {
        "tables": [
            {
                "table": "orders",
                "data_files": 2,
                "small_files": 2,
                "delete_files": 0,
                "snapshots": 2,
                "compaction_candidate": False,
            }
        ],
        "recent_runs": [{"dag_run_id": "scheduled__1", "state": "success"}],
    }
    assert RecordingAirflow.calls == [(settings.airflow_url, "token-of-viewer", "iceberg_compaction", {})]
    assert (
        client.get("/v1/compaction/candidates?min_input_files=0", headers={"Authorization": "Bearer x"}).status_code
        == 422
    )


# The page's fetch, as Chromium sends it from the Lakehouse page (tests/e2e/test_browser.py):
# same origin, the Origin of the page (TestClient's Host is "testserver"), the page's header.
PAGE_FETCH = {"Sec-Fetch-Site": "same-origin", "Origin": "http://testserver", "X-Lakehouse-Action": "1"}


@pytest.mark.parametrize(
    "headers",
    [
        {"Sec-Fetch-Site": "same-site", "Origin": "http://testserver:8090", "X-Lakehouse-Action": "1"},
        {"Sec-Fetch-Site": "cross-site", "X-Lakehouse-Action": "1"},
        {"Origin": "http://127.0.0.1:8090", "X-Lakehouse-Action": "1"},  # a browser without Fetch Metadata
        {"Origin": "null", "X-Lakehouse-Action": "1"},  # a sandboxed page
        {"Content-Type": "text/plain"},  # a plain form post: no custom header
        {},
    ],
    ids=["same-site", "cross-site", "other-origin", "null-origin", "form-post", "no-header"],
)
@pytest.mark.parametrize("path", ["/v1/compaction/run", "/v1/compaction/auto", "/v1/apply", "/v1/expire"])
def test_a_cookie_only_action_not_from_the_page_is_refused_and_makes_no_run(
    authed: tuple[Any, FakeAuthManager], settings: Settings, path: str, headers: dict[str, str]
) -> None:
    """CSRF: the _token cookie is SameSite=Lax, so a browser sends it with a POST from any page of
    the same site (another port of the host). Without proof of origin, no run is made."""
    client, _ = authed
    cdc_table(settings, appends=6, counts={"received": 1, "applied": 1})  # exists, and a candidate
    body = '{"table": "orders"}'
    r = client.post(path, content=body, cookies={"_token": "token-of-admin"}, headers=headers)
    assert r.status_code == 403, (r.status_code, r.text)
    assert RecordingAirflow.calls == []


def test_the_pages_own_fetch_and_a_bearer_client_may_act(
    authed: tuple[Any, FakeAuthManager], settings: Settings
) -> None:
    client, _ = authed
    cdc_table(settings, appends=1, counts={"received": 1, "applied": 1})
    page = client.post("/v1/expire", json={"table": "orders"}, cookies={"_token": "token-of-admin"}, headers=PAGE_FETCH)
    curl = client.post("/v1/expire", json={"table": "orders"}, headers={"Authorization": "Bearer token-of-admin"})
    assert (page.status_code, curl.status_code) == (200, 200), (page.text, curl.text)
    assert [c[2] for c in RecordingAirflow.calls] == ["iceberg_expire", "iceberg_expire"]


@pytest.mark.parametrize(
    ("path", "extra"),
    [("/v1/apply", {}), ("/v1/expire", {}), ("/v1/compaction/run", {"where": "id > 0", "min_input_files": 2})],
)
def test_an_action_on_a_table_that_does_not_exist_is_404_naming_it_and_makes_no_run(
    authed: tuple[Any, FakeAuthManager], settings: Settings, path: str, extra: dict[str, Any]
) -> None:
    client, _ = authed
    admin = {"Authorization": "Bearer token-of-admin"}
    cdc_table(settings, appends=1, counts={"received": 1, "applied": 1})
    for name in ("no_such_table", "../../etc", "orders x"):
        r = client.post(path, json={"table": name, **extra}, headers=admin)
        assert r.status_code == 404, (name, r.status_code, r.text)
        assert repr(name) in r.json()["detail"], r.text
    assert RecordingAirflow.calls == []


def test_apply_takes_a_table_that_staging_waits_to_create_and_the_others_only_iceberg_tables(
    authed: tuple[Any, FakeAuthManager], settings: Settings
) -> None:
    client, _ = authed
    admin = {"Authorization": "Bearer token-of-admin"}
    stage(settings, [batch(1, "fresh")], landed_ms=T0_MS)  # staged, no Iceberg table yet
    assert client.post("/v1/apply", json={"table": "Fresh"}, headers=admin).status_code == 200
    for path in ("/v1/expire", "/v1/compaction/run"):
        r = client.post(path, json={"table": "fresh"}, headers=admin)
        assert r.status_code == 404 and "'fresh'" in r.json()["detail"], r.text
    cdc_table(settings, appends=1, counts={"received": 1, "applied": 1})
    quarantine_table(settings, ["null key"])
    r = client.post("/v1/apply", json={"table": "orders__quarantine"}, headers=admin)
    assert r.status_code == 404, r.text  # a side table is applied with its CDC table
    assert RecordingAirflow.calls == [(settings.airflow_url, "token-of-admin", "cdc_apply", {"tables": ["fresh"]})]


def test_a_held_publish_is_shown_and_released_by_a_user_who_may_trigger_cdc_apply(
    authed: tuple[Any, FakeAuthManager], settings: Settings
) -> None:
    from cdclake.lake import holds
    from cdclake.staging.stores import open_store

    client, fake = authed
    cdc_table(settings, appends=1, counts={"received": 1, "applied": 1})
    store = open_store(settings)
    holds.hold(
        store, [holds.Failure("orders", "key_unique", "2 keys (id) held by <b>more</b> than one row")], ["orders"]
    )
    page = client.get("/", headers={"Authorization": "Bearer token-of-viewer"}).text
    assert (
        "Publish held by an expectation" in page and "key_unique: 2 keys (id) held by &lt;b&gt;more&lt;/b&gt;" in page
    )
    assert "v1/holds/release" in page
    [row] = [t for t in client.get("/v1/tables", headers={"Authorization": "Bearer token-of-viewer"}).json()]
    assert row["held"] and row["released"] is False

    r = client.post("/v1/holds/release", json={"table": "orders"}, headers={"Authorization": "Bearer token-of-viewer"})
    assert r.status_code == 403 and not holds.held(store)["orders"].released
    assert ("viewer", "POST", "cdc_apply") in fake.asked
    admin = {"Authorization": "Bearer token-of-admin"}
    r = client.post("/v1/holds/release", json={"table": "orders"}, headers=admin)
    assert r.status_code == 200 and r.json() == {"table": "orders", "released": True, "tables": ["orders"]}
    assert holds.held(store)["orders"].released
    assert "Publish held, released" in client.get("/", headers=admin).text
    r = client.post("/v1/holds/release", json={"table": "lines"}, headers=admin)
    assert r.status_code == 404 and "lines is not held" in r.text
