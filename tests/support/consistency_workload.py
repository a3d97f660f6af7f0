"""The source side of the consistency e2e (tests/e2e/test_consistency.py): five tables that only
multi-table transactions change, a writer thread that runs them for a bounded time on a real
PostgreSQL or MariaDB, and the source read back directly as the reference.

Transactions (each one source transaction, nothing else writes the tables):

* create an order: ``orders(id, total)`` with 1-4 ``order_lines(id, order_id, amount)`` whose
  amounts sum to the total, and ``stock.qty`` of one sku decremented by the number of lines;
* delete an order with its lines, and put the lines' stock back;
* move money between a row of ``accounts_a`` and a row of ``accounts_b``.

So at every committed state: every line has its order, an order's lines sum to its total (an
order has lines), ``sum(stock.qty) + count(order_lines)`` is :data:`STOCK_TOTAL` and
``sum(accounts_a.balance) + sum(accounts_b.balance)`` is :data:`MONEY` (tests/support/invariants.py).
The writer is the only one, so it knows the state it leaves and needs no reads.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from tests.support.cluster import PG_PASSWORD, PG_USER
from tests.support.debezium_server import LogicalPostgres, MariaDB

TABLES = ("orders", "order_lines", "stock", "accounts_a", "accounts_b")
"""The tables the apply publishes together; the pipeline also captures ``marks`` (caught-up mark)."""
KEYS = {"orders": "id", "order_lines": "id", "stock": "sku", "accounts_a": "id", "accounts_b": "id"}
SKUS = 8
STOCK_EACH = 1_000_000
STOCK_TOTAL = SKUS * STOCK_EACH
ACCOUNTS = 6
BALANCE_EACH = 10_000
MONEY = 2 * ACCOUNTS * BALANCE_EACH
MAX_OPEN_ORDERS = 30
"""Orders are deleted once this many are open: the tables stay small, so a read stays cheap."""

SCHEMA = """CREATE TABLE orders (id int PRIMARY KEY, total bigint NOT NULL);
CREATE TABLE order_lines (id int PRIMARY KEY, order_id int NOT NULL, amount bigint NOT NULL);
CREATE TABLE stock (sku varchar(16) PRIMARY KEY, qty bigint NOT NULL);
CREATE TABLE accounts_a (id int PRIMARY KEY, balance bigint NOT NULL);
CREATE TABLE accounts_b (id int PRIMARY KEY, balance bigint NOT NULL);
CREATE TABLE marks (id int PRIMARY KEY);
"""
SEED = (
    # One order of two lines from sku-0 before the snapshot, so every table has rows from the start.
    "INSERT INTO orders VALUES (1, 150);\nINSERT INTO order_lines VALUES (1, 1, 100), (2, 1, 50);\n"
    "INSERT INTO stock VALUES "
    + ", ".join(f"('sku-{i}', {STOCK_EACH - (2 if i == 0 else 0)})" for i in range(SKUS))
    + ";\n"
    "INSERT INTO accounts_a VALUES " + ", ".join(f"({i}, {BALANCE_EACH})" for i in range(1, ACCOUNTS + 1)) + ";\n"
    "INSERT INTO accounts_b VALUES " + ", ".join(f"({i}, {BALANCE_EACH})" for i in range(1, ACCOUNTS + 1)) + ";\n"
)
SNAPSHOT_ROWS = {"orders": 1, "order_lines": 2, "stock": SKUS, "accounts_a": ACCOUNTS, "accounts_b": ACCOUNTS}
"""What Debezium's initial snapshot lands."""

Source = LogicalPostgres | MariaDB


def connect(src: Source, db: str) -> Any:
    """A DB-API connection to ``db``, autocommit off (one transaction at a time)."""
    if isinstance(src, LogicalPostgres):
        import psycopg2

        return psycopg2.connect(
            host="127.0.0.1", port=src.port, user=PG_USER, password=PG_PASSWORD, dbname=db, connect_timeout=30
        )
    import pymysql

    return pymysql.connect(unix_socket=str(src.sock), user="root", database=db, autocommit=False, connect_timeout=30)


@contextlib.contextmanager
def connection(src: Source, db: str) -> Iterator[Any]:
    conn = connect(src, db)
    try:
        yield conn
    finally:
        conn.close()


def source_tables(src: Source, db: str) -> dict[str, dict[str, tuple[Any, ...]]]:
    """The reference: each table read directly from the source, key -> the other columns."""
    out: dict[str, dict[str, tuple[Any, ...]]] = {}
    with connection(src, db) as conn:
        cur = conn.cursor()
        for t in TABLES:
            cur.execute(f"SELECT * FROM {t}")
            out[t] = {str(r[0]): tuple(int(v) for v in r[1:]) for r in cur.fetchall()}
        conn.rollback()
    return out


@dataclass
class Workload:
    """Multi-table transactions on ``db`` until :meth:`stop` or ``seconds``; at most ``rate`` a second."""

    src: Source
    db: str
    seed: int = 31
    rate: float = 12.0
    counts: dict[str, int] = field(default_factory=lambda: {"create": 0, "delete": 0, "transfer": 0})
    error: BaseException | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _orders: dict[int, list[int]] = field(default_factory=lambda: {1: [0, 0]})
    """Open order id -> its lines' stock sku indexes (one entry per line); order 1 is the seed's."""
    _next_order: int = 2
    _next_line: int = 3

    @property
    def transactions(self) -> int:
        return sum(self.counts.values())

    def start(self, seconds: float) -> Workload:
        self._thread = threading.Thread(target=self._run, args=(seconds,), name="workload", daemon=True)
        self._thread.start()
        return self

    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def halt(self, timeout: float = 60.0) -> None:
        """Stop writing (after the transaction under way) and wait for the thread."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            assert not self._thread.is_alive(), "the workload thread did not stop"

    def stop(self, timeout: float = 60.0) -> None:
        """:meth:`halt`, then the workload's own failure, if any."""
        self.halt(timeout)
        if self.error is not None:
            raise AssertionError(f"workload failed: {self.error!r}") from self.error

    def _run(self, seconds: float) -> None:
        rng = random.Random(self.seed)
        deadline = time.monotonic() + seconds
        try:
            with connection(self.src, self.db) as conn:
                cur = conn.cursor()
                while not self._stop.is_set() and time.monotonic() < deadline:
                    kind = self._choose(rng)
                    getattr(self, f"_{kind}")(cur, rng)
                    conn.commit()
                    self.counts[kind] += 1
                    self._stop.wait(1.0 / self.rate)
        except BaseException as exc:  # reported by stop()
            self.error = exc

    def _choose(self, rng: random.Random) -> str:
        if len(self._orders) < 3:
            return "create"
        if len(self._orders) >= MAX_OPEN_ORDERS:
            return "delete"
        return rng.choices(["create", "delete", "transfer"], [4, 3, 3])[0]

    def _create(self, cur: Any, rng: random.Random) -> None:
        oid, n = self._next_order, rng.randint(1, 4)
        amounts = [rng.randint(1, 500) for _ in range(n)]
        sku = rng.randrange(SKUS)
        cur.execute(f"INSERT INTO orders VALUES ({oid}, {sum(amounts)})")
        for a in amounts:
            cur.execute(f"INSERT INTO order_lines VALUES ({self._next_line}, {oid}, {a})")
            self._next_line += 1
        cur.execute(f"UPDATE stock SET qty = qty - {n} WHERE sku = 'sku-{sku}'")
        self._orders[oid] = [sku] * n
        self._next_order += 1

    def _delete(self, cur: Any, rng: random.Random) -> None:
        oid = rng.choice(sorted(self._orders))
        skus = self._orders.pop(oid)
        cur.execute(f"DELETE FROM order_lines WHERE order_id = {oid}")
        cur.execute(f"DELETE FROM orders WHERE id = {oid}")
        cur.execute(f"UPDATE stock SET qty = qty + {len(skus)} WHERE sku = 'sku-{skus[0]}'")

    def _transfer(self, cur: Any, rng: random.Random) -> None:
        a, b, x = rng.randint(1, ACCOUNTS), rng.randint(1, ACCOUNTS), rng.randint(-300, 300)
        first, second = ("accounts_a", "accounts_b") if rng.random() < 0.5 else ("accounts_b", "accounts_a")
        ids = {"accounts_a": a, "accounts_b": b}
        cur.execute(f"UPDATE {first} SET balance = balance - {x} WHERE id = {ids[first]}")
        cur.execute(f"UPDATE {second} SET balance = balance + {x} WHERE id = {ids[second]}")
