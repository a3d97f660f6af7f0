"""Debezium's transaction metadata from a real Debezium Server, through the real receiver, into
staging: PostgreSQL (``pgoutput``) and MariaDB (binlog), with and without schemas, under the
configuration ``cdclake debezium`` writes (``provide.transaction.metadata=true``, the markers'
source field). A multi-table transaction (an order, its two lines, a stock decrement), an
autocommit insert and a two-table delete/update: every END staged in ``.transactions`` counts,
per table, exactly the staged events that carry its transaction, and every BEGIN has its END."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cdclake.dev.stack import free_port
from tests.support import make_settings
from tests.support.debezium_server import LogicalPostgres, MariaDB, Pipeline, fail_fast_sink, missing, running

pytestmark = [
    pytest.mark.debezium,
    pytest.mark.e2e,
    pytest.mark.skipif(missing() is not None, reason=missing() or ""),
]

SCHEMA = """CREATE TABLE orders (id int PRIMARY KEY, customer varchar(20), total numeric(10,2));
CREATE TABLE order_lines (order_id int, line_no int, sku varchar(20), qty int, PRIMARY KEY (order_id, line_no));
CREATE TABLE stock (id int PRIMARY KEY, sku varchar(20), qty int);
CREATE TABLE marks (id int PRIMARY KEY);
INSERT INTO stock VALUES (1, 'A', 10), (2, 'B', 20);"""
STREAM = [
    "BEGIN; INSERT INTO orders VALUES (1, 'ada', 12.50); INSERT INTO order_lines VALUES (1, 1, 'A', 1), (1, 2, 'B', 2);"
    " UPDATE stock SET qty = qty - 1 WHERE id = 1; COMMIT;",
    "INSERT INTO orders VALUES (2, 'bob', 3.00)",
    "BEGIN; DELETE FROM stock WHERE id = 2; UPDATE orders SET total = 4 WHERE id = 2; COMMIT;",
    "INSERT INTO marks VALUES (1)",
]
TABLES = ["orders", "order_lines", "stock", "marks"]
KEYS = {"order_lines": ["order_id", "line_no"]}


@pytest.fixture(params=["postgres", "mariadb"])
def source(request: pytest.FixtureRequest) -> Iterator[LogicalPostgres | MariaDB]:
    if request.param == "postgres":
        with running(LogicalPostgres(), "txs", SCHEMA) as pg:
            yield pg
    else:
        with running(MariaDB(), "txs", SCHEMA) as maria:
            yield maria


def wait(until: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if until():
            return True
        time.sleep(0.2)
    return False


@pytest.mark.parametrize("schemas", [True, False], ids=["schemas", "no_schemas"])
def test_each_end_counts_the_events_of_its_transaction(
    source: LogicalPostgres | MariaDB, schemas: bool, tmp_path: Path
) -> None:
    if isinstance(source, LogicalPostgres):
        db, schema = source.database("txs", TABLES), "public"
    else:
        db, schema = source.database("txs", TABLES, 5432), "txs"
    config = tmp_path / "tables.toml"
    config.write_text("".join(f"[tables.{t}]\nkey = {json.dumps(k)}\n" for t, k in KEYS.items()))
    settings = make_settings(tmp_path / "home", receiver_port=free_port(), table_config=config)
    keys = {f"{schema}.{t}": cols for t, cols in KEYS.items()}
    sink = dataclasses.replace(fail_fast_sink(settings.receiver_url), schemas=schemas)
    p = Pipeline(tmp_path, settings, db, sink, "txs", keys=keys)
    try:
        p.start()
        assert p.wait_for("stock", 2, 90), p.failures()  # the snapshot
        for stmt in STREAM:
            source.sql(stmt, "txs")
        assert p.caught_up(1, 90), p.failures()
        # The END of the marks insert follows its row event.
        assert wait(lambda: len(staged_markers(settings.staging_dir)) >= 8, 30), p.failures()
    finally:
        p.stop()
    assert_transactions_whole(p.staged(), staged_markers(settings.staging_dir))


def staged_markers(staging_dir: Path) -> list[dict[str, Any]]:
    """Every staged transaction marker, read from the NDJSON files without the staging module."""
    out: list[dict[str, Any]] = []
    for f in sorted((staging_dir / ".transactions").rglob("*.ndjson")):
        out += [json.loads(line) for line in f.read_text().splitlines()]
    return out


def assert_transactions_whole(staged: dict[str, list[dict[str, Any]]], markers: list[dict[str, Any]]) -> None:
    """Each END's per-table counts == the distinct staged events carrying its id; BEGIN pairs END."""
    seen: dict[str, dict[str, set[tuple[str, int]]]] = {}
    for table, evs in staged.items():
        for ev in evs:
            if ev.get("transaction"):
                seen.setdefault(ev["transaction"]["id"], {}).setdefault(table, set()).add((ev["rowId"], ev["sequence"]))
    ends = {m["id"]: m for m in markers if m["status"] == "END"}
    assert {m["id"] for m in markers if m["status"] == "BEGIN"} == set(ends), markers
    assert set(seen) <= set(ends), "staged events of a transaction with no END"
    for tx, end in ends.items():
        assert {t: len(s) for t, s in seen.get(tx, {}).items()} == end["tables"], (tx, end)
        assert end["eventCount"] == sum(end["tables"].values()) and end["position"]
    # The order, its two lines and the stock update: one transaction, its END counting each table.
    assert {"orders": 1, "order_lines": 2, "stock": 1} in [e["tables"] for e in ends.values()], ends
