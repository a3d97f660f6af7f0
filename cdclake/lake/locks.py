"""Per-table write locks in the catalog database, shared by the apply job and table maintenance.

Iceberg commits are optimistic, but a compaction that commits between an apply's read and its
commit can fail the apply with "found new delete for replaced data file" (apache/iceberg #4996),
and the other way round. So whoever rewrites a table's files holds its lock: one row per table in
``cdclake_table_locks``, created by an INSERT that fails while another holder's row exists. A
holder that died leaves a row that expires after its TTL (holders renew while they work).

The catalog database is the one thing every process already shares (SQLite file embedded,
PostgreSQL distributed), so no extra service is needed.

Waiters queue in ``cdclake_table_lock_waiters`` and only the oldest live waiter may take the
lock: the apply job takes a table's lock every few seconds under steady load, and without the
queue a compaction polling between those windows could wait forever.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from functools import lru_cache
from typing import Any

from cdclake.config.settings import Settings
from cdclake.contracts.events import SIDE_SUFFIXES

TABLE = "cdclake_table_locks"
WAITERS = "cdclake_table_lock_waiters"
DEFAULT_TTL_S = 600.0
WAITER_TTL_S = 30.0
"""A waiter that stops polling (it died) leaves the queue after this long."""


class LockTimeout(TimeoutError):
    pass


def owner_id(role: str) -> str:
    return f"{role}@{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}"


@lru_cache(maxsize=4)
def _engine(url: str) -> Any:
    import sqlalchemy as sa

    kwargs: dict[str, Any] = {}
    if url.startswith("sqlite"):
        # Several processes share the file: wait for each other's short transactions.
        kwargs["connect_args"] = {"timeout": 30}
    engine = sa.create_engine(url, **kwargs)
    with engine.begin() as c:
        c.execute(
            sa.text(
                f"CREATE TABLE IF NOT EXISTS {TABLE} (table_name VARCHAR(512) PRIMARY KEY, "
                "owner VARCHAR(512) NOT NULL, acquired_at DOUBLE PRECISION NOT NULL, "
                "expires_at DOUBLE PRECISION NOT NULL)"
            )
        )
        c.execute(
            sa.text(
                f"CREATE TABLE IF NOT EXISTS {WAITERS} (table_name VARCHAR(512) NOT NULL, "
                "owner VARCHAR(512) NOT NULL, enqueued_at DOUBLE PRECISION NOT NULL, "
                "expires_at DOUBLE PRECISION NOT NULL, PRIMARY KEY (table_name, owner))"
            )
        )
    return engine


def _wait_turn(settings: Settings, table: str, owner: str, since: float) -> bool:
    """Queue ``owner`` (or keep its place alive); whether it is now first in line."""
    import sqlalchemy as sa

    name, now = f"{settings.namespace}.{table}", time.time()
    with _engine(settings.catalog_db_url).begin() as c:
        c.execute(sa.text(f"DELETE FROM {WAITERS} WHERE expires_at < :now"), {"now": now})
        args = {"t": name, "o": owner, "q": since, "e": now + WAITER_TTL_S}
        if not c.execute(
            sa.text(f"UPDATE {WAITERS} SET expires_at = :e WHERE table_name = :t AND owner = :o"), args
        ).rowcount:
            c.execute(
                sa.text(f"INSERT INTO {WAITERS} (table_name, owner, enqueued_at, expires_at) VALUES (:t, :o, :q, :e)"),
                args,
            )
        first = c.execute(
            sa.text(f"SELECT owner FROM {WAITERS} WHERE table_name = :t ORDER BY enqueued_at, owner LIMIT 1"),
            {"t": name},
        ).first()
    return first is not None and first[0] == owner


def _leave_queue(settings: Settings, table: str, owner: str) -> None:
    import sqlalchemy as sa

    with _engine(settings.catalog_db_url).begin() as c:
        c.execute(
            sa.text(f"DELETE FROM {WAITERS} WHERE table_name = :t AND owner = :o"),
            {"t": f"{settings.namespace}.{table}", "o": owner},
        )


def waiters(settings: Settings, table: str) -> list[str]:
    """Owners queued for ``table``'s lock, first in line first."""
    import sqlalchemy as sa

    with _engine(settings.catalog_db_url).begin() as c:
        rows = c.execute(
            sa.text(
                f"SELECT owner FROM {WAITERS} WHERE table_name = :t AND expires_at >= :now ORDER BY enqueued_at, owner"
            ),
            {"t": f"{settings.namespace}.{table}", "now": time.time()},
        ).all()
    return [str(r[0]) for r in rows]


def try_acquire(settings: Settings, table: str, owner: str, ttl_s: float = DEFAULT_TTL_S) -> bool:
    import sqlalchemy as sa

    engine = _engine(settings.catalog_db_url)
    now = time.time()
    name = f"{settings.namespace}.{table}"
    with engine.begin() as c:
        # A dead holder's row stops counting once it expires.
        c.execute(sa.text(f"DELETE FROM {TABLE} WHERE table_name = :t AND expires_at < :now"), {"t": name, "now": now})
    try:
        with engine.begin() as c:
            c.execute(
                sa.text(f"INSERT INTO {TABLE} (table_name, owner, acquired_at, expires_at) VALUES (:t, :o, :a, :e)"),
                {"t": name, "o": owner, "a": now, "e": now + ttl_s},
            )
        return True
    except sa.exc.IntegrityError:
        return False


def renew(settings: Settings, table: str, owner: str, ttl_s: float = DEFAULT_TTL_S) -> bool:
    import sqlalchemy as sa

    with _engine(settings.catalog_db_url).begin() as c:
        n = c.execute(
            sa.text(f"UPDATE {TABLE} SET expires_at = :e WHERE table_name = :t AND owner = :o"),
            {"e": time.time() + ttl_s, "t": f"{settings.namespace}.{table}", "o": owner},
        ).rowcount
    return bool(n)


def release(settings: Settings, table: str, owner: str) -> None:
    import sqlalchemy as sa

    with _engine(settings.catalog_db_url).begin() as c:
        c.execute(
            sa.text(f"DELETE FROM {TABLE} WHERE table_name = :t AND owner = :o"),
            {"t": f"{settings.namespace}.{table}", "o": owner},
        )


def holder(settings: Settings, table: str) -> str | None:
    import sqlalchemy as sa

    with _engine(settings.catalog_db_url).begin() as c:
        row = c.execute(
            sa.text(f"SELECT owner FROM {TABLE} WHERE table_name = :t AND expires_at >= :now"),
            {"t": f"{settings.namespace}.{table}", "now": time.time()},
        ).first()
    return None if row is None else str(row[0])


def lock_name(table: str) -> str:
    """The lock ``table`` is written under: a side table's (``orders__changes``) is its table's
    (``orders``), which the apply holds while it writes both, and so does a compaction of the side
    table alone (else the hourly one and the apply's own could rewrite it at once)."""
    for suffix in SIDE_SUFFIXES:
        if table.lower().endswith(suffix):
            return table[: -len(suffix)]
    return table


@contextlib.contextmanager
def table_lock(
    settings: Settings,
    table: str,
    role: str,
    wait_s: float = 1800.0,
    ttl_s: float = DEFAULT_TTL_S,
    say: Callable[[str], None] | None = None,
) -> Iterator[str]:
    """Hold ``table``'s lock for the block, waiting up to ``wait_s`` for it, first come first
    served; renewed every ``ttl_s / 3`` so a long rewrite keeps it, and it expires ``ttl_s``
    after a holder dies. A side table's lock is its table's (:func:`lock_name`)."""
    table = lock_name(table)
    owner = owner_id(role)
    deadline = time.monotonic() + wait_s
    since = time.time()
    delay = 0.1
    told = False
    try:
        while not (_wait_turn(settings, table, owner, since) and try_acquire(settings, table, owner, ttl_s)):
            if time.monotonic() > deadline:
                raise LockTimeout(f"{table}: lock held by {holder(settings, table)} for more than {wait_s:.0f}s")
            if say and not told:
                say(f"{table}: waiting for the table lock held by {holder(settings, table)}")
                told = True
            time.sleep(delay)
            # Short polls: the lock is often held for seconds only (an apply of a micro-batch).
            delay = min(delay * 1.5, 1.0)
    finally:
        _leave_queue(settings, table, owner)
    stop = threading.Event()

    def keep() -> None:
        while not stop.wait(ttl_s / 3):
            try:
                if not renew(settings, table, owner, ttl_s) and say:
                    say(f"{table}: lost the table lock {owner}: it expired before a renewal got through")
            except Exception as exc:
                # A busy catalog database must not end the renewals: the TTL leaves two more tries.
                if say:
                    say(f"{table}: could not renew the table lock: {type(exc).__name__}: {exc}")

    t = threading.Thread(target=keep, daemon=True, name=f"cdclake-lock-{table}")
    t.start()
    try:
        yield owner
    finally:
        stop.set()
        t.join()
        release(settings, table, owner)
