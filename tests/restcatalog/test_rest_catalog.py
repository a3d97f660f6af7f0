"""The Iceberg REST catalog (restcatalog/): every endpoint through Starlette's test client, then
pyiceberg's own RestCatalog against a real uvicorn server, concurrent committers, bad input and
a bounded fuzz. No Spark here (see test_rest_engines.py)."""

from __future__ import annotations

import base64
import copy
import json
import random
import re
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from starlette.routing import Route
from starlette.testclient import TestClient

from cdclake.config.settings import Settings
from cdclake.lake.catalog import open_catalog
from restcatalog import auth
from restcatalog.app import create_app
from tests.support.rest import SCHEMA, R, W, counter, err, make_table, rest_catalog, rest_settings, serve, set_props


@pytest.fixture()
def settings(tmp_path: Path) -> Settings:
    return rest_settings(tmp_path)


@pytest.fixture()
def client(settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(settings)) as c:
        yield c


# -- config and auth


def test_config_and_warehouse(client: TestClient, settings: Settings) -> None:
    body = client.get("/v1/config", headers=R).json()
    assert body["overrides"] == {} and "POST /v1/{prefix}/transactions/commit" in body["endpoints"]
    for wh in ("lake", settings.warehouse, ""):
        assert client.get("/v1/config", params={"warehouse": wh}, headers=R).status_code == 200
    r = client.get("/v1/config", params={"warehouse": "s3://elsewhere"}, headers=R)
    assert r.status_code == 400 and err(r)["type"] == "BadRequestException"


def test_oauth_tokens(client: TestClient) -> None:
    form = {"grant_type": "client_credentials", "client_id": "reader", "client_secret": "rsecret", "scope": "catalog"}
    tok = client.post("/v1/oauth/tokens", data=form).json()
    assert tok["token_type"] == "bearer" and tok["expires_in"] == 3600
    bearer = {"Authorization": f"Bearer {tok['access_token']}"}
    assert client.get("/v1/namespaces", headers=bearer).status_code == 200
    assert client.post("/v1/namespaces", json={"namespace": ["x"]}, headers=bearer).status_code == 403
    basic = "Basic " + base64.b64encode(b"writer:wsecret").decode()
    wtok = client.post("/v1/oauth/tokens", data={"grant_type": "client_credentials"}, headers={"Authorization": basic})
    wbearer = {"Authorization": f"Bearer {wtok.json()['access_token']}"}
    assert client.post("/v1/namespaces", json={"namespace": ["x"]}, headers=wbearer).status_code == 200
    # Java refreshes by token exchange.
    ex = {"grant_type": "urn:ietf:params:oauth:grant-type:token-exchange", "subject_token": tok["access_token"]}
    assert client.post("/v1/oauth/tokens", data=ex).status_code == 200
    bad = client.post("/v1/oauth/tokens", data={**form, "client_secret": "nope"})
    assert bad.status_code == 401 and bad.json()["error"] == "invalid_client"
    assert client.post("/v1/oauth/tokens", data={"grant_type": "password"}).json()["error"] == "unsupported_grant_type"
    forged = tok["access_token"][:-4] + "AAAA"
    assert client.get("/v1/namespaces", headers={"Authorization": f"Bearer {forged}"}).status_code == 401


def test_auth_required_and_readonly(client: TestClient) -> None:
    r = client.get("/v1/namespaces")
    assert r.status_code == 401 and err(r)["type"] == "NotAuthorizedException"
    assert "Bearer" in r.headers["www-authenticate"]
    assert client.get("/v1/namespaces", headers={"Authorization": "Bearer wrong"}).status_code == 401
    r = client.post("/v1/namespaces", json={"namespace": ["ro"]}, headers=R)
    assert r.status_code == 403 and err(r)["type"] == "ForbiddenException"
    make_table(client)
    for method, path in [
        ("DELETE", "/v1/namespaces/cdc/tables/t"),
        ("POST", "/v1/namespaces/cdc/tables/t"),
        ("DELETE", "/v1/namespaces/cdc"),
        ("POST", "/v1/tables/rename"),
        ("POST", "/v1/transactions/commit"),
    ]:
        assert client.request(method, path, headers=R, json={}).status_code == 403, (method, path)
    assert client.get("/v1/namespaces/cdc/tables/t", headers=R).status_code == 200
    # A reader's scan report is accepted.
    assert (
        client.post("/v1/namespaces/cdc/tables/t/metrics", json={"report-type": "scan-report"}, headers=R).status_code
        == 204
    )


def test_open_access_without_tokens_file(tmp_path: Path) -> None:
    with TestClient(create_app(rest_settings(tmp_path, tokens=False))) as c:
        assert c.post("/v1/namespaces", json={"namespace": ["open"]}).status_code == 200
        tok = c.post(
            "/v1/oauth/tokens", data={"grant_type": "client_credentials", "client_id": "a", "client_secret": "b"}
        )
        assert tok.status_code == 200


def test_tokens_file_errors(tmp_path: Path) -> None:
    bad = tmp_path / "t.toml"
    for text in ('[[client]]\nid = "a"\n', '[[client]]\nid = "a"\nsecret = "s"\naccess = "admin"\n', "not toml ["):
        bad.write_text(text)
        with pytest.raises(auth.TokensFileError, match="CDCLAKE_REST_TOKENS_FILE"):
            auth.Tokens.load(bad, 60)


def test_settings_and_exposure(tmp_path: Path) -> None:
    from cdclake.config.settings import SettingsError, load
    from restcatalog.__main__ import check_exposure

    env = {"CDCLAKE_HOME": str(tmp_path), "CDCLAKE_REST_PORT": "9181", "CDCLAKE_REST_HOST": "0.0.0.0"}
    s = load(env)
    assert (s.rest_port, s.rest_tokens_file, s.rest_token_ttl_s) == (9181, None, 3600)
    assert "CDCLAKE_REST_TOKENS_FILE" in (check_exposure(s) or "")
    assert check_exposure(load({**env, "CDCLAKE_REST_TOKENS_FILE": str(tmp_path / "t.toml")})) is None
    assert check_exposure(load({**env, "CDCLAKE_REST_HOST": "127.0.0.1"})) is None
    with pytest.raises(SettingsError, match="CDCLAKE_REST_PORT"):
        load({**env, "CDCLAKE_REST_PORT": "http"})


# -- namespaces


def test_namespaces(client: TestClient) -> None:
    r = client.post("/v1/namespaces", json={"namespace": ["a"], "properties": {"owner": "me"}}, headers=W)
    assert r.json() == {"namespace": ["a"], "properties": {"owner": "me"}}
    r = client.post("/v1/namespaces", json={"namespace": ["a"]}, headers=W)
    assert r.status_code == 409 and err(r)["type"] == "AlreadyExistsException"
    client.post("/v1/namespaces", json={"namespace": ["a", "b"]}, headers=W)
    client.post("/v1/namespaces", json={"namespace": ["c"]}, headers=W)
    assert client.get("/v1/namespaces", headers=R).json()["namespaces"] == [["a"], ["c"]]
    assert client.get("/v1/namespaces", params={"parent": "a"}, headers=R).json()["namespaces"] == [["a", "b"]]
    r = client.get("/v1/namespaces", params={"parent": "zz"}, headers=R)
    assert r.status_code == 404 and err(r)["type"] == "NoSuchNamespaceException"
    p1 = client.get("/v1/namespaces", params={"pageSize": 1}, headers=R).json()
    p2 = client.get("/v1/namespaces", params={"pageSize": 1, "pageToken": p1["next-page-token"]}, headers=R).json()
    assert p1["namespaces"] + p2["namespaces"] == [["a"], ["c"]] and p2["next-page-token"] is None
    assert client.get("/v1/namespaces/a%1Fb", headers=R).json()["namespace"] == ["a", "b"]
    assert client.head("/v1/namespaces/a", headers=R).status_code == 204
    assert client.head("/v1/namespaces/zz", headers=R).status_code == 404
    r = client.get("/v1/namespaces/zz", headers=R)
    assert r.status_code == 404 and err(r)["type"] == "NoSuchNamespaceException"
    # properties: update, remove, missing; the same key in both is 422
    r = client.post(
        "/v1/namespaces/a/properties", json={"updates": {"x": "1"}, "removals": ["owner", "gone"]}, headers=W
    )
    assert r.json() == {"updated": ["x"], "removed": ["owner"], "missing": ["gone"]}
    assert client.get("/v1/namespaces/a", headers=R).json()["properties"] == {"x": "1"}
    r = client.post("/v1/namespaces/a/properties", json={"removals": ["x"]}, headers=W)
    assert r.json()["removed"] == ["x"] and client.head("/v1/namespaces/a", headers=R).status_code == 204
    r = client.post("/v1/namespaces/a/properties", json={"updates": {"k": "v"}, "removals": ["k"]}, headers=W)
    assert r.status_code == 422
    # drop: children or tables make it 409; empty drops
    r = client.delete("/v1/namespaces/a", headers=W)
    assert r.status_code == 409 and err(r)["type"] == "NamespaceNotEmptyException"
    make_table(client, "c", "t")
    r = client.delete("/v1/namespaces/c", headers=W)
    assert r.status_code == 409 and err(r)["type"] == "NamespaceNotEmptyException"
    assert client.delete("/v1/namespaces/a%1Fb", headers=W).status_code == 204
    assert client.delete("/v1/namespaces/a", headers=W).status_code == 204
    assert client.delete("/v1/namespaces/a", headers=W).status_code == 404


# -- tables


def test_tables_lifecycle(client: TestClient, settings: Settings) -> None:
    created = make_table(client, properties={"owner": "x"})
    assert created["metadata"]["properties"]["owner"] == "x"
    assert created["metadata-location"].startswith(settings.warehouse)
    r = client.post("/v1/namespaces/cdc/tables", json={"name": "t", "schema": SCHEMA}, headers=W)
    assert r.status_code == 409 and err(r)["type"] == "AlreadyExistsException"
    r = client.post("/v1/namespaces/nope/tables", json={"name": "t", "schema": SCHEMA}, headers=W)
    assert r.status_code == 404 and err(r)["type"] == "NoSuchNamespaceException"
    assert client.get("/v1/namespaces/cdc/tables", headers=R).json()["identifiers"] == [
        {"namespace": ["cdc"], "name": "t"}
    ]
    assert client.get("/v1/namespaces/nope/tables", headers=R).status_code == 404
    loaded = client.get("/v1/namespaces/cdc/tables/t", headers=R)
    assert loaded.json()["metadata"] == created["metadata"] and loaded.json()["config"] == {}
    # Unchanged table: 304 on the ETag.
    assert (
        client.get("/v1/namespaces/cdc/tables/t", headers={**R, "If-None-Match": loaded.headers["etag"]}).status_code
        == 304
    )
    r = client.get("/v1/namespaces/cdc/tables/zz", headers=R)
    assert r.status_code == 404 and err(r)["type"] == "NoSuchTableException"
    assert client.head("/v1/namespaces/cdc/tables/t", headers=R).status_code == 204
    assert client.head("/v1/namespaces/cdc/tables/zz", headers=R).status_code == 404
    # rename across namespaces, onto an existing name, from a missing table
    client.post("/v1/namespaces", json={"namespace": ["other"]}, headers=W)
    ren = {"source": {"namespace": ["cdc"], "name": "t"}, "destination": {"namespace": ["other"], "name": "u"}}
    assert client.post("/v1/tables/rename", json=ren, headers=W).status_code == 204
    assert client.get("/v1/namespaces/other/tables/u", headers=R).status_code == 200
    assert client.post("/v1/tables/rename", json=ren, headers=W).status_code == 404
    # A rename keeps the location: other.u still lives in .../cdc/t, so a new cdc.t goes elsewhere.
    r = client.post("/v1/namespaces/cdc/tables", json={"name": "t", "schema": SCHEMA}, headers=W)
    assert r.status_code == 400 and "overlaps another table" in err(r)["message"]
    make_table(client, "cdc", "t", location=settings.warehouse + "/cdc/t-2")
    back = {"source": ren["destination"], "destination": ren["source"]}
    r = client.post("/v1/tables/rename", json=back, headers=W)
    assert r.status_code == 409 and err(r)["type"] == "AlreadyExistsException"
    # drop, then drop with purge (files gone)
    assert client.delete("/v1/namespaces/other/tables/u", headers=W).status_code == 204
    assert client.delete("/v1/namespaces/other/tables/u", headers=W).status_code == 404
    loc = client.get("/v1/namespaces/cdc/tables/t", headers=R).json()["metadata-location"]
    assert client.delete("/v1/namespaces/cdc/tables/t", params={"purgeRequested": "true"}, headers=W).status_code == 204
    assert not Path(loc.removeprefix("file://")).exists()
    assert (
        client.delete("/v1/namespaces/cdc/tables/t", params={"purgeRequested": "maybe"}, headers=W).status_code == 400
    )


def test_register(client: TestClient, settings: Settings) -> None:
    loc = make_table(client)["metadata-location"]
    client.delete("/v1/namespaces/cdc/tables/t", headers=W)
    r = client.post("/v1/namespaces/cdc/register", json={"name": "back", "metadata-location": loc}, headers=W)
    assert r.status_code == 200 and r.json()["metadata-location"] == loc
    r = client.post("/v1/namespaces/cdc/register", json={"name": "back", "metadata-location": loc}, headers=W)
    assert r.status_code == 409
    for bad in ("file:///etc/passwd", settings.warehouse + "/../../etc/passwd"):
        r = client.post("/v1/namespaces/cdc/register", json={"name": "x", "metadata-location": bad}, headers=W)
        assert r.status_code == 400 and "outside the warehouse" in err(r)["message"]
    missing = settings.warehouse + "/cdc/x/metadata/00000-nope.metadata.json"
    r = client.post("/v1/namespaces/cdc/register", json={"name": "x", "metadata-location": missing}, headers=W)
    assert r.status_code == 400 and client.head("/v1/namespaces/cdc/tables/x", headers=R).status_code == 404
    r = client.post(
        "/v1/namespaces/cdc/register", json={"name": "y", "metadata-location": loc, "overwrite": True}, headers=W
    )
    assert r.status_code == 406


def test_commit_requirements_and_updates(client: TestClient) -> None:
    meta = make_table(client)["metadata"]
    path = "/v1/namespaces/cdc/tables/t"
    r = set_props(client, path, meta, {"a": "1"})
    assert r.status_code == 200 and r.json()["metadata"]["properties"]["a"] == "1"
    new_loc = r.json()["metadata-location"]
    assert client.get(path, headers=R).json()["metadata-location"] == new_loc
    # a stale requirement: 409 CommitFailedException, and nothing changes
    stale = {
        "requirements": [{"type": "assert-current-schema-id", "current-schema-id": 7}],
        "updates": [{"action": "set-properties", "updates": {"b": "2"}}],
    }
    r = client.post(path, json=stale, headers=W)
    assert r.status_code == 409 and err(r)["type"] == "CommitFailedException"
    assert client.get(path, headers=R).json()["metadata-location"] == new_loc
    wrong_uuid = {"requirements": [{"type": "assert-table-uuid", "uuid": "00000000-0000-0000-0000-000000000000"}]}
    assert client.post(path, json=wrong_uuid, headers=W).status_code == 409
    # unknown action / requirement, mismatched identifier, updates that cannot apply: 400
    for body in (
        {"updates": [{"action": "drop-everything"}]},
        {"requirements": [{"type": "assert-nothing"}]},
        {"identifier": {"namespace": ["cdc"], "name": "other"}, "updates": []},
        {"updates": [{"action": "set-current-schema", "schema-id": 42}]},
        {"updates": [{"action": "set-properties", "updates": {"py-io-impl": "os.system"}}]},
        {"updates": [{"action": "set-location", "location": "file:///etc"}]},
        {"updates": [{"action": "set-properties", "updates": {"write.metadata.path": "/tmp/elsewhere"}}]},
    ):
        r = client.post(path, json=body, headers=W)
        assert r.status_code == 400, (body, r.text)
        assert err(r)["type"] == "BadRequestException"
    # schema evolution through the commit endpoint
    add = {
        "requirements": [{"type": "assert-current-schema-id", "current-schema-id": 0}],
        "updates": [
            {
                "action": "add-schema",
                "schema": {
                    **SCHEMA,
                    "schema-id": 1,
                    "fields": [*SCHEMA["fields"], {"id": 4, "name": "extra", "type": "int", "required": False}],
                },
                "last-column-id": 4,
            },
            {"action": "set-current-schema", "schema-id": -1},
        ],
    }
    r = client.post(path, json=add, headers=W)
    assert r.status_code == 200, r.text
    assert r.json()["metadata"]["current-schema-id"] == 1
    assert client.post("/v1/namespaces/cdc/tables/missing", json={"updates": []}, headers=W).status_code == 404


def test_stage_create_then_commit(client: TestClient) -> None:
    client.post("/v1/namespaces", json={"namespace": ["cdc"]}, headers=W)
    r = client.post("/v1/namespaces/cdc/tables", json={"name": "s", "schema": SCHEMA, "stage-create": True}, headers=W)
    assert r.status_code == 200 and r.json()["metadata-location"] is None
    assert client.head("/v1/namespaces/cdc/tables/s", headers=R).status_code == 404
    meta = r.json()["metadata"]
    body = {
        "requirements": [{"type": "assert-create"}],
        "updates": [
            {"action": "assign-uuid", "uuid": meta["table-uuid"]},
            {"action": "upgrade-format-version", "format-version": meta["format-version"]},
            {"action": "add-schema", "schema": meta["schemas"][0]},
            {"action": "set-current-schema", "schema-id": -1},
            {"action": "add-spec", "spec": meta["partition-specs"][0]},
            {"action": "set-default-spec", "spec-id": -1},
            {"action": "add-sort-order", "sort-order": meta["sort-orders"][0]},
            {"action": "set-default-sort-order", "sort-order-id": -1},
            {"action": "set-location", "location": meta["location"]},
            {"action": "set-properties", "updates": {"created": "staged"}},
        ],
    }
    r = client.post("/v1/namespaces/cdc/tables/s", json=body, headers=W)
    assert r.status_code == 200, r.text
    assert client.get("/v1/namespaces/cdc/tables/s", headers=R).json()["metadata"]["properties"]["created"] == "staged"
    # a second create of the same table fails its assert-create
    r = client.post("/v1/namespaces/cdc/tables/s", json=body, headers=W)
    assert r.status_code == 409 and err(r)["type"] == "CommitFailedException"


def test_transaction_is_atomic(client: TestClient) -> None:
    m1 = make_table(client, name="t1")["metadata"]
    m2 = make_table(client, name="t2")["metadata"]

    def change(name: str, meta: dict[str, Any], schema_id: int) -> dict[str, Any]:
        return {
            "identifier": {"namespace": ["cdc"], "name": name},
            "requirements": [
                {"type": "assert-table-uuid", "uuid": meta["table-uuid"]},
                {"type": "assert-current-schema-id", "current-schema-id": schema_id},
            ],
            "updates": [{"action": "set-properties", "updates": {"tx": "1"}}],
        }

    bad = {"table-changes": [change("t1", m1, 0), change("t2", m2, 9)]}
    r = client.post("/v1/transactions/commit", json=bad, headers=W)
    assert r.status_code == 409 and err(r)["type"] == "CommitFailedException"
    props = [
        client.get(f"/v1/namespaces/cdc/tables/{t}", headers=R).json()["metadata"]["properties"] for t in ("t1", "t2")
    ]
    assert all("tx" not in p for p in props)
    good = {"table-changes": [change("t1", m1, 0), change("t2", m2, 0)]}
    assert client.post("/v1/transactions/commit", json=good, headers=W).status_code == 204
    props = [
        client.get(f"/v1/namespaces/cdc/tables/{t}", headers=R).json()["metadata"]["properties"] for t in ("t1", "t2")
    ]
    assert all(p["tx"] == "1" for p in props)
    assert client.post("/v1/transactions/commit", json={"table-changes": []}, headers=W).status_code == 400
    twice = {"table-changes": [change("t1", m1, 0), change("t1", m1, 0)]}
    assert client.post("/v1/transactions/commit", json=twice, headers=W).status_code == 400


# -- bad input


@pytest.mark.parametrize(
    "path",
    [
        "/v1/namespaces/%2E%2E",
        "/v1/namespaces/a%2Fb",
        "/v1/namespaces/a%00b",
        "/v1/namespaces/a%FF",
        "/v1/namespaces/a.b",
        "/v1/namespaces/cdc/tables/%2e%2e",
        "/v1/namespaces/cdc/tables/%2e%2e%2F%2e%2e%2Fetc",
        "/v1/namespaces/cdc/tables/a%5Cb",
        "/v1/namespaces/" + "x" * 300,
    ],
)
def test_bad_names(client: TestClient, path: str) -> None:
    r = client.get(path, headers=R)
    assert r.status_code == 400 and err(r)["type"] == "BadRequestException", r.text


def test_bad_names_in_bodies(client: TestClient) -> None:
    for ns in (["a/b"], [".."], ["a.b"], [], ["a\x00"]):
        r = client.post("/v1/namespaces", json={"namespace": ns}, headers=W)
        assert r.status_code == 400, ns
    client.post("/v1/namespaces", json={"namespace": ["cdc"]}, headers=W)
    for name in ("../escape", "..", "a/b"):
        r = client.post("/v1/namespaces/cdc/tables", json={"name": name, "schema": SCHEMA}, headers=W)
        assert r.status_code == 400, name
    r = client.post(
        "/v1/namespaces/cdc/tables", json={"name": "x", "schema": SCHEMA, "location": "file:///tmp/x"}, headers=W
    )
    assert r.status_code == 400 and "outside the warehouse" in err(r)["message"]


def test_malformed_and_huge_bodies(client: TestClient, settings: Settings) -> None:
    for raw in (b"{", b"[1, 2]", b"\xff\xfe", b"null", b"[" * 100_000, b'{"namespace": "cdc"}'):
        r = client.post("/v1/namespaces", content=raw, headers={**W, "content-type": "application/json"})
        assert r.status_code == 400, (raw[:20], r.text)
        err(r)
    huge = b'{"namespace": ["' + b"x" * settings.rest_max_body_bytes + b'"]}'
    r = client.post("/v1/namespaces", content=huge, headers=W)
    assert r.status_code == 413 and err(r)
    # no Content-Length (chunked): the stream is cut at the limit all the same

    def chunks() -> Iterator[bytes]:
        yield b'{"namespace": ["'
        for _ in range(settings.rest_max_body_bytes // 65536 + 2):
            yield b"x" * 65536

    r = client.post("/v1/namespaces", content=chunks(), headers=W)
    assert r.status_code == 413
    assert client.put("/v1/namespaces", headers=W).status_code == 405


def test_partitions_endpoints(client: TestClient, settings: Settings) -> None:
    spec = {"spec-id": 0, "fields": [{"source-id": 3, "field-id": 1000, "name": "day", "transform": "identity"}]}
    make_table(client, name="p", partition_spec=spec)
    cat = open_catalog(settings)
    t = cat.load_table(("cdc", "p"))
    import datetime

    rows = [{"id": i, "name": f"n{i}", "day": datetime.date(2024, 1, 1 + i % 3)} for i in range(10)]
    t.append(pa.Table.from_pylist(rows, schema=t.schema().as_arrow()))
    first = t.metadata.current_snapshot_id
    t.append(pa.Table.from_pylist(rows[:2], schema=t.schema().as_arrow()))
    listing = client.get("/v1/namespaces/cdc/tables/p/partitions", headers=R).json()
    assert sorted(p["partition"]["day"] for p in listing["partitions"]) == ["2024-01-01", "2024-01-02", "2024-01-03"]
    stats = client.get("/v1/namespaces/cdc/tables/p/partition-stats", headers=R).json()
    assert stats["totals"]["record-count"] == 12 and stats["totals"]["partition-count"] == 3
    assert stats["totals"]["file-count"] == sum(p["file-count"] for p in stats["partitions"]) > 3
    old = client.get("/v1/namespaces/cdc/tables/p/partition-stats", params={"snapshot-id": first}, headers=R).json()
    assert old["totals"]["record-count"] == 10 and old["snapshot-id"] == first
    assert (
        client.get("/v1/namespaces/cdc/tables/p/partitions", params={"snapshot-id": "x"}, headers=R).status_code == 400
    )
    assert client.get("/v1/namespaces/cdc/tables/p/partitions", params={"snapshot-id": 1}, headers=R).status_code == 400


# -- fuzz


def _mutate(rng: random.Random, value: Any, depth: int = 0) -> Any:
    weird = [None, 0, -1, 2**63, 1.5, "", "..", "a/b", "\x00", "x" * 1000, [], {}, [None], {"": None}, True]
    if depth > 4 or rng.random() < 0.25:
        return rng.choice(weird)
    if isinstance(value, dict) and value:
        out = dict(value)
        key = rng.choice(list(out))
        op = rng.random()
        if op < 0.3:
            del out[key]
        elif op < 0.5:
            out[rng.choice(["extra", "action", "type", "schema-id", key + "x"])] = rng.choice(weird)
        else:
            out[key] = _mutate(rng, out[key], depth + 1)
        return out
    if isinstance(value, list) and value:
        out_list = list(value)
        i = rng.randrange(len(out_list))
        out_list[i] = _mutate(rng, out_list[i], depth + 1)
        return out_list if rng.random() < 0.8 else out_list * 3
    return rng.choice(weird)


QUERY = ["parent", "pageToken", "pageSize", "snapshots", "purgeRequested", "snapshot-id", "warehouse"]


def test_fuzz_no_5xx(tmp_path: Path) -> None:
    rng = random.Random(20240611)
    settings = rest_settings(tmp_path)
    app = create_app(settings)
    routes = [(m, r.path) for r in app.routes if isinstance(r, Route) for m in sorted(r.methods or ()) if m != "HEAD"]
    segments = [
        "cdc",
        "cdc",
        "cdc",
        "t",
        "t",
        "t",
        "..",
        "%2F",
        "a%2Fb",
        "%00",
        "%FF",
        "cdc%1Ft",
        "%2e%2e",
        "x" * 300,
        "%",
        "%25",
        "名",
        "a.b",
    ]
    with TestClient(app) as c:
        meta = make_table(c)["metadata"]
        samples: list[Any] = [
            {"namespace": ["cdc2"], "properties": {"a": "b"}},
            {"name": "t9", "schema": SCHEMA, "stage-create": False},
            {"removals": ["a"], "updates": {"b": "c"}},
            {"source": {"namespace": ["cdc"], "name": "t"}, "destination": {"namespace": ["cdc"], "name": "t2"}},
            {"name": "r", "metadata-location": "file:///nope.metadata.json"},
            {
                "requirements": [{"type": "assert-table-uuid", "uuid": meta["table-uuid"]}],
                "updates": [
                    {"action": "set-properties", "updates": {"k": "v"}},
                    {"action": "add-schema", "schema": SCHEMA},
                    {"action": "set-snapshot-ref", "ref-name": "main", "type": "branch", "snapshot-id": 1},
                    {"action": "remove-snapshots", "snapshot-ids": [1]},
                    {"action": "add-spec", "spec": {"spec-id": 1, "fields": []}},
                ],
            },
            {"table-changes": [{"identifier": {"namespace": ["cdc"], "name": "t"}, "requirements": [], "updates": []}]},
        ]
        statuses: dict[int, int] = {}
        for _ in range(500):
            method, template = rng.choice(routes)
            path = re.sub(r"{(\w+)}", lambda _m: rng.choice(segments), template)
            params = {k: rng.choice(["", "-1", "0", "x", "cdc", "true", "%1F", "9" * 30]) for k in rng.sample(QUERY, 2)}
            kind = rng.random()
            if kind < 0.15:
                content = bytes(rng.getrandbits(8) for _ in range(rng.randrange(64)))
            elif kind < 0.25:
                content = json.dumps(rng.choice(samples)).encode()[: rng.randrange(1, 200)]
            else:
                content = json.dumps(_mutate(rng, copy.deepcopy(rng.choice(samples)))).encode()
            headers = rng.choice([W, W, W, W, W, R, {}, {"Authorization": "Bearer x"}])
            r = c.request(method, path, params=params, content=content, headers=headers)
            statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
            assert r.status_code < 500, (method, path, params, content[:300], r.text)
            if r.status_code >= 400 and r.content and path.startswith("/v1/") and "oauth" not in path:
                err(r)
        print("fuzz statuses", sorted(statuses.items()))
        assert sum(statuses.values()) == 500
        assert any(s < 300 for s in statuses) and any(s == 400 for s in statuses)


# -- pyiceberg's RestCatalog against a real server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Settings]]:
    settings = rest_settings(tmp_path_factory.mktemp("rest-server"))
    with serve(settings) as (url, _app):
        yield url, settings


@pytest.mark.server
def test_pyiceberg_end_to_end(server: tuple[str, Settings]) -> None:
    from pyiceberg.exceptions import ForbiddenError, NamespaceNotEmptyError, NoSuchTableError
    from pyiceberg.types import LongType

    url, settings = server
    cat = rest_catalog(url)
    cat.create_namespace("e2e", {"owner": "tests"})
    assert ("e2e",) in cat.list_namespaces() and cat.namespace_exists("e2e")
    assert cat.load_namespace_properties("e2e")["owner"] == "tests"
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("v", pa.string())])
    t = cat.create_table("e2e.items", schema=schema)
    t.append(pa.table({"id": pa.array([1, 2, 3], pa.int64()), "v": ["a", "b", "c"]}, schema=schema))
    first = t.metadata.current_snapshot_id
    t.overwrite(pa.table({"id": pa.array([4, 5], pa.int64()), "v": ["d", "e"]}, schema=schema))
    t.delete("id == 4")
    with t.update_schema() as upd:
        upd.add_column("n", LongType())
    t2 = cat.load_table("e2e.items")
    t2.append(pa.table({"id": [6], "v": ["f"], "n": [60]}, schema=t2.schema().as_arrow()))
    rows = sorted(cat.load_table("e2e.items").scan().to_arrow().to_pylist(), key=lambda r: r["id"])
    assert rows == [{"id": 5, "v": "e", "n": None}, {"id": 6, "v": "f", "n": 60}]
    old = cat.load_table("e2e.items").scan(snapshot_id=first).to_arrow()
    assert sorted(old.column("id").to_pylist()) == [1, 2, 3]
    # the pipeline's SqlCatalog sees the same table
    direct = open_catalog(settings).load_table(("e2e", "items"))
    assert direct.metadata_location == cat.load_table("e2e.items").metadata_location
    # a create transaction (stage-create + assert-create commit)
    with cat.create_table_transaction("e2e.staged", schema=schema) as tx:
        tx.set_properties(made="in-tx")
    assert cat.load_table("e2e.staged").properties["made"] == "in-tx"
    cat.rename_table("e2e.staged", "e2e.renamed")
    assert cat.table_exists("e2e.renamed") and not cat.table_exists("e2e.staged")
    with pytest.raises(NamespaceNotEmptyError):
        cat.drop_namespace("e2e")
    assert sorted(cat.list_tables("e2e")) == [("e2e", "items"), ("e2e", "renamed")]
    summary = cat.update_namespace_properties("e2e", removals={"owner", "nope"}, updates={"team": "data"})
    assert (summary.removed, summary.updated, summary.missing) == (["owner"], ["team"], ["nope"])
    loc = cat.load_table("e2e.renamed").metadata_location
    cat.drop_table("e2e.renamed")
    assert cat.register_table("e2e.again", loc).metadata_location == loc
    cat.purge_table("e2e.again")
    with pytest.raises(NoSuchTableError):
        cat.load_table("e2e.again")
    cat.create_namespace("e2e_empty")
    cat.drop_namespace("e2e_empty")
    assert not cat.namespace_exists("e2e_empty")
    # a read-only client reads, and is refused writes
    ro = rest_catalog(url, credential="reader:rsecret")
    assert ro.load_table("e2e.items").scan().to_arrow().num_rows == 2
    with pytest.raises(ForbiddenError):
        ro.create_namespace("nope")


@pytest.mark.server
def test_raw_dot_segments(server: tuple[str, Settings]) -> None:
    """Literal ``..`` as sent on the wire (HTTP clients usually normalize it away first)."""
    url, _ = server
    host, port = url.removeprefix("http://").split(":")
    for path in ("/v1/namespaces/..", "/v1/namespaces/cdc/tables/..", "/v1/namespaces/../tables/x"):
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            req = f"GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer static-reader\r\nConnection: close\r\n\r\n"
            sock.sendall(req.encode())
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 400"), (path, head)
        assert json.loads(body)["error"]["type"] == "BadRequestException"


@pytest.mark.server
def test_concurrent_appends_conflict_and_retry(server: tuple[str, Settings]) -> None:
    """Two clients append to one table at once: one commit loses the compare-and-swap (409), the
    client refreshes and retries, and every row lands."""
    url, _ = server
    a, b = rest_catalog(url), rest_catalog(url)
    a.create_namespace_if_not_exists("conc")
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("who", pa.string())])
    a.create_table("conc.t", schema=schema, properties={"commit.retry.min-wait-ms": "10"})
    before = counter(url, "cdclake_rest_commit_conflicts_total")
    rounds, per = 4, 25
    errors: list[BaseException] = []

    def writer(cat: Any, who: str, barrier: threading.Barrier, rnd: int) -> None:
        try:
            t = cat.load_table("conc.t")
            barrier.wait(10)  # both hold the same base snapshot before either commits
            ids = [rnd * 1000 + i + (500 if who == "b" else 0) for i in range(per)]
            t.append(pa.table({"id": pa.array(ids, pa.int64()), "who": [who] * per}, schema=schema))
        except BaseException as exc:
            errors.append(exc)

    for rnd in range(rounds):
        barrier = threading.Barrier(2)
        threads = [threading.Thread(target=writer, args=(c, w, barrier, rnd)) for c, w in ((a, "a"), (b, "b"))]
        for th in threads:
            th.start()
        for th in threads:
            th.join(60)
    assert not errors, errors
    table = a.load_table("conc.t")
    ids = table.scan().to_arrow().column("id").to_pylist()
    assert len(ids) == len(set(ids)) == rounds * 2 * per
    assert len(table.metadata.snapshots) == rounds * 2
    conflicts = counter(url, "cdclake_rest_commit_conflicts_total") - before
    assert conflicts >= rounds, conflicts
