"""TRUNCATE from a real Debezium Server 3.6.0.Final (issue 29, item 5), on the properties
``cdclake debezium`` writes (``skipped.operations=none``): PostgreSQL 15 (``pgoutput``) and
MariaDB 10.11 (binlog) both send op ``t``; the receiver takes it and one apply leaves the
source's rows, no more: what the table held before the TRUNCATE is gone, the re-inserts after
it are there, ``__changes`` logs it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cdclake.dev.stack import free_port
from cdclake.lake.spark import table_ident
from tests.support import fresh_settings
from tests.support.debezium_server import LogicalPostgres, MariaDB, Pipeline, fail_fast_sink, missing, running

pytestmark = [
    pytest.mark.debezium,
    pytest.mark.e2e,
    pytest.mark.skipif(missing() is not None, reason=missing() or ""),
]

SCHEMA = "CREATE TABLE t (id int PRIMARY KEY, v varchar(20)); CREATE TABLE marks (id int PRIMARY KEY);"
SNAPSHOT = "INSERT INTO t VALUES (1, 'a'), (2, 'b'), (3, 'c');"
STREAM = [
    "INSERT INTO t VALUES (4, 'd')",
    "UPDATE t SET v = 'a2' WHERE id = 1",
    "TRUNCATE TABLE t",
    "INSERT INTO t VALUES (2, 'b2'), (5, 'e')",
    "INSERT INTO marks VALUES (1)",
]


@pytest.fixture(params=["postgres", "mariadb"])
def source(request: pytest.FixtureRequest) -> Iterator[LogicalPostgres | MariaDB]:
    if request.param == "postgres":
        with running(LogicalPostgres(), "trunc", SCHEMA + SNAPSHOT) as pg:
            yield pg
    else:
        with running(MariaDB(), "trunc", SCHEMA + SNAPSHOT) as maria:
            yield maria


def test_truncate_lands(source: LogicalPostgres | MariaDB, tmp_path: Path, spark_home: Path, spark: Any) -> None:
    from spark_jobs.apply import apply_table

    tables = ["t", "marks"]
    db = (
        source.database("trunc", tables)
        if isinstance(source, LogicalPostgres)
        else source.database("trunc", tables, 5431)
    )
    settings = fresh_settings(spark_home, receiver_port=free_port())
    p = Pipeline(tmp_path, settings, db, fail_fast_sink(settings.receiver_url), f"trunc_{db.kind}")
    p.start()
    try:
        for stmt in STREAM:
            source.sql(stmt, "trunc")
        assert p.caught_up(1), p.failures()
        staged = p.staged()["t"]
    finally:
        p.stop()
    assert [e["operation"] for e in staged].count("TRUNCATE") == 1
    apply_table(spark, settings, "t", 10_000)
    got = {r["id"]: r["v"] for r in spark.table(table_ident(settings, "t")).collect()}
    want = {r["id"]: r["v"] for r in source.rows("t", "id", "trunc")}
    assert got == want == {2: "b2", 5: "e"}
    log = spark.table(table_ident(settings, "t__changes")).where("_cdc_operation = 'TRUNCATE'").collect()
    assert [(r["_cdc_row_id"], r["_cdc_outcome"]) for r in log] == [("*", "applied")]
