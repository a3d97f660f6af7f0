"""``cdclake debezium --discover`` asks the source itself for each captured table's primary key
and column types (Debezium's HTTP sink never sends the record key; without schemas it sends no
types): real PostgreSQL 15 and MariaDB servers with tests/support/debezium_workload.py's tables, as the
user Debezium connects as. Expected keys are the workload's; expected types come from the kinds
of tests/support/debezium_expect.py, written down independently of the code under test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cdclake.debezium.config import Database
from cdclake.debezium.discover import DiscoveryError, discover, mysql_type, postgres_type
from tests.support import debezium_expect as expect
from tests.support import debezium_workload as w
from tests.support import make_settings
from tests.support.debezium_server import DBZ_PASSWORD, LogicalPostgres, MariaDB, missing, running

# The canonical type each kind of debezium_expect.py must be declared as.
KIND_TYPE = {
    "int": "int",
    "long": "bigint",
    "decimal": "decimal(38,18)",
    "timestamp": "timestamp_ntz",
    "timestamptz": "timestamp",
    "json": "string",
}
TABLES = ["customers", "accounts", "order_lines", "tenant_users"]


def want_types(kinds: dict[str, str]) -> dict[str, str]:
    return {c: KIND_TYPE.get(k, k) for c, k in kinds.items()}


@pytest.fixture(scope="module")
def pg() -> Iterator[LogicalPostgres]:
    with running(LogicalPostgres(), "disc", w.PG_SCHEMA) as server:
        yield server


@pytest.fixture(scope="module")
def maria() -> Iterator[MariaDB]:
    with running(MariaDB(), "disc", w.MARIA_SCHEMA) as server:
        yield server


@pytest.mark.debezium
@pytest.mark.e2e
@pytest.mark.skipif(missing() is not None, reason=missing() or "")
@pytest.mark.parametrize("source", ["pg", "mariadb"])
def test_discover_reads_primary_keys_and_column_types_from_the_source(
    source: str, request: pytest.FixtureRequest
) -> None:
    if source == "pg":
        db = request.getfixturevalue("pg").database("disc", TABLES)
        prefix, kinds = "public.", expect.PG
    else:
        db = request.getfixturevalue("maria").database("disc", TABLES, 5499)
        prefix, kinds = "disc.", expect.MARIADB
    found = discover(db)
    assert found.keys == {f"{prefix}{t}": w.KEYS[t] for t in TABLES}
    for table in ("customers", "accounts"):
        assert found.types[f"{prefix}{table}"] == want_types(kinds[table]), table
    if source == "mariadb":  # json is text to MariaDB: the customers' tags come as a string
        assert found.types["disc.customers"]["tags"] == "string"


@pytest.mark.debezium
@pytest.mark.e2e
@pytest.mark.skipif(missing() is not None, reason=missing() or "")
def test_discover_names_a_missing_table_and_a_wrong_password(pg: LogicalPostgres) -> None:
    import dataclasses

    db = Database("postgres", "127.0.0.1", pg.port, "dbz", DBZ_PASSWORD, "disc", ("public.nope",))
    with pytest.raises(DiscoveryError, match=r"'public\.nope': not found"):
        discover(db)
    with pytest.raises(DiscoveryError, match="cannot connect to postgres") as err:
        discover(dataclasses.replace(db, password="wrong-secret"))
    assert "wrong-secret" not in str(err.value)


@pytest.mark.parametrize(
    ("args", "want"),
    [
        (("numeric", -1), "decimal(38,18)"),
        (("numeric", (12 << 16 | 3) + 4), "decimal(12,3)"),
        (("numeric", (40 << 16 | 2) + 4), "string"),  # past decimal(38): text, as with a schema
        (("_int4", -1, False, "int4"), "array<int>"),
        (("mood", -1, True), "string"),
        (("money", -1), "decimal(38,2)"),  # decimal.handling.mode=string: its text, 2 digits
        (("tsrange", -1), None),
    ],
)
def test_postgres_types(args: tuple[Any, ...], want: str | None) -> None:
    assert postgres_type(*args) == want


@pytest.mark.parametrize(
    ("args", "want"),
    [
        (("tinyint", "tinyint(1)", 3, 0), "int"),
        (("int", "int(10) unsigned", 10, 0), "bigint"),
        (("bigint", "bigint(20) unsigned", 20, 0), "decimal(20,0)"),  # bigint.unsigned.handling.mode=precise
        (("decimal", "decimal(65,2)", 65, 2), "string"),
        (("datetime", "datetime(6)", None, None), "timestamp_ntz"),
        (("bit", "bit(1)", 1, None), None),
        (("enum", "enum('a','b')", None, None), "string"),
    ],
)
def test_mysql_types(args: tuple[Any, ...], want: str | None) -> None:
    assert mysql_type(*args) == want


@pytest.mark.debezium
@pytest.mark.e2e
@pytest.mark.skipif(missing() is not None, reason=missing() or "")
def test_cdclake_debezium_discover_no_schemas_writes_keys_types_and_the_modes(
    pg: LogicalPostgres, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from cdclake.cli.main import main
    from cdclake.config.tables import load_table_config

    monkeypatch.setenv("CDCLAKE_DB_PASSWORD", DBZ_PASSWORD)
    out, config = tmp_path / "config" / "application.properties", tmp_path / "tables.toml"
    argv = ["debezium", "postgres", f"--port={pg.port}", "--user=dbz", "--database=disc", "--discover"]
    argv += ["--table=public.accounts,public.order_lines", "--key=public.accounts=id,balance", "--no-schemas"]
    rc = main([*argv, f"-o{out}", f"--table-config={config}"], settings=make_settings(tmp_path / "home"))
    assert rc == 0, capsys.readouterr().err
    cfg = load_table_config(make_settings(tmp_path, table_config=config))
    # --key wins over what was discovered; the composite primary key is found without being named.
    assert cfg.key_columns() == {"*": ("id",), "accounts": ("id", "balance"), "order_lines": ("order_id", "line_no")}
    assert cfg.column_types()["accounts"] == want_types(expect.PG["accounts"])
    props = out.read_text()
    assert "debezium.format.value.schemas.enable=false" in props
    assert "debezium.source.decimal.handling.mode=string" in props
    assert "debezium.source.time.precision.mode=isostring" in props
