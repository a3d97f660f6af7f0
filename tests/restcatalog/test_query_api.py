"""``POST /v1/query`` (restcatalog/query.py over cdclake/query/queries.py): results and ``asOf``
results equal the reference model at each apply run, parameters are bound (never spliced), what
a statement reads is taken from Spark's plan (files, other catalogs, Java calls and tables at the
wrong time are refused), row caps, formats, and read rights per table.

The server here is real (uvicorn on 127.0.0.1) and so is its engine: a Spark Connect server in the
test session's JVM (tests/support/query.py), whose query sessions read the lake back through
the served REST catalog with the client's rights, as in the stack."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import pyarrow.ipc
import pytest
from starlette.testclient import TestClient

from cdclake.config.settings import Settings
from cdclake.dev.reference import diff, rows_by_key
from cdclake.query import limits, queries
from restcatalog import auth
from restcatalog.app import create_app
from restcatalog.query import jsonable
from tests.support.lake import Lake, two_run_lake
from tests.support.query import served

TABLE = "orders"

# ---------------------------------------------------------------- pure parts (no Spark)


PLAN = """== Physical Plan ==
* Project (4)
+- * BroadcastHashJoin Inner BuildRight (3)
   :- BatchScan lake.cdc.orders (1)
   +- BatchScan lake.cdc.orders.snapshots (2)


(1) BatchScan lake.cdc.orders
Output [2]: [k#1, v#2]
IcebergScan(table=lake.cdc.orders, schemaId=0, snapshotId=42, branch=null, filters=, runtimeFilters=, groupedBy=)

(2) BatchScan lake.cdc.orders.snapshots
Output [1]: [snapshot_id#3L]
IcebergScan(table=lake.cdc.orders.snapshots, schemaId=null, snapshotId=null, branch=null, filters=)

(3) Scan json
Output [1]: [value#4]
Batched: false
Location: InMemoryFileIndex [file:/etc/passwd]

(4) LocalTableScan [codegen id : 1]
Output [1]: [col1#5]
"""


def test_plan_scans_finds_iceberg_tables_with_their_snapshot_and_every_other_scan() -> None:
    scans, other = queries.plan_scans(PLAN)
    assert scans == [queries.Scan("lake.cdc.orders", 42), queries.Scan("lake.cdc.orders.snapshots", None)]
    assert [s.metadata for s in scans] == [False, True]
    assert other == ["Scan json"]


def test_jsonable_values() -> None:
    import datetime as dt
    from decimal import Decimal

    assert jsonable(dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)) == "2026-01-02T03:04:05+00:00"
    assert jsonable(Decimal("1.10")) == "1.10"
    assert jsonable(b"\x00\xff") == "AP8="
    assert jsonable(float("nan")) == "nan" and jsonable(float("-inf")) == "-inf"
    assert jsonable([("a", 1), ("b", None)]) == {"a": 1, "b": None}  # a map with text keys
    assert jsonable([(1, "x")]) == [[1, "x"]]
    assert jsonable({"s": [dt.date(2026, 1, 1)]}) == {"s": ["2026-01-01"]}


def test_table_rights_from_the_tokens_file(tmp_path: Path) -> None:
    f = tmp_path / "tokens.toml"
    f.write_text(
        '[[client]]\nid = "app"\naccess = "read"\ntoken = "t-app"\ntables = ["cdc.orders", "sales.*"]\n'
        '[[client]]\nid = "all"\naccess = "read"\nsecret = "s"\n'
    )
    tokens = auth.Tokens.load(f, 60)
    app = tokens.bearer("Bearer t-app")
    assert app is not None
    assert app.may_read("cdc", "orders") and app.may_read("CDC", "Orders") and app.may_read("sales", "x")
    assert not app.may_read("cdc", "orders__changes") and not app.may_read("cdc", "customers")
    issued = tokens.bearer("Bearer " + tokens.issue(app))  # an issued token carries the rights
    assert issued is not None and issued.tables == ("cdc.orders", "sales.*")
    everyone = tokens.credentials("all", "s")
    assert everyone is not None and everyone.may_read("any", "thing")
    f.write_text('[[client]]\nid = "x"\ntoken = "t"\ntables = []\n')
    with pytest.raises(auth.TokensFileError, match=r"client\[0\]\.tables must be a non-empty list"):
        auth.Tokens.load(f, 60)


# ---------------------------------------------------------------- on real tables


@pytest.fixture(scope="module")
def lake(spark: Any, spark_home: Path) -> Lake:
    return two_run_lake(spark, spark_home, TABLE)


@pytest.fixture()
def api(connect_url: str, lake: Lake) -> Iterator[httpx.Client]:
    with served(lake.settings, connect_url) as c:
        yield c


def rows(answer: dict[str, Any]) -> list[dict[str, Any]]:
    """The answer's rows as dicts (the history's ``_commit_timestamp`` left out: no table column)."""
    names = [c["name"] for c in answer["columns"]]
    return [{k: v for k, v in zip(names, r, strict=True) if k != "_commit_timestamp"} for r in answer["rows"]]


def query(api: httpx.Client, sql: str, status: int = 200, **body: Any) -> dict[str, Any]:
    r = api.post("/v1/query", json={"sql": sql, **body})
    assert r.status_code == status, r.text
    out: dict[str, Any] = r.json()
    return out


@pytest.mark.spark
def test_rows_now_and_as_of_each_run_equal_the_reference(api: httpx.Client, lake: Lake) -> None:
    old, new = lake.expected("first"), lake.expected()
    assert old != new
    got = query(api, f"SELECT * FROM {TABLE}")
    assert not diff(new, rows_by_key(rows(got)))
    assert got["snapshots"] == [{"table": f"{lake.ns}.{TABLE}", "snapshotId": lake.s2}]
    for as_of, want, snap in (
        (lake.s1, old, lake.s1),
        (str(lake.s2), new, lake.s2),
        (_iso(lake.s1_ms + 1), old, lake.s1),
        (_iso(lake.s2_ms), new, lake.s2),
    ):
        # One-part, fully qualified, and both in one statement: every table at the time asked.
        for sql in (
            f"SELECT * FROM {TABLE}",
            f"SELECT * FROM {lake.ns}.{TABLE}",
            f"SELECT o.* FROM {TABLE} o JOIN {lake.ns}.{TABLE} q ON o._cdc_row_id = q._cdc_row_id",
        ):
            got = query(api, sql, asOf=as_of)
            assert not diff(want, rows_by_key(rows(got))), (as_of, sql)
            assert {s["snapshotId"] for s in got["snapshots"]} == {snap}, (as_of, sql)


@pytest.mark.spark
def test_a_table_the_rewrite_cannot_time_travel_is_refused_not_read_now(api: httpx.Client, lake: Lake) -> None:
    ns = lake.settings.namespace
    for sql, params in (
        (f"SELECT * FROM {ns}.{TABLE}", {}),  # two-part name
        ("SELECT * FROM IDENTIFIER(:t)", {"t": f"{ns}.{TABLE}"}),  # a name in a parameter
    ):
        err = query(api, sql, 400, asOf=lake.s1, params=params)["error"]["message"]
        assert f"would read {TABLE} at snapshot {lake.s2}, not at {lake.s1}" in err, err
    # A one-part name in a parameter resolves to the time-travelled view.
    got = query(api, "SELECT * FROM IDENTIFIER(:t)", asOf=lake.s1, params={"t": TABLE})
    assert not diff(lake.expected("first"), rows_by_key(rows(got)))
    err = query(api, f"SELECT * FROM {TABLE}", 400, asOf="1970-01-01T00:00:01Z")["error"]["message"]
    assert "has no snapshot at that time" in err


@pytest.mark.spark
def test_parameters_are_bound_never_spliced(api: httpx.Client, lake: Lake) -> None:
    some = sorted(lake.expected())[0]
    hostile = [f"{some}' OR '1'='1", f"{some}'; DROP TABLE {TABLE}; --", "') UNION SELECT * FROM x --", 'a"b`c\\']
    for value in hostile:
        got = query(api, f"SELECT _cdc_row_id FROM {TABLE} WHERE _cdc_row_id = :k", params={"k": value})
        assert got["rows"] == [], value
    got = query(api, f"SELECT _cdc_row_id, ? AS echoed FROM {TABLE} WHERE _cdc_row_id = ?", params=[hostile[1], some])
    assert got["rows"] == [[some, hostile[1]]]
    assert len(query(api, f"SELECT * FROM {TABLE}")["rows"]) == len(lake.expected())  # still there


@pytest.mark.spark
@pytest.mark.parametrize(
    ("sql", "needle"),
    [
        # Files by path are off in query sessions: a name in the lake's catalog, which has none such.
        ("SELECT * FROM json.`/etc/passwd`", "invalid character '/' in table name '/etc/passwd'"),
        ("SELECT * FROM text.`/etc`", "invalid character '/' in table name '/etc'"),
        ("SELECT IDENTIFIER('reflect')('java.lang.System', 'getenv', 'HOME')", "function reflect calls Java"),
        ("SELECT * FROM nosuch", "TABLE_OR_VIEW_NOT_FOUND"),
        ("SELECT 1 +", "PARSE_SYNTAX_ERROR"),
    ],
)
def test_what_a_statement_may_not_read_or_call_is_refused(api: httpx.Client, sql: str, needle: str) -> None:
    err = query(api, sql, 400)["error"]
    assert needle in err["message"] and "\n" not in err["message"], err


@pytest.mark.spark
def test_a_session_answers_the_next_query_as_it_found_it(spark: Any, lake: Lake) -> None:
    """The server lends each of its Spark Connect sessions to one query after another: a query
    leaves no temporary view behind, whether it was answered or refused."""
    from cdclake.query.statements import AsOf
    from restcatalog.query import lake_for

    session, where = spark.newSession(), lake_for(lake.settings, auth.ANYONE)
    got = queries.run(session, queries.Query(f"SELECT * FROM {TABLE}__history", as_of=None), where)
    assert got.table.num_rows > 0
    then = queries.run(session, queries.Query(f"SELECT * FROM {TABLE}", as_of=AsOf(lake.s1)), where)
    assert not diff(lake.expected("first"), rows_by_key(then.table.to_pylist()))
    with pytest.raises(queries.Refused):
        queries.run(
            session, queries.Query(f"SELECT * FROM {lake.settings.namespace}.{TABLE}", as_of=AsOf(lake.s1)), where
        )
    assert [t.name for t in session.catalog.listTables() if t.isTemporary] == []
    now = queries.run(session, queries.Query(f"SELECT * FROM {TABLE}"), where)
    assert not diff(lake.expected(), rows_by_key(now.table.to_pylist()))


@pytest.mark.spark
def test_max_rows_truncates_and_arrow_carries_the_same_rows(api: httpx.Client, lake: Lake) -> None:
    n = len(lake.expected())
    got = query(api, f"SELECT _cdc_row_id FROM {TABLE} ORDER BY _cdc_row_id", maxRows=3)
    assert got["rowCount"] == 3 and got["truncated"] is True
    assert query(api, f"SELECT _cdc_row_id FROM {TABLE}", maxRows=n)["truncated"] is False
    r = api.post("/v1/query", json={"sql": f"SELECT * FROM {TABLE} ORDER BY _cdc_row_id", "format": "arrow"})
    assert r.status_code == 200 and r.headers["content-type"] == "application/vnd.apache.arrow.stream"
    assert r.headers["cdclake-truncated"] == "false"
    table = pyarrow.ipc.open_stream(io.BytesIO(r.content)).read_all()
    assert isinstance(table, pa.Table)
    assert not diff(lake.expected(), rows_by_key(table.to_pylist()))


@pytest.mark.spark
@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"sql": "SELECT 1", "maxRows": 0}, "maxRows"),
        ({"sql": "SELECT 1", "maxRows": 10**9}, "maxRows 1000000000 is above this server's limit of 100000"),
        ({"sql": "SELECT 1", "timeoutS": 10**6}, "timeoutS 1000000 is above this server's limit of 120 s"),
        ({"sql": "SELECT 1", "asOf": "yesterday"}, "asOf 'yesterday' is neither a snapshot id"),
        ({"sql": "SELECT 1", "params": {"a": {"nested": 1}}}, "params"),
        ({"sql": "SELECT 1", "format": "csv"}, "format"),
        ({"sql": "SELECT 1", "extra": 1}, "extra"),
        ({"sql": ""}, "sql"),
    ],
)
def test_bad_requests_name_the_field(api: httpx.Client, body: dict[str, Any], needle: str) -> None:
    r = api.post("/v1/query", json=body)
    assert r.status_code == 400, r.text
    assert needle in r.json()["error"]["message"]


@pytest.mark.spark
def test_read_rights_per_table(spark: Any, connect_url: str, lake: Lake, tmp_path: Path) -> None:
    f = tmp_path / "tokens.toml"
    f.write_text(
        '[[client]]\nid = "changes"\naccess = "read"\ntoken = "t-changes"\n'
        f'tables = ["{lake.settings.namespace}.*__changes"]\n'
    )
    settings = Settings(**{**lake.settings.__dict__, "rest_tokens_file": f})
    with served(settings, connect_url) as api:
        sql = {"sql": f"SELECT count(*) FROM {TABLE}"}
        assert api.post("/v1/query", json=sql).status_code == 401
        r = api.post("/v1/query", json=sql, headers={"Authorization": "Bearer t-changes"})
        assert r.status_code == 403 and f"may not read {lake.settings.namespace}.{TABLE}" in r.text
        ok = api.post(
            "/v1/query",
            json={"sql": f"SELECT count(*) FROM {TABLE}__changes"},
            headers={"Authorization": "Bearer t-changes"},
        )
        assert ok.status_code == 200 and ok.json()["rows"][0][0] > 0


@pytest.mark.spark
def test_aggregates_iceberg_could_answer_from_metadata_still_need_the_right(
    spark: Any, connect_url: str, lake: Lake, tmp_path: Path
) -> None:
    """On a table without deletes Iceberg answers count(*), min and max from its manifests while
    Spark plans (aggregate push-down): the plan then has no scan of it, so the query engine turns
    push-down off rather than let such a statement past the rights and asOf checks."""
    ident = f"{lake.ns}.plain"
    spark.sql(f"CREATE TABLE {ident} (id BIGINT) USING iceberg")
    spark.sql(f"INSERT INTO {ident} VALUES (1), (2), (3)")
    first = spark.sql(f"SELECT snapshot_id FROM {ident}.snapshots").first()[0]
    spark.sql(f"INSERT INTO {ident} VALUES (40)")
    f = tmp_path / "tokens.toml"
    f.write_text(
        '[[client]]\nid = "other"\naccess = "read"\ntoken = "t-other"\n'
        f'tables = ["{lake.settings.namespace}.{TABLE}"]\n'
        '[[client]]\nid = "all"\naccess = "read"\ntoken = "t-all"\n'
    )
    settings = Settings(**{**lake.settings.__dict__, "rest_tokens_file": f})
    with served(settings, connect_url) as api:
        other = {"Authorization": "Bearer t-other"}
        for agg in ("count(*)", "max(id)", "min(id)", "count(id)"):
            r = api.post("/v1/query", json={"sql": f"SELECT {agg} FROM plain"}, headers=other)
            assert r.status_code == 403 and "may not read" in r.text and "rows" not in r.json(), (agg, r.text)
        # Whether a table outside its rights exists is not the client's to learn.
        asks = [
            ("/v1/query", f"SELECT * FROM {name}") for name in ("plain", "PLAIN", f"{lake.settings.namespace}.plain")
        ]
        asks += [("/v1/query/plan", "SELECT * FROM plain WHERE id > 1")]
        there = [api.post(path, json={"sql": sql}, headers=other) for path, sql in asks]
        spark.sql(f"ALTER TABLE {ident} RENAME TO {lake.settings.namespace}.plain_kept")
        gone = [api.post(path, json={"sql": sql}, headers=other) for path, sql in asks]
        spark.sql(f"ALTER TABLE {lake.ns}.plain_kept RENAME TO {lake.settings.namespace}.plain")
        assert [(r.status_code, r.text) for r in gone] == [(r.status_code, r.text) for r in there]
        assert {r.status_code for r in there} == {403}
        r = api.post("/v1/query", json={"sql": "SELECT * FROM nope"}, headers={"Authorization": "Bearer t-all"})
        assert r.status_code == 400 and "TABLE_OR_VIEW_NOT_FOUND" in r.text  # a client that could read it
    with served(lake.settings, connect_url) as api:
        got = query(api, "SELECT count(*), max(id) FROM plain", asOf=first)
        assert got["rows"] == [[3, 3]] and got["snapshots"] == [{"table": ident, "snapshotId": first}]


def test_without_an_engine_the_query_api_says_what_it_needs(tmp_path: Path) -> None:
    from tests.support import make_settings

    settings = make_settings(tmp_path, spark_connect_url="")
    with TestClient(create_app(settings)) as api:
        r = api.post("/v1/query", json={"sql": "SELECT 1"})
    assert r.status_code == 503 and "CDCLAKE_SPARK_CONNECT_URL" in r.json()["error"]["message"]


def _iso(ms: int) -> str:
    from datetime import UTC, datetime, timedelta

    return (datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=ms)).isoformat()


# ---------------------------------------------------------------- the lake client over the API


@pytest.mark.spark
def test_lake_client_reads_rows_arrow_and_as_of(spark: Any, connect_url: str, lake: Lake) -> None:
    from cdclake.client import lake as lakeclient

    with served(lake.settings, connect_url) as http:
        db = lakeclient.Lake(str(http.base_url), http=http)
        rows = db.query(f"SELECT * FROM {TABLE}", max_rows=10_000)
        assert not diff(lake.expected(), rows_by_key(list(rows))) and not rows.truncated
        then = db.query(f"SELECT * FROM {TABLE}", as_of=lake.s1, max_rows=10_000)
        assert not diff(lake.expected("first"), rows_by_key(then.rows))
        assert then.snapshots == [{"table": f"{lake.ns}.{TABLE}", "snapshotId": lake.s1}]
        # docs/querying.md's dashboard query (its text; a date before every event).
        dash = db.query(
            "SELECT status, count(*) AS n, sum(amount) AS total FROM orders WHERE _cdc_ts >= :since GROUP BY status",
            params={"since": "1970-01-01"},
        )
        want: dict[str, list[float]] = {}
        for r in lake.expected().values():
            want.setdefault(r["status"], []).append(float(r["amount"]))
        assert {r["status"]: (r["n"], pytest.approx(r["total"])) for r in dash} == {
            k: (len(v), pytest.approx(sum(v))) for k, v in want.items()
        }
        some = sorted(lake.expected())[0]
        one = db.query(f"SELECT _cdc_row_id AS k FROM {TABLE} WHERE _cdc_row_id = :k", params={"k": some})
        assert one.rows == [{"k": some}]
        table = db.query_arrow(f"SELECT * FROM {TABLE}", as_of=_iso(lake.s1_ms + 1))
        assert not diff(lake.expected("first"), rows_by_key(table.to_pylist()))
        with pytest.raises(lakeclient.QueryRefused, match="parsed plan of the statement holds DropTable") as refused:
            db.query(f"DROP TABLE {TABLE}")
        assert refused.value.status == 400 and not refused.value.retryable


@pytest.mark.spark
def test_lake_client_credentials_rights_and_typed_errors(
    spark: Any, connect_url: str, lake: Lake, tmp_path: Path
) -> None:
    from cdclake.client import lake as lakeclient

    f = tmp_path / "tokens.toml"
    f.write_text(
        f'[[client]]\nid = "app"\naccess = "read"\nsecret = "s3cret"\ntables = ["{lake.settings.namespace}.{TABLE}"]\n'
    )
    settings = Settings(**{**lake.settings.__dict__, "rest_tokens_file": f})
    with served(settings, connect_url) as http:
        db = lakeclient.Lake(str(http.base_url), credential="app:s3cret", http=http)
        assert db.query(f"SELECT count(*) AS n FROM {TABLE}").rows == [{"n": len(lake.expected())}]
        with pytest.raises(lakeclient.AccessDenied, match=f"may not read {lake.settings.namespace}.{TABLE}__changes"):
            db.query(f"SELECT * FROM {TABLE}__changes")
        with pytest.raises(lakeclient.AccessDenied) as denied:
            lakeclient.Lake(str(http.base_url), http=http).query("SELECT 1")
        assert denied.value.status == 401
        with pytest.raises(lakeclient.AccessDenied):
            lakeclient.Lake(str(http.base_url), credential="app:wrong", http=http).query("SELECT 1")


@pytest.mark.server
def test_lake_client_without_a_server_is_a_retryable_connection_error() -> None:
    import socket

    from cdclake.client import lake as lakeclient

    with socket.socket() as s:  # a port nothing listens on: bound, never listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        with pytest.raises(lakeclient.LakeConnectionError) as err, lakeclient.connect(f"http://127.0.0.1:{port}") as db:
            db.query("SELECT 1")
    assert err.value.retryable and err.value.status == 0


@pytest.mark.spark
def test_row_history_answers_the_row_at_any_time_after_snapshot_expiry(
    spark: Any, connect_url: str, spark_home: Path
) -> None:
    """``<table>__history`` (the query API's view of the change history, SCD type 2): the rows at a
    time between the two runs equal the reference model's after the first run, also once the
    snapshots of that time are expired and the table itself can no longer travel there."""
    old = two_run_lake(spark, spark_home, TABLE)
    ident = f"{old.ns}.{TABLE}"
    spark.sql(
        f"CALL {old.settings.catalog_name}.system.expire_snapshots(table => '{old.settings.namespace}.{TABLE}', "
        f"older_than => timestamp_millis({old.s2_ms + 1}), retain_last => 1)"
    )
    assert [r[0] for r in spark.sql(f"SELECT snapshot_id FROM {ident}.snapshots").collect()] == [old.s2]
    at_t1 = (
        f"SELECT * FROM {TABLE}__history WHERE _cdc_valid_from <= timestamp_millis(:t) "
        "AND (_cdc_valid_to IS NULL OR _cdc_valid_to > timestamp_millis(:t)) AND _cdc_operation <> 'DELETE'"
    )
    with served(old.settings, connect_url) as api:
        err = query(api, f"SELECT * FROM {TABLE}", 400, asOf=_iso(old.s1_ms + 1))["error"]["message"]
        assert "has no snapshot at that time" in err  # the table cannot go back there any more
        then = query(api, at_t1, params={"t": old.s1_ms + 1}, maxRows=10_000)
        assert not diff(old.expected("first"), rows_by_key(rows(then)))
        now = query(api, f"SELECT * FROM {TABLE}__history WHERE _cdc_is_current", maxRows=10_000)
        assert not diff(old.expected(), rows_by_key(rows(now)))
        stamps = query(api, f"SELECT DISTINCT _commit_timestamp FROM {TABLE}__history", maxRows=10)["rows"]
        assert len(stamps) == 2  # one per run
    # The same text in Spark SQL, as docs/querying.md's "Row history" gives it.
    from cdclake.query.statements import history_sql

    plain = (
        spark.sql(history_sql(old.settings.catalog_name, old.settings.namespace, TABLE))
        .where("_cdc_is_current")
        .drop("_commit_timestamp")
    )
    assert not diff(old.expected(), rows_by_key(plain.collect()))


class _Interruptible:
    """The Spark session calls deadline() makes, with a fetch that runs until its tag is interrupted."""

    def __init__(self) -> None:
        import threading

        self.tags: list[str] = []
        self.interrupted: list[str] = []
        self.stop = threading.Event()

    def addTag(self, tag: str) -> None:
        self.tags.append(tag)

    def removeTag(self, tag: str) -> None:
        self.tags.remove(tag)

    def interruptTag(self, tag: str) -> None:
        self.interrupted.append(tag)
        self.stop.set()

    def fetch(self) -> pa.Table:
        if not self.stop.wait(30):
            return pa.table({"late": [1]})
        raise RuntimeError("OPERATION_CANCELED")


def test_a_query_is_interrupted_when_cancelled_or_past_its_timeout_and_not_otherwise() -> None:
    import threading
    import time

    spark = _Interruptible()
    cancel = threading.Event()
    threading.Timer(0.2, cancel.set).start()
    t0 = time.monotonic()
    with pytest.raises(limits.Cancelled, match="client went away"), limits.deadline(spark, 60, cancel):  # type: ignore[arg-type]
        spark.fetch()
    assert time.monotonic() - t0 < 5 and len(spark.interrupted) >= 1 and spark.tags == []

    spark = _Interruptible()
    with pytest.raises(limits.TimedOut, match=r"timeout of 0\.2 s"), limits.deadline(spark, 0.2):  # type: ignore[arg-type]
        spark.fetch()
    assert len(spark.interrupted) >= 1

    spark = _Interruptible()
    table = pa.table({"x": [1]})
    with limits.deadline(spark, 5, threading.Event()):  # type: ignore[arg-type]
        answered = table
    deadline = time.monotonic() + 3
    while any(t.name.startswith("cdclake-query-") for t in threading.enumerate()):
        assert time.monotonic() < deadline, "the watcher outlived the answer"
        time.sleep(0.05)
    assert answered is table and spark.interrupted == [] and spark.tags == []


@pytest.mark.spark
def test_nothing_about_a_table_outside_the_rights_comes_back(
    spark: Any, connect_url: str, lake: Lake, tmp_path: Path
) -> None:
    """Reads the optimizer removes (``WHERE false``, ``LIMIT 0``) still need the right; an error
    about such a table (a wrong column: Spark would list its columns) is the 403 a missing table
    gets; a row history outside the rights is a missing one; a table whose name holds a dot is
    not the table before the dot."""
    ns = lake.settings.namespace
    spark.sql(f"CREATE TABLE {lake.ns}.hidden (id BIGINT, ssn STRING) USING iceberg")
    spark.sql(f"INSERT INTO {lake.ns}.hidden VALUES (1, 'x')")
    spark.sql(f"CREATE TABLE {lake.ns}.`hidden.x` (id BIGINT) USING iceberg")
    spark.sql(f"INSERT INTO {lake.ns}.`hidden.x` VALUES (7)")
    f = tmp_path / "tokens.toml"
    f.write_text(
        '[[client]]\nid = "some"\naccess = "read"\ntoken = "t-some"\n'
        f'tables = ["{ns}.{TABLE}", "{ns}.hidden"]\n'
        '[[client]]\nid = "none"\naccess = "read"\ntoken = "t-none"\n'
        f'tables = ["{ns}.{TABLE}"]\n'
    )
    settings = Settings(**{**lake.settings.__dict__, "rest_tokens_file": f})
    some, none = {"Authorization": "Bearer t-some"}, {"Authorization": "Bearer t-none"}
    with served(settings, connect_url) as api:

        def ask(sql: str, who: dict[str, str], path: str = "/v1/query") -> tuple[int, str]:
            r = api.post(path, json={"sql": sql}, headers=who)
            return r.status_code, r.text

        assert ask("SELECT * FROM hidden WHERE 1 = 0", some)[0] == 200  # the right: answered
        for sql in ("SELECT * FROM hidden WHERE 1 = 0", "SELECT * FROM hidden LIMIT 0", "SELECT zzz FROM hidden"):
            for path in ("/v1/query", "/v1/query/plan"):
                status, text = ask(sql, none, path)
                assert status == 403 and "ssn" not in text, (sql, path, text)
                assert ask(sql.replace("hidden", "nothere"), none, path) == (
                    403,
                    text.replace(f"{ns}.hidden", f"{ns}.nothere"),
                ), (sql, path)
        f.write_text(f.read_text().replace(f'tables = ["{ns}.{TABLE}"]\n', f'tables = ["{ns}.zzz"]\n', 1))
    settings = Settings(**{**lake.settings.__dict__, "rest_tokens_file": f})
    with served(settings, connect_url) as api:
        # orders has a change history, nothere none: the same answer for both.
        for name in (TABLE, "nothere"):
            r = api.post("/v1/query", json={"sql": f"SELECT * FROM {name}__history"}, headers=some)
            assert r.status_code == 403 and f"may not read {ns}.{name}__history" in r.text, r.text
        r = api.post("/v1/query", json={"sql": "SELECT * FROM `hidden.x`"}, headers=some)
        assert r.status_code == 403 and f"may not read {ns}.hidden.x" in r.text, r.text
        assert api.post("/v1/query", json={"sql": "SELECT * FROM hidden"}, headers=some).status_code == 200


EXTENDED = """== Parsed Logical Plan ==
CTE [c]
:  +- 'SubqueryAlias c
:     +- 'UnresolvedRelation [secret], [], false
+- 'Project [*]
   +- 'UnresolvedRelation [c], [], false

== Analyzed Logical Plan ==
org.apache.spark.sql.AnalysisException: [UNRESOLVED_COLUMN.WITH_SUGGESTION] ... Did you mean [`id`, `ssn`];
'Project ['zzz]
+- SubqueryAlias lake.cdc.secret
   +- RelationV2[id#31L, we] ird x#32] lake.cdc.`a.b``c` VERSION AS OF '17'
   +- RelationV2[committed_at#8] lake.cdc.secret.snapshots
   +- 'UnresolvedRelation [cdc, nope], [], false
   +- 'UnresolvedRelation [c], [], false

== Optimized Logical Plan ==
RelationV2[id#1L] lake.cdc.other
"""


def test_touched_relations_from_the_analyzed_plan() -> None:
    from cdclake.query import relations

    got = relations.touched(EXTENDED)
    assert got is not None and got.failed
    assert got.resolved == [
        ["lake", "cdc", "a.b`c"],
        ["lake", "cdc", "secret", "snapshots"],
    ]  # not the optimized plan's
    assert got.unresolved == [["cdc", "nope"]]  # c is the statement's own CTE
    assert relations.table_of(["lake", "cdc", "secret", "snapshots"], "lake", "cdc") == ("cdc", "secret")
    assert relations.table_of(["lake", "cdc", "a.b`c"], "lake", "cdc") == ("cdc", "a.b`c")
    assert relations.table_of(["lake", "cdc", "orders", "t"], "lake", "cdc") == ("cdc.orders", "t")
    assert relations.table_of(["spark_catalog", "default", "t"], "lake", "cdc") is None
    assert relations.table_of(["t"], "lake", "cdc") == ("cdc", "t")
    assert relations.touched("Error occurred during query planning: \n...") is None


@pytest.mark.server
def test_an_engine_out_of_reach_is_a_503_soon_and_frees_the_slot(tmp_path: Path) -> None:
    """The Spark Connect server is down: the statement is answered 503 within seconds (pyspark
    alone would retry for 10 minutes, holding the statement's slot), and the slot comes back."""
    import time

    from cdclake.dev.stack import free_port
    from tests.support import make_settings

    settings = make_settings(tmp_path, query_max_concurrent=1)
    with served(settings, f"sc://127.0.0.1:{free_port()}") as api:
        for _ in range(2):  # the second would be a 429 if the first had kept its slot
            t0 = time.monotonic()
            r = api.post("/v1/query", json={"sql": "SELECT 1"})
            assert r.status_code == 503 and "not reachable" in r.json()["error"]["message"], r.text
            assert time.monotonic() - t0 < 30


@pytest.mark.spark
@pytest.mark.parametrize("where", ["WHERE false", ""])
def test_nested_and_map_columns_answer_empty_or_not(api: httpx.Client, where: str) -> None:
    """An empty answer with a map column read from Spark Connect crashed the server's process
    (pyarrow's ``Table.nbytes`` on it: a segmentation fault, the connection gone)."""
    sql = (
        "SELECT map('a', 1) AS m, array(1, 2) AS a, named_struct('x', 1) AS st, "
        f"CAST(1.5 AS DECIMAL(10,2)) AS d, X'00' AS b, current_date() AS dt {where}"
    )
    got = query(api, sql)
    assert got["rowCount"] == (0 if where else 1)
    if not where:
        assert got["rows"][0][:4] == [{"a": 1}, [1, 2], {"x": 1}, "1.50"]
    r = api.post("/v1/query", json={"sql": sql, "format": "arrow"})
    assert r.status_code == 200 and pyarrow.ipc.open_stream(io.BytesIO(r.content)).read_all().num_rows == len(
        got["rows"]
    )
