"""Engines over the REST catalog: a table the pipeline wrote (Spark, JDBC catalog) reads the same
through Spark's JDBC catalog, Spark's REST catalog, pyiceberg's RestCatalog and DuckDB, now and
at an older snapshot (by id and by time); Spark writes through REST (MERGE INTO, compaction)."""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import importlib
import itertools
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cdclake.config.settings import Settings
from cdclake.dev.workload import generate
from cdclake.lake.catalog import open_catalog
from tests.support import apply_all, stage
from tests.support.rest import TOKENS, counter, rest_catalog, serve

pytestmark = pytest.mark.spark

_names = itertools.count()


def canon(value: Any) -> Any:
    """One spelling per value across engines: UTC-naive ISO times, decimals as floats."""
    if hasattr(value, "asDict"):
        value = value.asDict(recursive=True)
    if isinstance(value, dict):
        return tuple(sorted((k, canon(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return tuple(canon(v) for v in value)
    if isinstance(value, datetime.datetime):
        if value.tzinfo is not None:
            value = value.astimezone(datetime.UTC).replace(tzinfo=None)
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return float(value)
    return value


def rows(records: list[Any]) -> list[Any]:
    return sorted((canon(r) for r in records), key=repr)


def duckdb_connection() -> Any:
    """DuckDB with the iceberg, avro and httpfs extensions from their wheels: no download."""
    import duckdb

    con = duckdb.connect(config={"autoinstall_known_extensions": False, "autoload_known_extensions": False})
    for name in ("httpfs", "avro", "iceberg"):
        pkg = importlib.import_module(f"duckdb_extension_{name}")
        path = Path(pkg.__file__ or "").parent / "extensions" / f"v{duckdb.__version__}" / f"{name}.duckdb_extension"
        con.execute(f"LOAD '{path}'")
    return con


@pytest.fixture()
def rest(settings: Settings) -> Iterator[tuple[str, Settings]]:
    """A REST catalog over the Spark session's JDBC catalog, with client credentials."""
    tokens = Path(settings.staging_dir).parent / f"rest-tokens-{settings.namespace}.toml"
    tokens.write_text(TOKENS)
    rs = dataclasses.replace(settings, rest_tokens_file=tokens)
    with serve(rs) as (url, app):
        yield url, rs
        # Whatever Spark, pyiceberg and DuckDB sent, the server never failed on it.
        text = app.state.metrics.render()
        assert not re.findall(r'status="5\d\d"', text), text


def attach_rest(spark: Any, url: str) -> str:
    """A Spark catalog of type rest, added to the running session (catalogs load by name on
    first use; a fresh name per server)."""
    name = f"rest{next(_names)}"
    conf = {
        "": "org.apache.iceberg.spark.SparkCatalog",
        ".type": "rest",
        ".uri": url,
        ".credential": "writer:wsecret",
        ".oauth2-server-uri": f"{url}/v1/oauth/tokens",
        ".scope": "catalog",
        ".warehouse": "lake",
    }
    for key, value in conf.items():
        spark.conf.set(f"spark.sql.catalog.{name}{key}", value)
    return name


def test_four_engines_agree_now_and_back_then(spark: Any, settings: Settings, rest: tuple[str, Settings]) -> None:
    url, _ = rest
    ns, table = settings.namespace, "customers"
    w = generate(events=240, seed=11, tables=(table,))
    half = len(w.batches) // 2
    stage(settings, w.batches[:half])
    apply_all(spark, settings)
    old = open_catalog(settings).load_table((ns, table)).current_snapshot()
    assert old is not None
    stage(settings, w.batches[half:])
    apply_all(spark, settings)
    current = open_catalog(settings).load_table((ns, table)).current_snapshot()
    assert current is not None and current.snapshot_id != old.snapshot_id
    at = datetime.datetime.fromtimestamp(old.timestamp_ms / 1000, datetime.UTC).replace(tzinfo=None)
    at_sql = at.isoformat(sep=" ", timespec="milliseconds")

    rc = attach_rest(spark, url)
    py = rest_catalog(url).load_table(f"{ns}.{table}")
    duck = duckdb_connection()
    duck.execute(
        f"CREATE SECRET rest_secret (TYPE iceberg, CLIENT_ID 'reader', CLIENT_SECRET 'rsecret', "
        f"OAUTH2_SERVER_URI '{url}/v1/oauth/tokens')"
    )
    duck.execute(f"ATTACH 'lake' AS lake (TYPE iceberg, ENDPOINT '{url}', SECRET rest_secret)")

    def duck_rows(clause: str = "") -> list[Any]:
        # Through Arrow: DuckDB's own conversion of TIMESTAMPTZ to Python wants pytz.
        return rows(duck.execute(f"SELECT * FROM lake.{ns}.{table} {clause}").fetch_arrow_table().to_pylist())

    def spark_rows(catalog: str, clause: str = "") -> list[Any]:
        return rows(spark.sql(f"SELECT * FROM {catalog}.{ns}.{table} {clause}").collect())

    cases = {
        "current": (
            "",
            "",
            py.scan().to_arrow().to_pylist(),
        ),
        "snapshot id": (
            f"VERSION AS OF {old.snapshot_id}",
            f"AT (VERSION => {old.snapshot_id})",
            py.scan(snapshot_id=old.snapshot_id).to_arrow().to_pylist(),
        ),
        "timestamp": (
            f"TIMESTAMP AS OF '{at_sql}'",
            f"AT (TIMESTAMP => TIMESTAMPTZ '{at_sql}+00')",
            py.scan(snapshot_id=py.snapshot_as_of_timestamp(old.timestamp_ms).snapshot_id).to_arrow().to_pylist(),
        ),
    }
    seen = {}
    for case, (spark_clause, duck_clause, py_rows) in cases.items():
        via = {
            "spark jdbc": spark_rows(settings.catalog_name, spark_clause),
            "spark rest": spark_rows(rc, spark_clause),
            "pyiceberg rest": rows(py_rows),
            "duckdb rest": duck_rows(duck_clause),
        }
        reference = via["spark jdbc"]
        assert reference, case
        for engine, got in via.items():
            assert got == reference, f"{case}: {engine} differs from Spark JDBC ({len(got)} vs {len(reference)} rows)"
        seen[case] = reference
    assert seen["snapshot id"] == seen["timestamp"] != seen["current"]


def test_spark_writes_through_rest(spark: Any, settings: Settings, rest: tuple[str, Settings]) -> None:
    url, _ = rest
    ns = settings.namespace
    rc = attach_rest(spark, url)
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {rc}.{ns}")
    spark.sql(f"CREATE TABLE {rc}.{ns}.m (id BIGINT, v STRING) USING iceberg")
    for i in range(3):  # several small files for compaction to join
        spark.sql(f"INSERT INTO {rc}.{ns}.m VALUES ({i}, 'v{i}'), ({i + 10}, 'w{i}')")
    spark.sql(
        f"""MERGE INTO {rc}.{ns}.m t
            USING (SELECT * FROM VALUES (1, 'merged'), (99, 'new') AS s(id, v)) s
            ON t.id = s.id
            WHEN MATCHED THEN UPDATE SET v = s.v
            WHEN NOT MATCHED THEN INSERT *"""
    )
    spark.sql(f"DELETE FROM {rc}.{ns}.m WHERE id = 10")
    expected = {0: "v0", 1: "merged", 2: "v2", 11: "w1", 12: "w2", 99: "new"}
    result = spark.sql(
        f"CALL {rc}.system.rewrite_data_files(table => '{ns}.m', options => map('min-input-files', '2'))"
    )
    assert result.collect()[0]["rewritten_data_files_count"] >= 2
    # The JDBC catalog, pyiceberg (direct SQL catalog) and DuckDB see the REST writes.
    via_jdbc = {r["id"]: r["v"] for r in spark.sql(f"SELECT * FROM {settings.catalog_name}.{ns}.m").collect()}
    direct = open_catalog(settings).load_table((ns, "m"))
    via_pyiceberg = {r["id"]: r["v"] for r in direct.scan().to_arrow().to_pylist()}
    assert via_jdbc == via_pyiceberg == expected
    ops = [s.summary.operation.value for s in direct.snapshots() if s.summary]
    assert ops[-1] == "replace", ops
    duck = duckdb_connection()
    duck.execute(f"ATTACH 'lake' AS lake (TYPE iceberg, ENDPOINT '{url}', TOKEN 'static-reader')")
    assert dict(duck.execute(f"SELECT id, v FROM lake.{ns}.m").fetchall()) == expected
    assert counter(url, "cdclake_rest_commits_total") >= 6
