"""The change feed's bounds (issue 28): a cursor's numbers are checked, a table named twice is
read once, a page reads no more of the history than it serves, and open streams are capped per
client and in all. The histories are written with pyiceberg (tests/support/history.py), one data
file per run: what a read opens is counted where pyiceberg opens a data file."""

from __future__ import annotations

import base64
import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.testclient import TestClient

from cdclake.config.settings import Settings, load
from restcatalog.app import create_app
from tests.support import make_settings
from tests.support.history import write_history
from tests.support.threaded import serve_app

TABLE = "pub"
RUNS, PER_RUN = 40, 5


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    s = make_settings(tmp_path)
    write_history(s, TABLE, RUNS, PER_RUN)
    return s


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every history data file pyiceberg opens to read rows, in order."""
    import pyiceberg.io.pyarrow as pa_io

    seen: list[str] = []
    real = pa_io._task_to_record_batches

    def counting(io: Any, task: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(task.file.file_path)
        return real(io, task, *args, **kwargs)

    monkeypatch.setattr(pa_io, "_task_to_record_batches", counting)
    return seen


def cursor(positions: dict[str, list[Any]]) -> str:
    """A cursor in the server's encoding, with whatever numbers a client puts in it."""
    return base64.urlsafe_b64encode(json.dumps(positions).encode()).decode().rstrip("=")


def keys(page: dict[str, Any]) -> list[int]:
    return [int(c["key"]) for c in page["changes"]]


@pytest.mark.parametrize(
    "position",
    [
        [-(2**70), [1], "src", 1],  # a commit time below any long: was a 500 (OverflowError)
        [2**70, [1], "src", 1],
        [-1, [1], "src", 1],
        [253_402_300_800_000_000, [1], "src", 1],  # past 9999-12-31
        [1, [2**63], "src", 1],
        [1, [1], "src", -(2**63) - 1],
        [True, [1], "src", 1],
    ],
)
def test_a_cursor_holding_an_out_of_range_number_is_a_400_naming_since(settings: Settings, position: list[Any]) -> None:
    with TestClient(create_app(settings), raise_server_exceptions=False) as api:
        for path in ("/v1/changes", "/v1/subscribe"):
            r = api.get(path, params={"tables": TABLE, "since": cursor({TABLE: position})})
            assert r.status_code == 400, (path, r.status_code, r.text)
            assert r.json()["error"]["message"].startswith("since: "), r.text


def test_a_table_named_many_times_is_one_table_read_once(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    import cdclake.lake.changes as lake_changes
    from cdclake.lake.catalog import load_table as real

    loads: list[str] = []

    def counting(s: Settings, table: str) -> Any:
        loads.append(table)
        return real(s, table)

    monkeypatch.setattr(lake_changes, "load_table", counting)
    with TestClient(create_app(settings)) as api:
        once = api.get("/v1/changes", params={"tables": TABLE, "limit": "7"})
        assert loads.count(TABLE + "__changes") == 1
        loads.clear()
        names = ",".join([TABLE, TABLE.upper(), f" {TABLE} "] * 34)  # 102 names, one table
        many = api.get("/v1/changes", params={"tables": names, "limit": "7"})
        assert many.status_code == 200, many.text
        assert loads.count(TABLE + "__changes") == 1, loads
        assert many.json() == once.json()
        distinct = ",".join(f"t{i}" for i in range(101))
        r = api.get("/v1/changes", params={"tables": distinct})
        assert r.status_code == 400 and "1 to 100 distinct table names" in r.text, r.text


def test_a_page_reads_only_the_history_files_it_serves_and_resuming_misses_nothing(
    settings: Settings, opened: list[str]
) -> None:
    with TestClient(create_app(settings)) as api:
        first = api.get("/v1/changes", params={"tables": TABLE, "limit": "3"}).json()
        assert keys(first) == [0, 1, 2]
        assert len(opened) == 1, opened  # the first run's file; the other 39 runs are not read
        opened.clear()
        middle = api.get("/v1/changes", params={"tables": TABLE, "limit": "12", "since": first["cursor"]}).json()
        assert keys(middle) == list(range(3, 15)) and len(opened) <= 3, opened
        opened.clear()
        now = api.get("/v1/changes", params={"tables": TABLE, "since": "now"}).json()
        # The last run's file alone: once to find the last change, once for what follows it.
        assert now["changes"] == [] and len(set(opened)) == 1 and len(opened) <= 2, opened
        # Page by page, small pages and large: every change once, in order, none missed.
        got: list[int] = []
        since: str | None = None
        for limit in [1, 4, 7, 2, 50, 3, 1000]:
            params = {"tables": TABLE, "limit": str(limit), **({"since": since} if since else {})}
            page = api.get("/v1/changes", params=params).json()
            got += keys(page)
            since = page["cursor"]
        assert got == list(range(RUNS * PER_RUN))
        assert api.get("/v1/changes", params={"tables": TABLE, "since": since}).json()["changes"] == []
        assert now["cursor"] == since


@contextlib.contextmanager
def stream(url: str, token: str | None = None) -> Iterator[httpx.Response]:
    """A subscription, open until the block ends; its first line read when it is a 200."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with httpx.stream("GET", f"{url}/v1/subscribe", params={"tables": TABLE, "since": "now"}, headers=headers) as r:
        lines = r.iter_lines()  # held: a dropped line iterator closes the connection
        if r.status_code == 200:
            next(lines)
        yield r


@pytest.mark.server
def test_subscriptions_past_the_per_client_and_total_caps_get_429_with_retry_after(tmp_path: Path) -> None:
    f = tmp_path / "tokens.toml"
    f.write_text(
        "".join(f'[[client]]\nid = "{c}"\naccess = "read"\ntoken = "t-{c}"\n' for c in ("a", "b")),
    )
    caps = {"CDCLAKE_MAX_SUBSCRIPTIONS": "3", "CDCLAKE_MAX_SUBSCRIPTIONS_PER_CLIENT": "2"}  # as an operator sets them
    s = load({"CDCLAKE_HOME": str(tmp_path), **caps}, rest_tokens_file=f)
    write_history(s, TABLE, 2, 1)
    with serve_app(create_app(s)) as url, contextlib.ExitStack() as held:
        a1, a2 = held.enter_context(stream(url, "t-a")), held.enter_context(stream(url, "t-a"))
        assert (a1.status_code, a2.status_code) == (200, 200)
        with stream(url, "t-a") as a3:
            assert a3.status_code == 429 and int(a3.headers["Retry-After"]) >= 1
            a3.read()
            assert "CDCLAKE_MAX_SUBSCRIPTIONS_PER_CLIENT=2" in a3.json()["error"]["message"]
        b1 = held.enter_context(stream(url, "t-b"))
        assert b1.status_code == 200
        with stream(url, "t-b") as b2:  # b has one, but the server has 3
            assert b2.status_code == 429 and int(b2.headers["Retry-After"]) >= 1
            b2.read()
            assert "CDCLAKE_MAX_SUBSCRIPTIONS=3" in b2.json()["error"]["message"]
        a1.close()  # the client goes away: its slot comes back once the server sees it
        deadline = time.monotonic() + 30
        while True:
            with stream(url, "t-b") as again:
                if again.status_code == 200:
                    break
            assert time.monotonic() < deadline, "a closed subscription's slot never came back"
            time.sleep(0.2)
