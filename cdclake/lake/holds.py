"""Publishes held by a failing expectation, and the operator's releases, as small JSON objects in
the staging store's ``.holds`` folder (never a table: :meth:`Store.tables` skips dot folders).

The apply writes ``.holds/<table>.json`` for each table whose expectation failed on a run's
staged snapshots, and publishes nothing of that run (:mod:`spark_jobs.audit`). Every later run
checks again: the hold stays while the expectation fails. ``cdclake release <table>`` (or the
Lakehouse page) writes ``.holds/<table>.release.json``: the next run that finds only released
tables failing publishes, once, and deletes the hold and the release. A run that publishes
deletes the holds of its tables (their expectations passed). cdc_freshness fails naming each
held table and expectation (:mod:`cdclake.lake.freshness`)."""

from __future__ import annotations

import time
from collections.abc import Iterable

import msgspec

from cdclake.staging.store import Store

HOLDS = ".holds"
_RELEASE = ".release.json"
_HOLD = ".json"


class Failure(msgspec.Struct, frozen=True):
    table: str
    expectation: str
    detail: str
    """What a person reads: ``3 rows with total >= 0 false``."""


class Hold(msgspec.Struct, frozen=True):
    table: str
    failures: list[Failure]
    tables: list[str]
    """Every table of the held run: none of them was published."""
    sinceMs: int
    released: bool = False


def _hold_path(table: str) -> str:
    return f"{HOLDS}/{table}{_HOLD}"


def _release_path(table: str) -> str:
    return f"{HOLDS}/{table}{_RELEASE}"


def _put(store: Store, path: str, data: bytes) -> None:
    store.delete(path)
    store.put_if_absent(path, data)


def hold(store: Store, failures: list[Failure], tables: list[str]) -> None:
    """Record the failures of a run over ``tables`` (one object per failing table; an older hold
    of the table keeps its start time)."""
    now = int(time.time() * 1000)
    for table in sorted({f.table for f in failures}):
        old = held(store).get(table)
        mine = [f for f in failures if f.table == table]
        _put(store, _hold_path(table), msgspec.json.encode(Hold(table, mine, tables, old.sinceMs if old else now)))


def held(store: Store) -> dict[str, Hold]:
    """Every held table's hold, ``released`` when a release waits for the next run."""
    names = set(store.list_names(HOLDS + "/"))
    out = {}
    for name in sorted(names):
        if not name.endswith(_HOLD) or name.endswith(_RELEASE):
            continue
        data = store.read(f"{HOLDS}/{name}")
        if data is None:
            continue
        h = msgspec.json.decode(data, type=Hold)
        out[h.table] = msgspec.structs.replace(h, released=f"{h.table}{_RELEASE}" in names)
    return out


def release(store: Store, table: str, by: str) -> Hold:
    """Let the next run publish ``table`` once despite its failing expectations; ValueError when
    the table is not held."""
    h = held(store).get(table)
    if h is None:
        raise ValueError(f"{table} is not held by an expectation")
    _put(store, _release_path(table), msgspec.json.encode({"by": by, "atMs": int(time.time() * 1000)}))
    return msgspec.structs.replace(h, released=True)


def unreleased(store: Store, failures: Iterable[Failure]) -> list[Failure]:
    """The failures no release covers."""
    names = set(store.list_names(HOLDS + "/"))
    return [f for f in failures if f"{f.table}{_RELEASE}" not in names]


def clear(store: Store, tables: Iterable[str]) -> None:
    """After a publish of ``tables``: their holds and releases are done with."""
    names = set(store.list_names(HOLDS + "/"))
    for table in tables:
        for name in (f"{table}{_HOLD}", f"{table}{_RELEASE}"):
            if name in names:
                store.delete(f"{HOLDS}/{name}")
