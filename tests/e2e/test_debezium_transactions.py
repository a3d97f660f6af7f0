"""Transaction metadata from a real Debezium Server 3.6.0.Final (issue 31), on the properties
``cdclake debezium`` writes (``provide.transaction.metadata=true``, the markers' source field):
PostgreSQL 15 and MariaDB 10.11, a multi-table transaction (an order, two lines, a stock
update), an autocommit statement and a transaction with a delete. Debezium posts to a capture
server on 127.0.0.1 and each post is decoded as the receiver decodes it
(``receiver.decode.decode_debezium_obj``): every transaction's END must count, per table,
exactly the events decoded with its id.

TODO(issue 31): once the receiver lands markers (``.transactions`` in staging), point the sink
at the real receiver (tests/support/debezium_server.py, ``Pipeline``) and assert the same from
the staged objects."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from cdclake.contracts.events import Batch
from cdclake.dev.stack import free_port
from receiver.decode import decode_debezium_obj
from tests.support.debezium_server import DebeziumServer, LogicalPostgres, MariaDB, fail_fast_sink, missing, running

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


class Capture:
    """An HTTP server on 127.0.0.1 that answers 200 and keeps each post's parsed body."""

    def __init__(self) -> None:
        posts: list[Any] = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                posts.append(json.loads(body))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.posts = posts
        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def holds(self, needle: str) -> bool:
        return any(needle in json.dumps(p) for p in list(self.posts))

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


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
    keys = {f"{schema}.{t}": cols for t, cols in KEYS.items()}
    capture = Capture()
    dbz = DebeziumServer.create(tmp_path, db, fail_fast_sink(capture.url, schemas=schemas), "txs", keys=keys)
    try:
        dbz.start()
        assert wait(lambda: capture.holds('"stock"'), 90), dbz.log_tail()  # the snapshot
        for stmt in STREAM:
            source.sql(stmt, "txs")
        assert wait(lambda: capture.holds('"marks"'), 90), dbz.log_tail()
        time.sleep(2)  # the END of the marks insert follows it
    finally:
        dbz.stop()
        capture.close()
    batches = [decode_debezium_obj(p, 10**7, None, tables=_rules()).batch for p in capture.posts]
    landed = [b for b in batches if b is not None]
    assert_transactions_whole(landed)


def _rules() -> Any:
    from cdclake.debezium.envelope import TableRules

    return TableRules(key_columns={**KEYS, "*": ["id"]})


def assert_transactions_whole(batches: list[Batch]) -> None:
    """Each END's per-table counts == the decoded events carrying its id; each BEGIN has an END."""
    by_tx: dict[str, Counter[str]] = {}
    for b in batches:
        for ev in b.events:
            if ev.transaction is not None:
                by_tx.setdefault(ev.transaction.id, Counter())[ev.table] += 1
    markers = [m for b in batches for m in b.transactions or []]
    ends = {m.id: m for m in markers if m.status == "END"}
    assert {m.id for m in markers if m.status == "BEGIN"} == set(ends), markers
    assert set(by_tx) <= set(ends), "events of a transaction with no END"
    for tx, end in ends.items():
        assert dict(by_tx.get(tx, Counter())) == end.tables, (tx, end)
        assert end.eventCount == sum((end.tables or {}).values())
    # The order, its two lines and the stock update: one transaction, its END counting each table.
    assert {"orders": 1, "order_lines": 2, "stock": 1} in [e.tables for e in ends.values()], ends
