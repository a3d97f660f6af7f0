"""Per-table write locks in the catalog database, shared by the apply job and table maintenance.

Iceberg commits are optimistic, but a compaction that commits between an apply's read and its
commit can fail the apply with "found new delete for replaced data file" (apache/iceberg #4996),
and the other way round. So whoever rewrites a table's files holds its lock: one row per table in
``cdclake_table_locks``, created by an INSERT that fails while another holder's row exists. A
holder that died leaves a row that expires after its TTL (holders renew while they work).

The catalog database is the one thing every process already shares (SQLite file embedded,
PostgreSQL distributed), so no extra service is needed.
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

from cdclake.settings import Settings

TABLE = "cdclake_table_locks"
DEFAULT_TTL_S = 600.0


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
    return engine


def try_acquire(settings: Settings, table: str, owner: str, ttl_s: float = DEFAULT_TTL_S) -> bool:
    import sqlalchemy as sa

    engine = _engine(settings.catalog_url)
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

    with _engine(settings.catalog_url).begin() as c:
        n = c.execute(
            sa.text(f"UPDATE {TABLE} SET expires_at = :e WHERE table_name = :t AND owner = :o"),
            {"e": time.time() + ttl_s, "t": f"{settings.namespace}.{table}", "o": owner},
        ).rowcount
    return bool(n)


def release(settings: Settings, table: str, owner: str) -> None:
    import sqlalchemy as sa

    with _engine(settings.catalog_url).begin() as c:
        c.execute(
            sa.text(f"DELETE FROM {TABLE} WHERE table_name = :t AND owner = :o"),
            {"t": f"{settings.namespace}.{table}", "o": owner},
        )


def holder(settings: Settings, table: str) -> str | None:
    import sqlalchemy as sa

    with _engine(settings.catalog_url).begin() as c:
        row = c.execute(
            sa.text(f"SELECT owner FROM {TABLE} WHERE table_name = :t AND expires_at >= :now"),
            {"t": f"{settings.namespace}.{table}", "now": time.time()},
        ).first()
    return None if row is None else str(row[0])


@contextlib.contextmanager
def table_lock(
    settings: Settings,
    table: str,
    role: str,
    wait_s: float = 1800.0,
    ttl_s: float = DEFAULT_TTL_S,
    say: Callable[[str], None] | None = None,
) -> Iterator[str]:
    """Hold ``table``'s lock for the block, waiting up to ``wait_s`` for it; renewed every
    ``ttl_s / 3`` so a long rewrite keeps it, and it expires ``ttl_s`` after a holder dies."""
    owner = owner_id(role)
    deadline = time.monotonic() + wait_s
    delay = 0.5
    told = False
    while not try_acquire(settings, table, owner, ttl_s):
        if time.monotonic() > deadline:
            raise LockTimeout(f"{table}: lock held by {holder(settings, table)} for more than {wait_s:.0f}s")
        if say and not told:
            say(f"{table}: waiting for the table lock held by {holder(settings, table)}")
            told = True
        time.sleep(delay)
        delay = min(delay * 1.5, 5.0)
    stop = threading.Event()

    def keep() -> None:
        while not stop.wait(ttl_s / 3):
            renew(settings, table, owner, ttl_s)

    t = threading.Thread(target=keep, daemon=True, name=f"cdclake-lock-{table}")
    t.start()
    try:
        yield owner
    finally:
        stop.set()
        t.join()
        release(settings, table, owner)
