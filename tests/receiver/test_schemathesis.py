"""schemathesis against the receiver's and the REST catalog's ``/openapi.json``: each served by a
real uvicorn on a free 127.0.0.1 port, every documented operation fuzzed with valid and invalid
input (derandomized, bounded). No answer is a 5xx, and no body shows a filesystem path (the
test's state folder, the project, the Python installation) or a traceback. The REST catalog's
table locations inside the warehouse are the protocol's data, not a leak.

``CDCLAKE_SCHEMATHESIS_EXAMPLES`` raises the examples per operation and mode (default 25)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.core.result import Err
from starlette.testclient import TestClient

from cdclake.config.settings import PROJECT_ROOT, Settings, load
from receiver import openapi as receiver_openapi
from restcatalog import openapi as rest_openapi
from tests.support import make_settings
from tests.support.threaded import serve_app

EXAMPLES = int(os.environ.get("CDCLAKE_SCHEMATHESIS_EXAMPLES", "25"))
PHASES = list(Phase) if os.environ.get("CDCLAKE_SCHEMATHESIS_SHRINK") else [Phase.explicit, Phase.reuse, Phase.generate]
PRODUCER_TOKEN = "fuzz-producer-token"
REST_TOKEN = "fuzz-writer-token"


def labels(doc: dict[str, Any]) -> list[str]:
    out = []
    for r in schemathesis.openapi.from_dict(doc).get_all_operations():
        if isinstance(r, Err):
            raise r.err()
        out.append(r.ok().label)
    return out


# The operation list comes from the documents themselves (settings only shape descriptions).
RECEIVER_OPS = labels(receiver_openapi.document(load({})))
REST_OPS = labels(rest_openapi.document())
# Its only behaviour without an Airflow is the documented 502 "Airflow refused or is down", and
# it takes no input to fuzz; debouncing it is tested where it is built.
NOT_FUZZED = {"POST /flush"}
# An endless stream for any valid request; its checks are GET /v1/changes's (fuzzed), the stream
# itself is tested in tests/restcatalog/test_changes_api.py.
NOT_FUZZED |= {"GET /v1/subscribe"}
# Need a Spark engine: fuzzed on their own with an in-process session (test_query_api_openapi).
QUERY_OPS = ("POST /v1/query", "POST /v1/query/plan")


def leaks(text: str, settings: Settings) -> list[str]:
    """Filesystem paths (and tracebacks) in a response body; the warehouse's own locations are
    allowed (the REST protocol hands table locations to clients)."""
    for wh in (settings.warehouse, settings.warehouse.removeprefix("file://")):
        text = text.replace(wh.rstrip("/"), "<warehouse>")
    needles = {
        str(settings.home),
        settings.home.as_uri(),
        str(PROJECT_ROOT),
        sys.prefix,
        "site-packages",
        "Traceback (most recent call last)",
    }
    return sorted(n for n in needles if n in text)


@dataclass(frozen=True)
class Finding:
    """A failure the fuzz found on the base commit: its own strict-xfail test below reproduces it
    deterministically, and the fuzz passes over exactly this answer so that it keeps looking for
    new failures on the same operation."""

    label: str
    matches: Callable[[Any], bool]
    note: str


# Found by this fuzz on d7b74d3 and fixed since (each has its own regression test below): an
# ack's persistedPath and /status showed the absolute staging folder; a REST create-table field
# with an initial-default of no valid type was a 500. None is known now.
FINDINGS: list[Finding] = []


def fuzz(schema: Any, label: str, base_url: str, headers: dict[str, str], settings: Settings) -> None:
    operation = schema.find_operation_by_label(label)
    cases = st.one_of(operation.as_strategy(GenerationMode.POSITIVE), operation.as_strategy(GenerationMode.NEGATIVE))
    known = [f for f in FINDINGS if f.label == label]

    @hsettings(
        max_examples=EXAMPLES,
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
        # CI runs the examples only; the long run (CDCLAKE_SCHEMATHESIS_SHRINK=1) also shrinks.
        phases=PHASES,
    )
    @given(case=cases)
    def run(case: Any) -> None:
        response = case.call(base_url=base_url, headers=headers, timeout=30)
        if any(f.matches(response) for f in known):
            return
        problems = [f"HTTP {response.status_code}"] if response.status_code >= 500 else []
        problems += [f"body shows {p!r}" for p in leaks(response.text, settings)]
        assert not problems, (
            f"{label}: {', '.join(problems)}\n  request: {case.as_curl_command(base_url=base_url)}\n"
            f"  response: {response.status_code} {response.text[:400]}"
        )

    run()


def producer_tokens(home: Path) -> Path:
    path = home / "tokens.toml"
    path.write_text(f'[[producer]]\nid = "fz"\ntoken = "{PRODUCER_TOKEN}"\ntables = ["*"]\n')
    return path


@pytest.fixture(scope="module", params=["open", "tokens"])
def receiver(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The receiver as the embedded default runs it (no tokens) and with a tokens file."""
    from cdclake.dev.stack import free_port
    from receiver.app import create_app

    home = tmp_path_factory.mktemp(f"schemathesis-receiver-{request.param}")
    extra = {"tokens_file": producer_tokens(home)} if request.param == "tokens" else {}
    # No Airflow listens on airflow_port: nothing the fuzz sends may depend on one.
    settings = make_settings(home, rate_limit_per_s=0.0, airflow_port=free_port(), **extra)
    headers = {"Authorization": f"Bearer {PRODUCER_TOKEN}"} if extra else {}
    with serve_app(create_app(settings), log_level="critical") as url:
        schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
        yield schema, url, headers, settings


@pytest.fixture(scope="module", params=["all", "scoped"])
def rest(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A write client of every table, and one whose ``tables`` patterns cover some names only
    (the rights checks of restcatalog/rights.py on the fuzzed names)."""
    from restcatalog.app import create_app

    home = tmp_path_factory.mktemp(f"schemathesis-rest-{request.param}")
    tokens = home / "rest-tokens.toml"
    scoped = 'tables = ["a*.*", "*.?", "n[0-9]*.t*"]\n' if request.param == "scoped" else ""
    tokens.write_text(f'[[client]]\nid = "w"\naccess = "write"\nsecret = "s"\ntoken = "{REST_TOKEN}"\n{scoped}')
    settings = make_settings(home, rest_tokens_file=tokens)
    with serve_app(create_app(settings), log_level="critical") as url:
        schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
        yield schema, url, {"Authorization": f"Bearer {REST_TOKEN}"}, settings


def cases(ops: list[str]) -> list[str]:
    return [op for op in ops if op not in NOT_FUZZED]


@pytest.mark.parametrize("label", cases(RECEIVER_OPS))
@pytest.mark.server
def test_receiver_openapi(receiver: Any, label: str) -> None:
    schema, url, headers, settings = receiver
    fuzz(schema, label, url, headers, settings)


@pytest.mark.parametrize("label", [op for op in cases(REST_OPS) if op not in QUERY_OPS])
@pytest.mark.server
def test_rest_catalog_openapi(rest: Any, label: str) -> None:
    schema, url, headers, settings = rest
    fuzz(schema, label, url, headers, settings)


@pytest.mark.server
@pytest.mark.spark
def test_query_api_openapi(spark: Any, connect_url: str, spark_home: Path) -> None:
    """The query API with an engine: each request a new session of a Spark Connect server in the
    test's JVM (tests/support/query.py), reading through the served catalog."""
    from tests.support import fresh_settings
    from tests.support.query import query_api

    settings = fresh_settings(spark_home)
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {settings.catalog_name}.{settings.namespace}")
    with query_api(settings, connect_url) as url:
        schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
        for op in QUERY_OPS:
            fuzz(schema, op, url, {}, settings)


# -- the findings, each reproduced deterministically (in-process, the same settings as the fuzz)


@pytest.fixture()
def open_receiver(tmp_path: Path) -> Iterator[tuple[TestClient, Settings]]:
    from receiver.app import create_app

    settings = make_settings(tmp_path, rate_limit_per_s=0.0)
    with TestClient(create_app(settings)) as c:
        yield c, settings


def _batch() -> dict[str, Any]:
    event = {"sequence": 1, "timestamp": 1, "operation": "INSERT", "table": "t", "rowId": "1", "after": {"a": 1}}
    return {"source": "fz", "sequenceNumber": 1, "events": [event]}


def test_an_ack_does_not_show_the_staging_folder(open_receiver: tuple[TestClient, Settings]) -> None:
    client, settings = open_receiver
    r = client.post("/v1/batches", json=_batch())
    assert r.status_code == 200, r.text
    assert not leaks(r.text, settings), r.text


def test_status_does_not_show_the_staging_folder(open_receiver: tuple[TestClient, Settings]) -> None:
    client, settings = open_receiver
    r = client.get("/status")
    assert r.status_code == 200, r.text
    assert not leaks(r.text, settings), r.text


def test_a_source_name_too_long_for_a_file_is_a_4xx_without_a_path(
    open_receiver: tuple[TestClient, Settings],
) -> None:
    """Found by the fuzz on d7b74d3 (503 storage_unavailable showing the receipt path); passes
    since main validates source names."""
    client, settings = open_receiver
    assert client.post("/v1/batches", json=_batch()).status_code == 200  # the receipts folder exists
    r = client.get("/v1/sources/" + "\u00e9" * 200)  # 400 bytes in UTF-8
    assert r.status_code < 500 and not leaks(r.text, settings), (r.status_code, r.text[:300])


def test_rest_create_table_with_an_initial_default_of_no_type_is_a_4xx(tmp_path: Path) -> None:
    from restcatalog.app import create_app

    field = {"id": 1, "name": "a", "type": {}, "required": False, "initial-default": False}
    body = {"name": "t", "schema": {"type": "struct", "fields": [field]}}
    with TestClient(create_app(make_settings(tmp_path))) as c:
        assert c.post("/v1/namespaces", json={"namespace": ["n"]}).status_code == 200
        r = c.post("/v1/namespaces/n/tables", json=body)
    assert r.status_code < 500, r.text


@pytest.mark.server
def test_both_documents_are_served_and_list_the_fuzzed_operations(receiver: Any, rest: Any) -> None:
    assert set(RECEIVER_OPS) >= {"POST /v1/batches", "POST /v1/debezium", "GET /v1/sources/{source}"}
    assert set(REST_OPS) >= {"POST /v1/namespaces/{namespace}/tables", "POST /v1/transactions/commit"}
    for served in (receiver[0], rest[0]):
        assert len(list(served.get_all_operations())) >= 5
