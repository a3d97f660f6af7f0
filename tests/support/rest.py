"""The REST catalog (restcatalog/) for tests: tokens, settings, a real server in a thread, a
pyiceberg client, and small request helpers."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from starlette.testclient import TestClient

from cdclake.config.settings import Settings
from restcatalog.app import create_app
from tests.support import make_settings
from tests.support.threaded import serve_app

TOKENS = """
[[client]]
id = "writer"
access = "write"
secret = "wsecret"
token = "static-writer"

[[client]]
id = "reader"
access = "read"
secret = "rsecret"
token = "static-reader"
"""
W = {"Authorization": "Bearer static-writer"}
R = {"Authorization": "Bearer static-reader"}

SCHEMA: dict[str, Any] = {
    "type": "struct",
    "schema-id": 0,
    "fields": [
        {"id": 1, "name": "id", "type": "long", "required": True},
        {"id": 2, "name": "name", "type": "string", "required": False},
        {"id": 3, "name": "day", "type": "date", "required": False},
    ],
}


def rest_settings(home: Path, tokens: bool = True, **overrides: Any) -> Settings:
    extra: dict[str, Any] = {}
    if tokens:
        path = home / "rest-tokens.toml"
        home.mkdir(parents=True, exist_ok=True)
        path.write_text(TOKENS)
        extra["rest_tokens_file"] = path
    return make_settings(home, **extra, **overrides)


@contextlib.contextmanager
def serve(settings: Settings, timeout_s: float = 20.0) -> Iterator[tuple[str, Any]]:
    """The REST catalog of ``settings`` on a real server (:func:`tests.support.threaded.serve_app`)."""
    app = create_app(settings)
    with serve_app(app, timeout_s) as url:
        yield url, app


def rest_catalog(url: str, credential: str | None = "writer:wsecret", **props: str) -> Any:
    from pyiceberg.catalog.rest import RestCatalog

    extra = {"credential": credential, "oauth2-server-uri": f"{url}/v1/oauth/tokens"} if credential else {}
    return RestCatalog("lake", uri=url, **extra, **props)


def counter(url_or_client: Any, name: str) -> float:
    text = (
        url_or_client.get("/metrics").text
        if isinstance(url_or_client, TestClient)
        else __import__("httpx").get(f"{url_or_client}/metrics").text
    )
    return sum(float(m.group(1)) for m in re.finditer(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M))


def err(resp: Any) -> dict[str, Any]:
    body = resp.json()
    assert set(body) == {"error"}, body
    assert set(body["error"]) == {"message", "type", "code"}, body
    assert body["error"]["code"] == resp.status_code
    return dict(body["error"])


def make_table(c: TestClient, ns: str = "cdc", name: str = "t", **extra: Any) -> dict[str, Any]:
    """A table with SCHEMA; ``extra`` joins the create request (``partition_spec`` -> ``partition-spec``)."""
    extra = {k.replace("_", "-"): v for k, v in extra.items()}
    if c.head(f"/v1/namespaces/{ns}", headers=W).status_code == 404:
        assert c.post("/v1/namespaces", json={"namespace": [ns]}, headers=W).status_code == 200
    r = c.post(f"/v1/namespaces/{ns}/tables", json={"name": name, "schema": SCHEMA, **extra}, headers=W)
    assert r.status_code == 200, r.text
    return dict(r.json())


def set_props(c: TestClient, path: str, meta: dict[str, Any], props: dict[str, str]) -> Any:
    body = {
        "requirements": [{"type": "assert-table-uuid", "uuid": meta["table-uuid"]}],
        "updates": [{"action": "set-properties", "updates": props}],
    }
    return c.post(path, json=body, headers=W)


# -- a table written beside the REST catalog (pyiceberg on the same SQL catalog), and what it holds

ROWS = [{"id": 1, "name": "ada"}, {"id": 2, "name": "bob"}]


def sql_catalog(settings: Settings) -> Any:
    """A fresh pyiceberg SqlCatalog on the REST catalog's database: a writer beside the server."""
    from pyiceberg.catalog.sql import SqlCatalog

    return SqlCatalog(
        settings.catalog_name, uri=settings.catalog_db_url, warehouse=settings.warehouse, schema_version="v1"
    )


def seed_table(settings: Settings, ident: tuple[str, ...], location: str | None = None) -> Any:
    """``ident`` made with pyiceberg's SqlCatalog (as the pipeline's writers do, not through the
    REST catalog), holding :data:`ROWS`."""
    import pyarrow as pa

    cat = sql_catalog(settings)
    if not cat.namespace_exists(ident[:-1]):
        cat.create_namespace(ident[:-1])
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("name", pa.string())])
    table = cat.create_table(ident, schema=schema, **({"location": location} if location else {}))
    table.append(pa.Table.from_pylist(ROWS, schema=schema))
    return table


def files_under(uri: str) -> dict[str, int]:
    """Every file below a ``file://`` folder, with its size."""
    root = Path(uri.removeprefix("file://"))
    return {str(p): p.stat().st_size for p in sorted(root.rglob("*")) if p.is_file()}


def rows_of(settings: Settings, ident: tuple[str, ...]) -> list[dict[str, Any]]:
    """The table's rows as a fresh pyiceberg SqlCatalog reads them."""
    cat = sql_catalog(settings)
    return sorted(cat.load_table(ident).scan().to_arrow().to_pylist(), key=lambda r: r["id"])
