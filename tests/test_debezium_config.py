"""cdclake.debezium_config: the application.properties Debezium Server runs on (fast checks;
tests/test_debezium_server.py runs a real Debezium Server on the same output)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cdclake.debezium_config import Database, Sink, properties, render

PG = Database("postgres", "db.internal", 5432, "dbz", "pw", "shop", ("public.customers", "public.order_lines"))
MARIA = Database("mariadb", "127.0.0.1", 3306, "dbz", "pw", "shop", ("shop.customers",), server_id=7)


def test_render_escapes_what_properties_and_smallrye_would_read_otherwise() -> None:
    # Hand-derived: .properties escapes = : # ! and backslash, a leading space and controls;
    # SmallRye would expand ${x}, so it gets a backslash that survives the .properties reading.
    text = render({"a.password": " p=w:d#!\\x${x}\né"}, header="made by a test")
    assert text == "# made by a test\na.password=\\ p\\=w\\:d\\#\\!\\\\x\\\\${x}\\né\n"


def test_postgres_source_and_http_sink() -> None:
    p = properties(PG, Sink("http://rcv:8090/"), name="shop", state_dir=Path("/state"))
    assert p["debezium.sink.type"] == "http"
    assert p["debezium.sink.http.url"] == "http://rcv:8090/v1/debezium"
    assert p["debezium.sink.http.batch.enabled"] == "true"
    assert p["debezium.source.connector.class"] == "io.debezium.connector.postgresql.PostgresConnector"
    assert p["debezium.source.plugin.name"] == "pgoutput"
    assert p["debezium.source.database.dbname"] == "shop"
    # A regular-expression list, matched whole: the dot must not match any character.
    assert p["debezium.source.table.include.list"] == "public\\.customers,public\\.order_lines"
    assert p["debezium.source.offset.storage.file.filename"] == "/state/offsets.dat"
    assert p["quarkus.http.port"] != "8080"  # Airflow's port
    assert "debezium.transforms" not in p


def test_mariadb_source_keeps_its_schema_history_and_sends_no_ddl_events() -> None:
    p = properties(MARIA, Sink("http://rcv:8090"), name="shop", state_dir=Path("/state"))
    assert p["debezium.source.connector.class"] == "io.debezium.connector.mariadb.MariaDbConnector"
    assert p["debezium.source.database.server.id"] == "7"
    assert p["debezium.source.database.include.list"] == "shop"
    assert p["debezium.source.schema.history.internal.file.filename"] == "/state/schema-history.dat"
    assert p["debezium.source.include.schema.changes"] == "false"


def test_token_becomes_a_static_authorization_header() -> None:
    p = properties(PG, Sink("http://rcv:8090", token="s3cret"), name="shop", state_dir=Path("/s"))
    assert p["debezium.transforms"] == "h0"
    assert p["debezium.transforms.h0.type"] == "org.apache.kafka.connect.transforms.InsertHeader"
    assert (p["debezium.transforms.h0.header"], p["debezium.transforms.h0.value.literal"]) == (
        "Authorization",
        "Bearer s3cret",
    )
    assert p["debezium.sink.http.headers.prefix"] == ""
    assert p["debezium.sink.http.headers.encode.base64"] == "false"


def test_keys_go_to_message_key_columns() -> None:
    keys = {"public.order_lines": ("order_id", "line_no")}
    p = properties(PG, Sink("http://rcv"), name="shop", state_dir=Path("/s"), keys=keys)
    assert p["debezium.source.message.key.columns"] == "public\\.order_lines:order_id,line_no"


@pytest.mark.parametrize(
    ("db", "name", "keys", "message"),
    [
        (PG, "shop", {"public.nope": ("id",)}, "keys: table 'public.nope' is not in tables"),
        (PG, "shop", {"public.customers": ("a,b",)}, "keys['public.customers']"),
        (PG, "my shop", None, "name 'my shop'"),
        (Database("postgres", "h", 1, "u", "p", "d", ("customers",)), "shop", None, "table 'customers'"),
        (Database("postgres", "h", 1, "u", "p", "d", ()), "shop", None, "tables: at least one"),
    ],
)
def test_errors_name_the_setting(
    db: Database, name: str, keys: dict[str, tuple[str, ...]] | None, message: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        properties(db, Sink("http://rcv"), name=name, state_dir=Path("/s"), keys=keys)
