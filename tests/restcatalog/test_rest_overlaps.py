"""No table's places overlap another live table's (issue 28: the REST catalog's write rights).

A write client limited to ``cdc.mine*`` once registered a table over another table's metadata
(reading its rows), purged that alias (deleting every file of the other table), and created a
table in another table's folder (whose orphan clean-up then took the other's files for orphans).
Here the victim, ``cdc.employees``, is written beside the server with pyiceberg, in a folder not
named after it (``hr/emp-files``): a refusal must not name it. After each attempt its files are
all still on disk and its rows read back with a fresh pyiceberg catalog."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from cdclake.config.settings import Settings
from restcatalog.app import create_app
from tests.support import make_settings
from tests.support.rest import (
    ROWS,
    SCHEMA,
    TOKENS,
    W,
    err,
    files_under,
    make_table,
    rows_of,
    seed_table,
    sql_catalog,
)

MINE_TOKENS = '[[client]]\nid = "mine"\naccess = "write"\ntoken = "static-mine"\ntables = ["cdc.mine*"]\n'
MINE = {"Authorization": "Bearer static-mine"}
VICTIM = ("cdc", "employees")
T = "/v1/namespaces/cdc/tables"


@pytest.fixture()
def settings(tmp_path: Path) -> Settings:
    path = tmp_path / "rest-tokens.toml"
    path.write_text(TOKENS + MINE_TOKENS)
    return make_settings(tmp_path, rest_tokens_file=path)


@pytest.fixture()
def victim(settings: Settings) -> Any:
    return seed_table(settings, VICTIM, location=settings.warehouse + "/hr/emp-files")


@pytest.fixture()
def client(settings: Settings, victim: Any) -> Iterator[TestClient]:
    with TestClient(create_app(settings)) as c:
        yield c


class Intact:
    """The victim as it was: every file (and its size) still there, its rows still read."""

    def __init__(self, settings: Settings, victim: Any) -> None:
        self.settings, self.files = settings, files_under(victim.location())
        self.location = victim.location()
        assert self.files and rows_of(settings, VICTIM) == ROWS

    def check(self) -> None:
        assert files_under(self.location) == self.files
        assert rows_of(self.settings, VICTIM) == ROWS


def refused(r: Any, field: str) -> None:
    assert r.status_code == 400, r.text
    message = err(r)["message"]
    assert err(r)["type"] == "BadRequestException" and message.startswith(field + " "), message
    assert "another live table's" in message, message  # the rule, not some other refusal
    assert "employees" not in message, "the refusal named a table the client may not read"


def test_register_over_a_live_table_s_metadata_is_refused(client: TestClient, settings: Settings, victim: Any) -> None:
    intact = Intact(settings, victim)
    body = {"name": "mine_reg", "metadata-location": victim.metadata_location}
    refused(client.post("/v1/namespaces/cdc/register", json=body, headers=MINE), "metadata-location")
    # No one registers an alias: the unrestricted writer neither.
    refused(client.post("/v1/namespaces/cdc/register", json=body, headers=W), "metadata-location")
    assert client.head(f"{T}/mine_reg", headers=W).status_code == 404
    # A copy of the metadata in a folder of its own still names the victim's folder as its location.
    copy = Path(settings.warehouse.removeprefix("file://")) / "cdc" / "mine_cp" / "metadata" / "00000-cp.metadata.json"
    copy.parent.mkdir(parents=True)
    shutil.copy(victim.metadata_location.removeprefix("file://"), copy)
    body = {"name": "mine_cp", "metadata-location": copy.as_uri()}
    refused(client.post("/v1/namespaces/cdc/register", json=body, headers=MINE), "location")
    intact.check()


def test_a_purge_leaves_the_files_of_a_table_that_shares_them(
    client: TestClient, settings: Settings, victim: Any
) -> None:
    """An alias made before the rule (or by a writer beside the server) shares every file: its
    purge deletes none of them."""
    intact = Intact(settings, victim)
    sql_catalog(settings).register_table(("cdc", "mine_alias"), victim.metadata_location)
    assert client.delete(f"{T}/mine_alias", params={"purgeRequested": "true"}, headers=MINE).status_code == 204
    assert client.head(f"{T}/mine_alias", headers=W).status_code == 404
    intact.check()


def test_a_purge_deletes_only_under_the_dropped_table_s_own_places(
    client: TestClient, settings: Settings, victim: Any
) -> None:
    """A table of its own folder whose manifests name another table's files (a copy of its
    metadata, moved): the purge deletes its own metadata file, none of the files it names."""
    intact = Intact(settings, victim)
    own = settings.warehouse + "/cdc/mine_copy"
    doc = json.loads(Path(victim.metadata_location.removeprefix("file://")).read_text())
    doc["location"] = own
    planted = Path(own.removeprefix("file://")) / "metadata" / "00000-copy.metadata.json"
    planted.parent.mkdir(parents=True)
    planted.write_text(json.dumps(doc))
    body = {"name": "mine_copy", "metadata-location": planted.as_uri()}
    assert client.post("/v1/namespaces/cdc/register", json=body, headers=MINE).status_code == 200
    assert client.delete(f"{T}/mine_copy", params={"purgeRequested": "true"}, headers=MINE).status_code == 204
    assert not planted.exists()
    intact.check()


def test_a_table_may_not_squat_another_s_place(client: TestClient, settings: Settings, victim: Any) -> None:
    intact = Intact(settings, victim)
    wh, there = settings.warehouse, victim.location()
    client.post("/v1/namespaces", json={"namespace": ["cdc"]}, headers=W)
    for where in (there, there + "/", there + "/data", wh + "/hr/EMP-FILES", wh + "/hr/emp%2Dfiles", wh + "/hr", wh):
        for stage in (False, True):
            body = {"name": "mine_sq", "schema": SCHEMA, "location": where, "stage-create": stage}
            refused(client.post(T, json=body, headers=MINE), "location")
    for key in ("write.data.path", "write.metadata.path", "write.object-storage.path"):
        body = {"name": "mine_sq", "schema": SCHEMA, "properties": {key: there + "/data"}}
        refused(client.post(T, json=body, headers=MINE), key)
    assert client.head(f"{T}/mine_sq", headers=W).status_code == 404
    # Apart by path segments: a neighbour whose name starts with the victim's folder's is fine.
    body = {"name": "mine_next", "schema": SCHEMA, "location": there + "2"}
    assert client.post(T, json=body, headers=MINE).status_code == 200
    intact.check()


def test_a_commit_may_not_move_a_table_into_another_s_place(
    client: TestClient, settings: Settings, victim: Any
) -> None:
    intact = Intact(settings, victim)
    first = make_table(client, "cdc", "mine_a")["metadata-location"]
    there = victim.location()
    moves = [
        ("location", [{"action": "set-location", "location": there}]),
        ("write.data.path", [{"action": "set-properties", "updates": {"write.data.path": there + "/data"}}]),
    ]
    for field, updates in moves:
        refused(client.post(f"{T}/mine_a", json={"updates": updates}, headers=MINE), field)
        change = {"identifier": {"namespace": ["cdc"], "name": "mine_a"}, "updates": updates}
        refused(client.post("/v1/transactions/commit", json={"table-changes": [change]}, headers=MINE), field)
    # Two tables of one transaction may not end up in one place either.
    make_table(client, "cdc", "mine_b")
    both = [
        {"identifier": {"namespace": ["cdc"], "name": n}, "updates": [{"action": "set-location", "location": loc}]}
        for n, loc in (("mine_a", settings.warehouse + "/cdc/shared"), ("mine_b", settings.warehouse + "/cdc/shared/b"))
    ]
    refused(client.post("/v1/transactions/commit", json={"table-changes": both}, headers=MINE), "location")
    assert client.get(f"{T}/mine_a", headers=W).json()["metadata-location"] == first
    intact.check()


def test_creates_at_once_take_a_place_once(client: TestClient, settings: Settings) -> None:
    """The check and the write that takes the place are one step: of creates racing for one
    folder, one lands."""
    from concurrent.futures import ThreadPoolExecutor

    client.post("/v1/namespaces", json={"namespace": ["cdc"]}, headers=W)
    where = settings.warehouse + "/cdc/contested"

    def create(i: int) -> int:
        body = {"name": f"mine_{i}", "schema": SCHEMA, "location": where}
        return int(client.post(T, json=body, headers=MINE).status_code)

    with ThreadPoolExecutor(6) as pool:
        codes = sorted(pool.map(create, range(6)))
    assert codes == [200] + [400] * 5


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ("file:///wh/cdc/t", "file:///wh/cdc/t2", False),  # by path segments, not by prefix
        ("file:///wh/cdc/t", "file:///wh/cdc/t/data", True),
        ("file:///wh/cdc/t/", "file:///wh/cdc/t", True),
        ("file:///wh", "file:///wh/cdc/t", True),
        ("/wh/cdc/t", "file:///wh/cdc/t", True),
        ("file:///wh/cdc/T", "file:///wh/cdc/t", True),  # a case-insensitive store makes them one
        ("file:///wh/cdc/%74", "file:///wh/cdc/t", True),  # one reading decodes to the other
        ("s3://b/wh/t", "s3a://b/wh/t/x", True),
        ("s3://b/wh/t", "s3://c/wh/t", False),
        ("s3://b/wh/t", "file:///wh/t", False),
    ],
)
def test_the_overlap_rule(a: str, b: str, expected: bool) -> None:
    from cdclake.lake.placement import overlap

    assert overlap(a, b) is expected and overlap(b, a) is expected
