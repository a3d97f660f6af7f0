"""Every location a REST catalog client gives must name a place inside the warehouse, one way only
(issue 13, finding 7).

``file://<home>/outside/..%2Fwarehouse/t1`` decodes and normalises to a path inside the warehouse,
but pyiceberg (and Iceberg's FileIOs) write the literal path: a folder named ``..%2Fwarehouse``
under ``outside``. So a location is refused (400 naming the field) when either reading is outside
the warehouse, or when it has encoded separators or dot segments at all."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from starlette.testclient import TestClient

from cdclake.config.settings import Settings
from restcatalog.app import create_app
from tests.support.rest import SCHEMA, W, err, make_table, rest_catalog, rest_settings, serve, set_props

# Iceberg honours these table properties as places to write (Java: LocationProviders, the
# deprecated folder/object-storage paths; pyiceberg: write.data.path, write.metadata.path).
PATH_PROPERTIES = ("write.metadata.path", "write.data.path", "write.object-storage.path", "write.folder-storage.path")


@pytest.fixture()
def settings(tmp_path: Path) -> Settings:
    return rest_settings(tmp_path)


@pytest.fixture()
def client(settings: Settings) -> Any:
    with TestClient(create_app(settings)) as c:
        yield c


def home_of(settings: Settings) -> Path:
    return Path(settings.warehouse.removeprefix("file://")).parent


def escape(settings: Settings, tail: str) -> str:
    """Decodes to ``<warehouse>/<tail>``; written literally, it is under ``<home>/outside``."""
    return f"file://{home_of(settings)}/outside/..%2Fwarehouse/{tail}"


def nothing_outside(settings: Settings) -> None:
    home = home_of(settings)
    strays = [p for p in home.rglob("*") if p.is_file() and "outside" in p.parts]
    assert not (home / "outside").exists(), f"written outside the warehouse: {strays}"


def refused(r: Any, field: str) -> None:
    assert r.status_code == 400, r.text
    assert err(r)["type"] == "BadRequestException"
    assert field in err(r)["message"], err(r)["message"]


def test_create_refuses_an_escaping_location(client: TestClient, settings: Settings) -> None:
    client.post("/v1/namespaces", json={"namespace": ["cdc"]}, headers=W)
    for stage in (False, True):
        body = {"name": "t1", "schema": SCHEMA, "location": escape(settings, "t1"), "stage-create": stage}
        refused(client.post("/v1/namespaces/cdc/tables", json=body, headers=W), "location")
    assert client.head("/v1/namespaces/cdc/tables/t1", headers=W).status_code == 404
    nothing_outside(settings)


@pytest.mark.parametrize("prop", PATH_PROPERTIES)
def test_create_refuses_an_escaping_path_property(client: TestClient, settings: Settings, prop: str) -> None:
    client.post("/v1/namespaces", json={"namespace": ["cdc"]}, headers=W)
    body = {"name": "t1", "schema": SCHEMA, "properties": {prop: escape(settings, "t1/x")}}
    refused(client.post("/v1/namespaces/cdc/tables", json=body, headers=W), prop)
    nothing_outside(settings)


@pytest.mark.parametrize("prop", PATH_PROPERTIES)
def test_commit_refuses_an_escaping_path_property(client: TestClient, settings: Settings, prop: str) -> None:
    created = make_table(client)
    path = "/v1/namespaces/cdc/tables/t"
    refused(set_props(client, path, created["metadata"], {prop: escape(settings, "t/x")}), prop)
    assert client.get(path, headers=W).json()["metadata-location"] == created["metadata-location"]
    nothing_outside(settings)


def test_commit_refuses_an_escaping_set_location(client: TestClient, settings: Settings) -> None:
    created = make_table(client)
    path = "/v1/namespaces/cdc/tables/t"
    body = {"updates": [{"action": "set-location", "location": escape(settings, "t")}]}
    refused(client.post(path, json=body, headers=W), "location")
    # the same inside a multi-table transaction
    change = {"identifier": {"namespace": ["cdc"], "name": "t"}, **body}
    refused(client.post("/v1/transactions/commit", json={"table-changes": [change]}, headers=W), "location")
    assert client.get(path, headers=W).json()["metadata-location"] == created["metadata-location"]
    nothing_outside(settings)


def test_register_refuses_metadata_outside_or_pointing_outside(client: TestClient, settings: Settings) -> None:
    created = make_table(client)
    own = Path(created["metadata-location"].removeprefix("file://"))
    # A metadata file really at the literal path: only the location check can refuse it.
    literal = home_of(settings) / "outside" / "..%2Fwarehouse" / "x" / "metadata" / own.name
    literal.parent.mkdir(parents=True)
    shutil.copy(own, literal)
    body = {"name": "x", "metadata-location": escape(settings, f"x/metadata/{own.name}")}
    refused(client.post("/v1/namespaces/cdc/register", json=body, headers=W), "metadata-location")
    shutil.rmtree(home_of(settings) / "outside")
    # A metadata file inside the warehouse whose table location (or a path property) is elsewhere.
    for field, change in (
        ("location", {"location": escape(settings, "y")}),
        ("write.metadata.path", {"properties": {"write.metadata.path": escape(settings, "y")}}),
    ):
        doc = json.loads(own.read_text())
        for k, v in change.items():
            doc[k] = {**doc[k], **v} if isinstance(v, dict) else v
        planted = own.parent / f"planted-{field}.metadata.json"
        planted.write_text(json.dumps(doc))
        body = {"name": "y", "metadata-location": planted.as_uri()}
        refused(client.post("/v1/namespaces/cdc/register", json=body, headers=W), field)
    assert client.head("/v1/namespaces/cdc/tables/y", headers=W).status_code == 404
    nothing_outside(settings)


def test_encoded_separators_and_dot_segments_are_refused_even_inside(client: TestClient, settings: Settings) -> None:
    client.post("/v1/namespaces", json={"namespace": ["cdc"]}, headers=W)
    wh = settings.warehouse
    for bad in (
        f"{wh}/cdc/a/../b",  # resolves inside, but names one place two ways
        f"{wh}/cdc/./b",
        f"{wh}/cdc/%2E%2E/b",
        f"{wh}/cdc/%2e/b",
        f"{wh}/cdc/a%2Fb",
        f"{wh}/cdc/a%2fb",
        f"{wh}/cdc/a%5Cb",
        f"{wh}/cdc/a\\b",
        f"{wh}/cdc/a%252Fb",  # encoded twice
        f"{wh}/cdc/b?x=1",
        f"{wh}/cdc/b#frag",
    ):
        body = {"name": "b", "schema": SCHEMA, "location": bad}
        refused(client.post("/v1/namespaces/cdc/tables", json=body, headers=W), "location")
        body = {"name": "b", "schema": SCHEMA, "properties": {"write.data.path": bad}}
        refused(client.post("/v1/namespaces/cdc/tables", json=body, headers=W), "write.data.path")
    # Ordinary places inside the warehouse stay allowed.
    for i, good in enumerate((f"{wh}/elsewhere/t", f"{wh}/cdc/my table", f"{wh}/cdc/50%off")):
        body = {"name": f"ok{i}", "schema": SCHEMA, "location": good, "properties": {"write.data.path": good + "/d"}}
        r = client.post("/v1/namespaces/cdc/tables", json=body, headers=W)
        assert r.status_code == 200, (good, r.text)
    nothing_outside(settings)


@pytest.mark.server
def test_pyiceberg_client_cannot_write_outside(tmp_path: Path) -> None:
    """The same through pyiceberg's RestCatalog against a served catalog."""
    from pyiceberg.exceptions import BadRequestError

    settings = rest_settings(tmp_path)
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False)])
    with serve(settings) as (url, _app):
        cat = rest_catalog(url)
        cat.create_namespace("cdc")
        with pytest.raises(BadRequestError, match="location"):
            cat.create_table("cdc.t1", schema=schema, location=escape(settings, "t1"))
        t = cat.create_table("cdc.t2", schema=schema)
        with pytest.raises(BadRequestError, match=r"write\.metadata\.path"), t.transaction() as tx:
            tx.set_properties({"write.metadata.path": escape(settings, "t2/metadata")})
        t.append(pa.table({"id": pa.array([1], pa.int64())}, schema=schema))
    nothing_outside(settings)


def test_namespace_location_is_confined(client: TestClient, settings: Settings) -> None:
    """A namespace's ``location`` property is where its tables go by default."""
    refused(
        client.post(
            "/v1/namespaces", json={"namespace": ["n1"], "properties": {"location": escape(settings, "n1")}}, headers=W
        ),
        "location",
    )
    client.post("/v1/namespaces", json={"namespace": ["n2"]}, headers=W)
    r = client.post("/v1/namespaces/n2/properties", json={"updates": {"location": escape(settings, "n2")}}, headers=W)
    refused(r, "location")
    nothing_outside(settings)
