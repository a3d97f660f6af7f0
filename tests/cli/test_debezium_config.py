"""cdclake.debezium.config: the application.properties Debezium Server runs on (fast checks;
tests/e2e/test_debezium_server.py runs a real Debezium Server on the same output)."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from cdclake.config.tables import load_table_config
from cdclake.debezium.config import ConfigError, Database, Sink, key_toml, properties, render
from tests.support import make_settings

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
    assert p["debezium.transforms"] == "txsource"  # the markers' source name, no header


def test_mariadb_source_keeps_its_schema_history_and_sends_no_ddl_events() -> None:
    p = properties(MARIA, Sink("http://rcv:8090"), name="shop", state_dir=Path("/state"))
    assert p["debezium.source.connector.class"] == "io.debezium.connector.mariadb.MariaDbConnector"
    assert p["debezium.source.database.server.id"] == "7"
    assert p["debezium.source.database.include.list"] == "shop"
    assert p["debezium.source.schema.history.internal.file.filename"] == "/state/schema-history.dat"
    assert p["debezium.source.include.schema.changes"] == "false"


def test_token_becomes_a_static_authorization_header() -> None:
    p = properties(PG, Sink("http://rcv:8090", token="s3cret"), name="shop", state_dir=Path("/s"))
    assert p["debezium.transforms"] == "txsource,h0"
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


def pg(*tables: str, **kw: Any) -> Database:
    return Database("postgres", "h", 5432, "u", "p", "d", tables, **kw)


@pytest.mark.parametrize(
    ("db", "sink", "name", "keys", "setting", "message"),
    [
        (PG, Sink("http://rcv"), "shop", {"public.nope": ("id",)}, "keys", "table 'public.nope' is not in tables"),
        (PG, Sink("http://rcv"), "shop", {"public.customers": ("a,b",)}, "keys", "'public.customers': column names"),
        (PG, Sink("http://rcv"), "shop", {"public.customers": ("a", "a")}, "keys", "1..16 distinct columns"),
        (PG, Sink("http://rcv"), "my shop", None, "name", "'my shop': must match"),
        (PG, Sink("http://rcv"), "_shop", None, "name", "'_shop': must match"),  # a source id starts alnum
        (pg("customers"), Sink("http://rcv"), "shop", None, "tables", "'customers': expected schema.table"),
        (pg(), Sink("http://rcv"), "shop", None, "tables", "at least one table"),
        (pg("public.order-lines"), Sink("http://rcv"), "shop", None, "tables", "lake table 'order-lines' must match"),
        (pg("public.x__changes"), Sink("http://rcv"), "shop", None, "tables", "not end in __changes"),
        (replace(MARIA, tables=("other.x",)), Sink("http://rcv"), "shop", None, "tables", "not in database"),
        (pg("public.t", slot="My-Slot"), Sink("http://rcv"), "shop", None, "slot", "1-63 of [a-z0-9_]"),
        (Database("postgres", "h", 0, "u", "p", "d", ("public.t",)), Sink("http://rcv"), "s", None, "port", "1..65535"),
        (PG, Sink("rcv:8090"), "shop", None, "receiver_url", "expected http(s)://"),
        (PG, Sink("http://rcv", batch_max_size=0), "shop", None, "batch_max_size", "must be >= 1"),
        (PG, Sink("http://rcv", retries=0), "shop", None, "retries", "must be >= 1"),
        (PG, Sink("http://rcv", token="two words"), "shop", None, "token", "visible ASCII without spaces"),
    ],
)
def test_errors_name_the_setting(
    db: Database, sink: Sink, name: str, keys: dict[str, tuple[str, ...]] | None, setting: str, message: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)) as exc:
        properties(db, sink, name=name, state_dir=Path("/s"), keys=keys)
    assert exc.value.setting == setting
    assert "two words" not in str(exc.value)  # a token is never echoed


def test_recommended_retries_outlast_the_receivers_backpressure(tmp_path: Path) -> None:
    """The sink's fixed pause is no shorter than the Retry-After of the receiver's backpressure
    answer (503 buffer_full), and its attempts ride out 30 minutes of it (debezium_config)."""
    from receiver.backlog import Backlog

    backlog = Backlog(make_settings(tmp_path, backlog_soft=1, backlog_hard=1), store=None)  # type: ignore[arg-type]
    backlog.per_table = {"orders": 1}
    refusal = backlog.refusal("shop")
    assert refusal is not None and (refusal.status, refusal.reason) == (503, "buffer_full")
    sink = Sink("http://rcv")
    assert sink.retry_interval_ms >= refusal.extra["retryDelayMs"]
    assert sink.retries * sink.retry_interval_ms >= 30 * 60 * 1000
    p = properties(PG, sink, name="shop", state_dir=Path("/s"))
    assert (p["debezium.sink.http.retries"], p["debezium.sink.http.retry.interval.ms"]) == ("360", "5000")
    assert (p["debezium.sink.http.batch.enabled"], p["debezium.sink.http.batch.max-size"]) == ("true", "1024")


def test_recommended_batches_carry_a_large_transaction_within_the_receivers_rate_limit(tmp_path: Path) -> None:
    """The receiver's token bucket counts requests, and the sink answers its 429 with the fixed
    retry pause (5 s; Retry-After is not read): issue 16's 100,000-row UPDATE must go in requests
    the default bucket allows within 15 s (30 s to visible, less the apply), or it waits out pauses
    (at 200 events per request it landed 1,810 events/s). A full poll of the connector
    (max.batch.size 2048) goes in whole requests, and rows of 30 KiB with their schema still fit
    the receiver's body limit, which the sink cannot split."""
    settings = make_settings(tmp_path)
    batch = Sink("http://rcv").batch_max_size
    allowed = settings.rate_limit_burst + settings.rate_limit_per_s * 15
    assert allowed * batch >= 100_000
    assert 2048 % batch == 0
    assert settings.max_debezium_body_bytes // batch >= 32 * 1024


def test_key_toml_round_trips_through_the_table_config(tmp_path: Path) -> None:
    db = pg("public.customers", "public.Order_Lines", "audit.customers", "public.odd")
    keys = {"public.Order_Lines": ("order_id", "line_no"), "public.odd": ('we"ird\\', "é ü", "tab\tx\x7f")}
    text = key_toml(db, keys)
    config = tmp_path / "tables.toml"
    # A [defaults] key elsewhere in the file must not change the tables the command wrote.
    config.write_text('[defaults]\nkey = ["uuid"]\n\n' + text, encoding="utf-8")
    loaded = load_table_config(make_settings(tmp_path, table_config=config)).key_columns()
    assert loaded == {
        "*": ("uuid",),
        "customers": ("id",),  # public. and audit.customers land in one lake table, one key
        "order_lines": ("order_id", "line_no"),
        "odd": ('we"ird\\', "é ü", "tab\tx\x7f"),
    }


def test_key_toml_refuses_one_lake_table_with_two_keys() -> None:
    db = pg("public.users", "audit.users")
    with pytest.raises(ConfigError, match="both land in lake table 'users' with different keys") as exc:
        key_toml(db, {"audit.users": ("tenant", "id")})
    assert exc.value.setting == "keys"


def test_truncates_are_sent_not_skipped() -> None:
    """Debezium's default ``skipped.operations=t`` drops TRUNCATE; the lake applies it (issue 29).
    PostgreSQL (pgoutput) and MariaDB both send op ``t`` with ``none`` (Debezium Server 3.6)."""
    for db in (PG, MARIA):
        p = properties(db, Sink("http://rcv:8090"), name="shop", state_dir=Path("/s"))
        assert p["debezium.source.skipped.operations"] == "none"


@pytest.mark.parametrize("db", [PG, MARIA])
def test_transaction_metadata_is_sent_and_markers_name_their_source(db: Database) -> None:
    """BEGIN/END records (topic ``<name>.transaction``) name no source; the transform adds it to
    them alone (the predicate's topic), so row events keep Debezium's envelope."""
    p = properties(db, Sink("http://rcv:8090"), name="shop-1.eu", state_dir=Path("/s"))
    assert p["debezium.source.provide.transaction.metadata"] == "true"
    assert p["debezium.transforms.txsource.type"] == "org.apache.kafka.connect.transforms.InsertField$Value"
    assert (p["debezium.transforms.txsource.static.field"], p["debezium.transforms.txsource.static.value"]) == (
        "cdclake_source",
        "shop-1.eu",
    )
    assert p["debezium.transforms.txsource.predicate"] == p["debezium.predicates"] == "transactions"
    pattern = p["debezium.predicates.transactions.pattern"]
    assert re.fullmatch(pattern, "shop-1.eu.transaction")
    assert not re.fullmatch(pattern, "shop-1xeu.transaction") and not re.fullmatch(pattern, "shop-1.eu.public.orders")
