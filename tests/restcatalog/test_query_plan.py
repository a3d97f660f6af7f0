"""``POST /v1/query/plan`` (restcatalog/plan.py over cdclake/query/plans.py and filters.py): the
data files a query would read, checked against an independent reference (the table's ``files``
metadata table, or pyiceberg's ``inspect.files`` of a snapshot, filtered here in Python), never
fewer than Iceberg reads when the pushed filters' text reads more than one way; the same checks,
rights and errors as ``POST /v1/query``.

The filter texts below are the ones Iceberg 1.12 printed for these predicates on Spark 4.1 (run
against a real table while this was written): names unquoted, strings unescaped."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.testclient import TestClient

from cdclake.config.settings import Settings
from cdclake.lake.catalog import load_table
from cdclake.query import filters, plans
from restcatalog.app import create_app
from tests.support import fresh_settings
from tests.support.query import served

ODD = "rég`ion x.y"  # a partition column whose name needs quoting in SQL: unicode, backtick, space, dot
ODD_SQL = "`rég``ion x.y`"

# ---------------------------------------------------------------- pure parts (no Spark)


def _types() -> dict[str, Any]:
    from pyiceberg.types import DateType, DecimalType, DoubleType, IntegerType, LongType, StringType, TimestampType

    return {
        "id": LongType(),
        "my col": StringType(),
        "a.b": IntegerType(),
        "bq`x": StringType(),
        "é": StringType(),
        "d": DateType(),
        "ts": TimestampType(),
        "dec": DecimalType(10, 2),
        "f": DoubleType(),
        "name": StringType(),
    }


def _expr(text: str) -> tuple[str, list[str]]:
    types = _types()
    cols = {n: filters.Column(n, t) for n, t in types.items()}
    e, ignored = filters.expression(text, cols, types)
    return repr(e), ignored


@pytest.mark.parametrize(
    ("text", "want"),
    [  # (what Iceberg printed, what it means)
        ("id IS NOT NULL, id = 5", "EqualTo(term=Reference(name='id'), literal=LongLiteral(5))"),
        ("my col IS NOT NULL, my col = 'x'", "EqualTo(term=Reference(name='my col'), literal=literal('x'))"),
        ("a.b IS NOT NULL, a.b > 1", "GreaterThan(term=Reference(name='a.b'), literal=LongLiteral(1))"),
        ("bq`x IS NOT NULL, bq`x = 'q'", "EqualTo(term=Reference(name='bq`x'), literal=literal('q'))"),
        ("é IS NOT NULL, é = 'é'", "EqualTo(term=Reference(name='é'), literal=literal('é'))"),
        ("d IS NOT NULL, d >= 20455", "GreaterThanOrEqual(term=Reference(name='d'), literal=DateLiteral(20455))"),
        (
            "ts >= 1767312000000000",
            "Reference(name='ts'), literal=TimestampLiteral(1767312000000000))",
        ),
        ("dec IS NOT NULL, dec = 1.50", "literal=DecimalLiteral(Decimal('1.50'))"),
        ("(f > 1.5 OR name IS NULL)", "Or(left=GreaterThan(term=Reference(name='f'), literal=DoubleLiteral(1.5))"),
        ("name IS NOT NULL, NOT (name = 'c')", "Not(child=EqualTo(term=Reference(name='name'), literal=literal('c')))"),
        ("name IS NOT NULL, name LIKE 'ab%'", "StartsWith(term=Reference(name='name'), literal=literal('ab'))"),
        ("name = 'a\\b'", "literal=literal('a\\\\b')"),
        ("is_nan(f)", "IsNaN(term=Reference(name='f'))"),
    ],
)
def test_each_filter_form_iceberg_prints_translates(text: str, want: str) -> None:
    got, ignored = _expr(text)
    assert want in got and not ignored, got


def test_a_text_that_reads_two_ways_keeps_the_files_of_both() -> None:
    # The value "a', id = 5, name = 'b" prints exactly like three predicates.
    got, _ = _expr("name = 'a', id = 5, name = 'b'")
    assert got.startswith("Or(") and "literal(\"a', id = 5, name = 'b\")" in got
    assert "EqualTo(term=Reference(name='id'), literal=LongLiteral(5))" in got
    # A quote inside one value, no other reading: the value as it is.
    got, _ = _expr("name IS NOT NULL, name = 'it's, x = 'y'")
    assert "literal(\"it's, x = 'y\")" in got and not got.startswith("Or(")


def test_what_cannot_be_translated_is_read_as_true_never_guessed() -> None:
    got, ignored = _expr("bucket[16](id) = 3, id = 4")
    assert got == "EqualTo(term=Reference(name='id'), literal=LongLiteral(4))" and ignored == ["bucket[16](id) = 3"]
    got, ignored = _expr("(bucket[16](id) = 3 OR id = 4)")  # an OR over an unknown: unknown
    assert got == "AlwaysTrue()" and ignored
    got, ignored = _expr("NOT (truncate[2](name) = 'ab')")
    assert got == "AlwaysTrue()" and ignored
    # Under a NOT an AND with an unknown side is unknown: NOT (x AND y) is wider than NOT y.
    got, ignored = _expr("NOT ((bucket[16](id) = 3 AND id = 4))")
    assert got == "AlwaysTrue()" and ignored
    with pytest.raises(filters.NotUnderstood, match="not a filter Iceberg prints"):
        _expr("nosuch = 3")
    with pytest.raises(filters.NotUnderstood, match="ways"):
        _expr("name IN (" + ", ".join(f"'v{i}'" for i in range(12)) + ")")  # 2^11 readings


def test_scan_texts_take_each_scan_and_its_filters_from_the_plan() -> None:
    plan = (
        "(1) BatchScan lake.t.odd\nOutput [2]: [id#4L, my col#5]\n"
        "IcebergScan(table=lake.t.odd, schemaId=0, snapshotId=42, branch=null, "
        "filters=my col IS NOT NULL, my col = 'x', runtimeFilters=, groupedBy=)\n\n"
        "(2) BatchScan lake.t.odd\nOutput [1]: [id#6L]\n"
        "IcebergScan(table=lake.t.odd, schemaId=0, snapshotId=42, branch=null, "
        "filters=name = 'a, runtimeFilters=b', runtimeFilters=, groupedBy=)\n\n"
        "(3) BatchScan lake.t.odd.snapshots\nOutput [1]: [x#7L]\n"
        "IcebergScan(table=lake.t.odd.snapshots, schemaId=null, snapshotId=null, branch=null, filters=, "
        "runtimeFilters=, groupedBy=)\n"
    )
    assert plans.scan_texts(plan) == [
        plans.ScanText("lake.t.odd", 0, 42, "my col IS NOT NULL, my col = 'x'"),
        plans.ScanText("lake.t.odd", 0, 42, None),  # where the filters end cannot be told
        plans.ScanText("lake.t.odd.snapshots", None, None, ""),
    ]


def test_without_an_engine_the_plan_says_what_it_needs(tmp_path: Path) -> None:
    from tests.support import make_settings

    with TestClient(create_app(make_settings(tmp_path, spark_connect_url=""))) as api:
        r = api.post("/v1/query/plan", json={"sql": "SELECT 1"})
        assert r.status_code == 503 and "CDCLAKE_SPARK_CONNECT_URL" in r.text
        r = api.post("/v1/query/plan", json={"sql": "SELECT 1", "maxRows": 5})  # only a run has rows
        assert r.status_code == 400 and "maxRows" in r.text


# ---------------------------------------------------------------- on real tables


@dataclass
class Tables:
    settings: Settings
    s1: int  # events after its first insert


REGIONS = ("eu", "us", "ap")


@pytest.fixture(scope="module")
def tables(spark: Any, spark_home: Path) -> Tables:
    """``events`` partitioned by region (three inserts: three files in each of three partitions)
    and ``odd`` partitioned by a column with an awkward name."""
    settings = fresh_settings(spark_home)
    ns = f"{settings.catalog_name}.{settings.namespace}"
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {ns}")
    spark.sql(
        f"CREATE TABLE {ns}.events (id bigint, region string, amount double) USING iceberg PARTITIONED BY (region)"
    )
    for run in range(3):
        values = ", ".join(f"({run * 10 + i}, '{r}', {i}.5)" for i, r in enumerate(REGIONS))
        spark.sql(f"INSERT INTO {ns}.events VALUES {values}")
        if run == 0:
            t = load_table(settings, "events")
            assert t is not None and t.current_snapshot() is not None
            s1 = t.current_snapshot().snapshot_id  # type: ignore[union-attr]
    spark.sql(f"CREATE TABLE {ns}.odd (id bigint, {ODD_SQL} string) USING iceberg PARTITIONED BY ({ODD_SQL})")
    for run in range(2):
        spark.sql(f"INSERT INTO {ns}.odd VALUES ({run}, 'a'), ({run + 10}, 'b'), ({run + 20}, 'c')")
    return Tables(settings, s1)


@pytest.fixture()
def api(connect_url: str, tables: Tables) -> Iterator[httpx.Client]:
    with served(tables.settings, connect_url) as c:
        yield c


def plan(api: httpx.Client, sql: str, status: int = 200, **body: Any) -> dict[str, Any]:
    r = api.post("/v1/query/plan", json={"sql": sql, **body})
    assert r.status_code == status, r.text
    out: dict[str, Any] = r.json()
    return out


def reference(spark: Any, tables: Tables, table: str, column: str) -> dict[str, str]:
    """file path -> its partition value, from the table's ``files`` metadata table (Spark)."""
    ns = f"{tables.settings.catalog_name}.{tables.settings.namespace}"
    rows = spark.sql(f"SELECT file_path, partition FROM {ns}.{table}.files").collect()
    return {r["file_path"]: r["partition"][column] for r in rows}


def only_scan(answer: dict[str, Any]) -> dict[str, Any]:
    assert len(answer["scans"]) == 1, answer["scans"]
    scan: dict[str, Any] = answer["scans"][0]
    return scan


@pytest.mark.spark
def test_a_partition_predicate_keeps_the_files_of_that_partition(spark: Any, tables: Tables, api: httpx.Client) -> None:
    every = reference(spark, tables, "events", "region")
    eu = {p for p, region in every.items() if region == "eu"}
    got = plan(api, "SELECT * FROM events WHERE region = :r AND amount > 0", params={"r": "eu"})
    scan = only_scan(got)
    assert "BatchScan" in got["plan"] and "region = 'eu'" in scan["filters"]
    assert scan["pruned"] is True and scan["reason"] is None
    assert {f["path"] for f in scan["files"]} == eu and 0 < len(eu) < len(every)
    assert {f["partition"]["region"] for f in scan["files"]} == {"eu"} and scan["partitions"] == [{"region": "eu"}]
    assert all(f["recordCount"] == 1 and f["fileSizeBytes"] > 0 for f in scan["files"])
    totals = scan["totals"]
    assert totals["filesKept"] == len(eu) and totals["filesInSnapshot"] == len(every)
    assert 0 < totals["bytesKept"] < totals["bytesInSnapshot"]


@pytest.mark.spark
def test_no_predicate_keeps_every_file(spark: Any, tables: Tables, api: httpx.Client) -> None:
    scan = only_scan(plan(api, "SELECT id FROM events"))
    assert scan["filters"] == "" and scan["pruned"] is True
    assert {f["path"] for f in scan["files"]} == set(reference(spark, tables, "events", "region"))
    assert scan["totals"]["filesKept"] == scan["totals"]["filesInSnapshot"] == 9


@pytest.mark.spark
def test_a_column_name_needing_quotes_is_translated_exactly(spark: Any, tables: Tables, api: httpx.Client) -> None:
    every = reference(spark, tables, "odd", ODD)
    scan = only_scan(plan(api, f"SELECT * FROM odd WHERE {ODD_SQL} = 'b'"))
    assert f"{ODD} = 'b'" in scan["filters"]  # printed bare, as it is
    kept = {f["path"] for f in scan["files"]}
    assert scan["pruned"] is True, scan["reason"]
    assert kept == {p for p, v in every.items() if v == "b"} and len(kept) < len(every)
    assert scan["partitions"] == [{ODD: "b"}]


@pytest.mark.spark
def test_a_value_that_prints_like_more_filters_never_loses_files(spark: Any, tables: Tables, api: httpx.Client) -> None:
    """``region >= "a', region = 'eu"`` prints as ``region >= 'a', region = 'eu'``: read the first
    way Iceberg keeps every region from "a..." up (eu and us), read the second only eu."""
    value = "a', region = 'eu"
    every = reference(spark, tables, "events", "region")
    scan = only_scan(plan(api, "SELECT * FROM events WHERE region >= :v", params={"v": value}))
    assert scan["filters"] == f"region IS NOT NULL, region >= '{value}'"
    kept = {f["path"] for f in scan["files"]}
    assert kept >= {p for p, region in every.items() if region >= value}
    assert {every[p] for p in kept} >= {"eu", "us"}


@pytest.mark.spark
def test_as_of_lists_the_files_of_that_snapshot(tables: Tables, api: httpx.Client) -> None:
    t = load_table(tables.settings, "events")
    assert t is not None
    then = {str(p) for p in t.inspect.files(snapshot_id=tables.s1)["file_path"].to_pylist()}
    now = {str(p) for p in t.inspect.files()["file_path"].to_pylist()}
    assert len(then) < len(now)
    scan = only_scan(plan(api, "SELECT * FROM events", asOf=tables.s1))
    assert scan["snapshotId"] == tables.s1
    assert {f["path"] for f in scan["files"]} == then and scan["totals"]["filesInSnapshot"] == len(then)


@pytest.mark.spark
def test_the_checks_and_errors_of_the_query_api(tables: Tables, api: httpx.Client) -> None:
    assert "plan of the statement holds DropTable" in plan(api, "DROP TABLE events", 400)["error"]["message"]
    assert "table name '/etc/passwd'" in plan(api, "SELECT * FROM json.`/etc/passwd`", 400)["error"]["message"]
    ns = tables.settings.namespace
    err = plan(api, f"SELECT * FROM {ns}.events", 400, asOf=tables.s1)["error"]["message"]
    assert "would read events at snapshot" in err
    assert plan(api, "SELECT * FROM events", 408, timeoutS=1e-9)["error"]["type"] == "QueryTimeoutException"
    assert "format" in plan(api, "SELECT 1", 400, format="arrow")["error"]["message"]


@pytest.mark.spark
def test_a_client_without_the_right_learns_nothing_of_the_files(
    spark: Any, connect_url: str, tables: Tables, tmp_path: Path
) -> None:
    f = tmp_path / "tokens.toml"
    f.write_text(
        f'[[client]]\nid = "odd"\naccess = "read"\ntoken = "t-odd"\ntables = ["{tables.settings.namespace}.odd"]\n'
    )
    settings = Settings(**{**tables.settings.__dict__, "rest_tokens_file": f})
    with served(settings, connect_url) as api:
        sql = {"sql": "SELECT * FROM events WHERE region = 'eu'"}
        assert api.post("/v1/query/plan", json=sql).status_code == 401
        r = api.post("/v1/query/plan", json=sql, headers={"Authorization": "Bearer t-odd"})
        assert r.status_code == 403 and "may not read" in r.text
        assert list(r.json()) == ["error"] and ".parquet" not in r.text
        ok = api.post("/v1/query/plan", json={"sql": "SELECT * FROM odd"}, headers={"Authorization": "Bearer t-odd"})
        assert ok.status_code == 200 and len(ok.json()["scans"][0]["files"]) == 6


@pytest.mark.spark
def test_lake_client_plan(spark: Any, connect_url: str, tables: Tables) -> None:
    from cdclake.client import lake as lakeclient

    with served(tables.settings, connect_url) as http:
        db = lakeclient.Lake(str(http.base_url), http=http)
        got = db.plan("SELECT * FROM events WHERE region = :r", params={"r": "us"}, as_of=tables.s1)
        scan = only_scan(got)
        assert scan["snapshotId"] == tables.s1 and [f["partition"] for f in scan["files"]] == [{"region": "us"}]
        with pytest.raises(lakeclient.QueryRefused, match="parsed plan of the statement holds DropTable"):
            db.plan("DROP TABLE events")
