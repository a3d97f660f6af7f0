"""``GET /v1/changes`` and ``GET /v1/subscribe`` (restcatalog/changes.py over
cdclake/lake/changes.py): the applied changes of a table made by the apply job, in commit order.
A materialized view built only from them equals the reference model's table; a reader that
stops anywhere and resumes with its cursor gets exactly the rest, no gaps, no repeats; a change
is served only once the table's own commit holds it."""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.testclient import TestClient

from cdclake.dev.reference import diff, expected_tables, rows_by_key
from cdclake.dev.workload import generate
from cdclake.lake import changes
from restcatalog.app import create_app
from spark_jobs.system import OLDER_AUX_CRASH
from tests.support import apply_all, fresh_settings, stage
from tests.support.lake import Lake, two_run_lake, view
from tests.support.threaded import serve_app

TABLE = "orders"


def test_cursor_round_trip_and_refusal() -> None:
    cur = {"orders": (1_700_000_000_000_000, (5, 2), "src", 9), "b": (1, (), "", 0)}
    assert changes.decode(changes.encode(cur)) == cur
    for bad in ("", "not-base64!", changes.encode({}).replace("e", "x") + "x", "eyJhIjogMX0"):
        with pytest.raises(changes.BadCursor):
            changes.decode(bad)


@pytest.fixture(scope="module")
def lake(spark: Any, spark_home: Path) -> Lake:
    return two_run_lake(spark, spark_home, TABLE)


@pytest.fixture()
def api(lake: Lake) -> Iterator[TestClient]:
    with TestClient(create_app(lake.settings)) as c:
        yield c


def page(api: TestClient, since: str | None = None, **params: Any) -> dict[str, Any]:
    q = {"tables": TABLE, **params, **({"since": since} if since else {})}
    r = api.get("/v1/changes", params=q)
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


@pytest.mark.spark
def test_a_view_built_from_the_changes_equals_the_table(api: TestClient, lake: Lake) -> None:
    got = page(api, limit=10_000)["changes"]
    assert got and not diff(lake.expected(), rows_by_key(view(got).values()))
    positions = [(e["committedAt"], e["order"], e["source"], e["sequence"]) for e in got]
    assert positions == sorted(positions), "commit order"
    assert len({(e["source"], e["sequence"]) for e in got}) == len(got)
    # Up to the first run's changes, the view is the table as of the first run.
    first_run = [e for e in got if e["committedAt"] == got[0]["committedAt"]]
    assert not diff(lake.expected("first"), rows_by_key(view(first_run).values()))


@pytest.mark.spark
def test_each_change_carries_the_before_image_and_metadata_its_producer_sent(api: TestClient, lake: Lake) -> None:
    sent = {(b["source"], e["sequence"]): e for b in lake.first + lake.second for e in b["events"]}
    got = page(api, limit=10_000)["changes"]
    assert [e["before"] for e in got] == [sent[e["source"], e["sequence"]].get("before") for e in got]
    assert any(e["before"] for e in got) and any(e["operation"] == "INSERT" and e["before"] is None for e in got)
    assert [e["metadata"] for e in got] == [sent[e["source"], e["sequence"]].get("metadata") for e in got]
    assert any(e["metadata"] for e in got)


@pytest.mark.spark
def test_stopping_anywhere_and_resuming_gives_exactly_the_rest(api: TestClient) -> None:
    whole = page(api, limit=10_000)["changes"]
    rng = random.Random(3)
    read: list[dict[str, Any]] = []
    cursor = None
    while True:
        got = page(api, cursor, limit=rng.randint(1, 9))
        if not got["changes"]:
            break
        read += got["changes"]
        cursor = rng.choice([got["cursor"], got["changes"][-1]["cursor"]])  # the same position
    assert [e["cursor"] for e in read] == [e["cursor"] for e in whole]
    cut = rng.randrange(len(whole))
    assert page(api, whole[cut]["cursor"], limit=10_000)["changes"] == whole[cut + 1 :]


@pytest.mark.spark
def test_operations_filter_and_bad_requests(api: TestClient, lake: Lake) -> None:
    whole = page(api, limit=10_000)["changes"]
    deletes = page(api, limit=10_000, operations="DELETE")["changes"]
    assert [e["key"] for e in deletes] == [e["key"] for e in whole if e["operation"] == "DELETE"]
    assert all(e["after"] is None for e in deletes)
    for params, needle in (
        ({}, "tables: give 1 to 100 distinct table names"),
        ({"tables": "orders", "operations": "MERGE"}, "operations: a comma-separated subset"),
        ({"tables": "orders", "since": "garbage"}, "since: not a cursor this server gave"),
        ({"tables": "a/b"}, "is not a table name"),
        ({"tables": "orders", "limit": "0"}, "limit must be an integer 1..10000"),
    ):
        r = api.get("/v1/changes", params=params)
        assert r.status_code == 400 and needle in r.json()["error"]["message"], (params, r.text)
    assert page(api, tables="nosuch")["changes"] == []


@pytest.mark.spark
@pytest.mark.parametrize("point", ["after-aux", "after-stage", OLDER_AUX_CRASH])
def test_a_run_that_crashed_before_its_table_commit_is_not_served_until_it_commits(
    spark: Any, spark_home: Path, point: str
) -> None:
    from spark_jobs.apply import apply_table

    settings = fresh_settings(spark_home)
    w = generate(events=80, seed=8, tables=(TABLE,), batch_size=20, keys_per_table=15)
    first, second = w.batches[:2], w.batches[2:]
    stage(settings, first)
    apply_all(spark, settings)
    with TestClient(create_app(settings)) as api:
        before = page(api, limit=10_000)
        stage(settings, second)
        with pytest.raises(Exception, match=point):
            apply_table(spark, settings, TABLE, 100, crash_at=point)
        # Nothing of the run is published (or, as an older cdclake could leave it, __changes holds
        # its decisions and the table does not): nothing new is served.
        assert page(api, before["cursor"], limit=10_000)["changes"] == []
        apply_all(spark, settings)
        rest = page(api, before["cursor"], limit=10_000)["changes"]
    assert rest
    everything = before["changes"] + rest
    assert not diff(expected_tables(w.batches)[TABLE], rows_by_key(view(everything).values()))


@pytest.mark.spark
@pytest.mark.server
def test_subscribe_streams_new_commits_and_resumes_from_last_event_id(spark: Any, spark_home: Path) -> None:
    settings = fresh_settings(spark_home)
    w = generate(events=60, seed=12, tables=(TABLE,), batch_size=20, keys_per_table=10)
    stage(settings, w.batches[:1])
    apply_all(spark, settings)
    with serve_app(create_app(settings)) as url:
        got: list[dict[str, Any]] = []
        starts: list[str] = []

        def listen(since: str | None, until: int) -> None:
            headers = {"Last-Event-ID": since} if since else {}
            with httpx.stream(
                "GET", f"{url}/v1/subscribe", params={"tables": TABLE}, headers=headers, timeout=120
            ) as r:
                assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
                kind = ""
                for line in r.iter_lines():
                    if line.startswith("event: "):
                        kind = line[7:]
                    elif line.startswith("data: ") and kind == "start":
                        starts.append(json.loads(line[6:])["cursor"])
                        if until == 0:
                            return
                    elif line.startswith("data: "):
                        assert kind == "change"
                        got.append(json.loads(line[6:]))
                        if len(got) >= until:
                            return

        initial = len(page_of(url)["changes"])
        listen(None, initial)  # everything so far, then the client goes away
        listen("now", 0)  # since=now: the stream starts at the last visible change, and says so
        now = page_of(url, "now")
        assert now["changes"] == [] and now["cursor"] == got[-1]["cursor"]
        assert starts == [changes.encode({}), got[-1]["cursor"]]
        stage(settings, w.batches[1:])
        apply_all(spark, settings)
        assert page_of(url, now["cursor"])["changes"] == page_of(url, got[-1]["cursor"])["changes"] != []
        total = initial + len(page_of(url, got[-1]["cursor"])["changes"])
        listen(got[-1]["cursor"], total)  # reconnects with its last event id: only what is new
        from cdclake.client import lake as lakeclient

        with lakeclient.connect(url) as db:  # the lake client's stream: the same changes, in order
            assert [c["cursor"] for c in itertools.islice(db.subscribe([TABLE]), total)] == [e["cursor"] for e in got]
            assert db.changes([TABLE], limit=10_000)[0] == got
    assert len({e["cursor"] for e in got}) == len(got) == total
    assert not diff(expected_tables(w.batches)[TABLE], rows_by_key(view(got).values()))


def page_of(url: str, since: str | None = None) -> dict[str, Any]:
    params = {"tables": TABLE, "limit": "10000", **({"since": since} if since else {})}
    out: dict[str, Any] = httpx.get(f"{url}/v1/changes", params=params, timeout=60).json()
    return out


def test_lake_client_subscribe_resumes_after_a_dropped_connection_from_the_last_change() -> None:
    """The client side alone: the first stream breaks after two changes; the client reconnects
    with the second one's cursor and goes on with the third, none twice."""
    from cdclake.client import lake as lakeclient

    def event(n: int) -> bytes:
        return f'id: c{n}\nevent: change\ndata: {{"key": "{n}", "cursor": "c{n}"}}\n\n'.encode()

    class Breaks(httpx.SyncByteStream):
        def __iter__(self) -> Iterator[bytes]:
            yield event(1) + b": keep-alive\n\n" + event(2)
            raise httpx.ReadError("connection reset")

    seen: list[dict[str, str]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append({"last": request.headers.get("last-event-id", ""), "tables": request.url.params["tables"]})
        if len(seen) == 1:
            return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=Breaks())
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=event(3))

    http = httpx.Client(base_url="http://lake", transport=httpx.MockTransport(handler))
    db = lakeclient.Lake("http://lake", http=http)
    got = []
    for change in db.subscribe(["orders", "customers"], reconnect_s=0):
        got.append(change["key"])
        if len(got) == 3:
            break
    assert got == ["1", "2", "3"]
    assert seen[:2] == [{"last": "", "tables": "orders,customers"}, {"last": "c2", "tables": "orders,customers"}]


def test_lake_client_subscribed_since_now_resumes_from_the_start_cursor_not_a_later_now() -> None:
    """A stream asked ``since=now`` that breaks before its first change is resumed from the
    cursor its start event gave: changes committed while it was away are not skipped."""
    from cdclake.client import lake as lakeclient

    start = b'id: s0\nevent: start\ndata: {"cursor": "s0"}\n\n'

    class Breaks(httpx.SyncByteStream):
        def __iter__(self) -> Iterator[bytes]:
            yield start
            raise httpx.ReadError("connection reset")

    seen: list[tuple[str, str]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((request.headers.get("last-event-id", ""), request.url.params.get("since", "")))
        if len(seen) == 1:
            return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=Breaks())
        change = b'id: c1\nevent: change\ndata: {"key": "1", "cursor": "c1"}\n\n'
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=start + change)

    http = httpx.Client(base_url="http://lake", transport=httpx.MockTransport(handler))
    db = lakeclient.Lake("http://lake", http=http)
    assert [c["key"] for c in itertools.islice(db.subscribe(["orders"], since="now", reconnect_s=0), 1)] == ["1"]
    assert seen == [("now", ""), ("s0", "")]


def test_async_lake_client_queries_resumes_its_stream_and_refreshes_its_token() -> None:
    """cdclake.client.lake_async against a scripted server: a token fetched from the credential
    and fetched again after a 401, a query's rows, a refusal as QueryRefused, and a stream that
    breaks after two changes resumed from the second one's cursor."""
    import asyncio

    from cdclake.client import lake as lakeclient
    from cdclake.client import lake_async

    def event(n: int) -> bytes:
        return f'id: c{n}\nevent: change\ndata: {{"key": "{n}", "cursor": "c{n}"}}\n\n'.encode()

    class Breaks(httpx.AsyncByteStream):
        async def __aiter__(self) -> Any:
            yield event(1) + event(2)
            raise httpx.ReadError("connection reset")

    tokens = iter(["t1", "t2"])
    seen: list[tuple[str, str, str]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        auth = request.headers.get("authorization", "")
        seen.append((request.method, request.url.path, request.headers.get("last-event-id", "")))
        if request.url.path == "/v1/oauth/tokens":
            assert b"client_id=app" in request.content and b"client_secret=s3cret" in request.content
            return httpx.Response(200, json={"access_token": next(tokens), "token_type": "bearer"})
        if auth == "Bearer t1" and request.url.path == "/v1/query" and len(seen) > 3:
            return httpx.Response(401, json={"error": {"message": "expired", "type": "NotAuthorizedException"}})
        if request.url.path == "/v1/query":
            sql = json.loads(request.content)["sql"]
            if sql.startswith("DROP"):
                return httpx.Response(400, json={"error": {"message": "not DROP statement", "type": "Bad"}})
            answer = {"columns": [{"name": "n", "type": "int64"}], "rows": [[3]], "truncated": False, "snapshots": []}
            return httpx.Response(200, json=answer)
        sse = {"content-type": "text/event-stream"}
        if request.headers.get("last-event-id") != "c2":
            return httpx.Response(200, headers=sse, stream=Breaks())
        return httpx.Response(200, headers=sse, content=event(3))

    async def scenario() -> tuple[list[dict[str, Any]], list[str]]:
        http = httpx.AsyncClient(base_url="http://lake", transport=httpx.MockTransport(handler))
        async with lake_async.AsyncLake("http://lake", credential="app:s3cret", http=http) as db:
            first = (await db.query("SELECT count(*) AS n FROM orders")).rows
            with pytest.raises(lakeclient.QueryRefused, match="not DROP statement"):
                await db.query("DROP TABLE orders")
            again = (await db.query("SELECT count(*) AS n FROM orders")).rows  # t1 refused: t2
            keys = []
            async for change in db.subscribe(["orders"], reconnect_s=0):
                keys.append(change["key"])
                if len(keys) == 3:
                    break
        return first + again, keys

    rows, keys = asyncio.run(scenario())
    assert rows == [{"n": 3}, {"n": 3}] and keys == ["1", "2", "3"]
    assert [p for m, p, _ in seen].count("/v1/oauth/tokens") == 2
    assert [last for _, p, last in seen if p == "/v1/subscribe"] == ["", "c2"]


def test_the_feed_needs_the_right_to_read_each_table(tmp_path: Path) -> None:
    from tests.support import make_settings

    f = tmp_path / "tokens.toml"
    f.write_text('[[client]]\nid = "app"\naccess = "read"\ntoken = "t-app"\ntables = ["cdc.customers"]\n')
    settings = make_settings(tmp_path, rest_tokens_file=f)
    with TestClient(create_app(settings)) as api:
        app = {"Authorization": "Bearer t-app"}
        assert api.get("/v1/changes", params={"tables": "customers"}).status_code == 401
        assert api.get("/v1/changes", params={"tables": "customers"}, headers=app).status_code == 200
        r = api.get("/v1/changes", params={"tables": "customers,orders"}, headers=app)
        assert r.status_code == 403 and "may not read cdc.orders" in r.text
        assert api.get("/v1/subscribe", params={"tables": "orders"}, headers=app).status_code == 403


@pytest.mark.spark
def test_each_change_carries_its_source_transaction(spark: Any, spark_home: Path) -> None:
    """A change's ``transaction`` is the id its producer gave the event (per event, or the whole
    batch's shorthand), null without one; two tables of one transaction share it."""
    settings = fresh_settings(spark_home)

    def ev(seq: int, table: str, key: int, tx: str | None = None) -> dict[str, Any]:
        e: dict[str, Any] = {"sequence": seq, "timestamp": 1_700_000_000_000 + seq, "operation": "INSERT"}
        e |= {"table": table, "rowId": str(key), "after": {"id": key, "n": seq}}
        return e | ({"transaction": {"id": tx}} if tx else {})

    whole = {"source": "shop", "sequenceNumber": 1, "transaction": "t-1", "events": [ev(1, "ta", 1), ev(2, "tb", 1)]}
    mixed = {"source": "shop", "sequenceNumber": 2, "events": [ev(3, "ta", 2, "t-2"), ev(4, "tb", 2), ev(5, "ta", 3)]}
    # t-2's END: without it the consistent publish holds t-2, and event 5 sharing its object.
    mixed["transactions"] = [{"id": "t-2", "status": "END", "eventCount": 1, "tables": {"ta": 1}}]
    stage(settings, [whole, mixed])
    apply_all(spark, settings)
    want = {1: "t-1", 2: "t-1", 3: "t-2", 4: None, 5: None}  # by sequence: what was sent
    with TestClient(create_app(settings)) as api:
        r = api.get("/v1/changes", params={"tables": "ta,tb", "limit": 100})
    assert r.status_code == 200, r.text
    got = {e["sequence"]: e["transaction"] for e in r.json()["changes"]}
    assert got == want
