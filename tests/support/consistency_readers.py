"""Readers of the consistency e2e: each polls the five tables in a thread of its own and checks
the invariants (tests/support/invariants.py) on every read.

* :class:`ApiReader`: ``POST /v1/query`` with ``"consistent": true`` when the server takes it
  (:func:`api_takes_consistent`);
* :class:`PinnedReader`: Spark SQL at one catalog cut: :func:`current_snapshots` (one read of the
  catalog rows), then ``VERSION AS OF`` per table in one statement;
* :class:`UnpinnedReader`: each table read on its own, at whatever is current then (reported only:
  nothing keeps two such reads at one cut).
"""

from __future__ import annotations

import dataclasses
import gzip
import importlib
import importlib.util
import json
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from cdclake.config.settings import Settings
from tests.support.consistency_workload import TABLES
from tests.support.invariants import Seen, check, read_sql, select_one


def current_snapshots(settings: Settings, tables: Sequence[str]) -> dict[str, int | None]:
    """Each table's current snapshot id at one cut of the catalog: the tables' rows in ONE
    SELECT, then each metadata file's ``current-snapshot-id`` (None: no table, or no snapshot).
    The test's own until the shared helper lands (cdclake: ``current_snapshots(settings, tables)``)."""
    from pyiceberg.catalog.sql import IcebergTables as T
    from pyiceberg.io import load_file_io
    from sqlalchemy import select
    from sqlalchemy.orm import Session

    from cdclake.lake.catalog import open_catalog

    catalog = open_catalog(settings)
    query = select(T.table_name, T.metadata_location).where(
        T.catalog_name == catalog.name, T.table_namespace == settings.namespace, T.table_name.in_(list(tables))
    )
    with Session(catalog.engine) as session:
        rows = session.execute(query).all()
    out: dict[str, int | None] = dict.fromkeys(tables)
    for name, location in rows:
        if not location:
            continue
        with load_file_io(dict(catalog.properties), location).new_input(location).open() as stream:
            data = stream.read()
        meta = json.loads(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data)
        sid = meta.get("current-snapshot-id")
        out[name] = None if sid in (None, -1) else int(sid)
    return out


def catalog_cut() -> Callable[[Settings, Sequence[str]], dict[str, int | None]]:
    """The shared ``cdclake.lake.cut.current_snapshots`` once it is there (issue 31's reads at one
    cut), else :func:`current_snapshots` here: the pinned reader reads through the product's cut."""
    if importlib.util.find_spec("cdclake.lake.cut") is None:
        return current_snapshots
    shared: Callable[[Settings, Sequence[str]], dict[str, int | None]]
    shared = importlib.import_module("cdclake.lake.cut").current_snapshots
    return shared


def api_takes_consistent(api: httpx.Client) -> bool:
    """Whether the query API accepts ``"consistent": true`` (issue 31's read at one cut); a server
    without it refuses the unknown field (400)."""
    r = api.post("/v1/query", json={"sql": "SELECT 1 AS one", "consistent": True})
    if r.status_code == 200:
        return True
    assert r.status_code in (400, 422), r.text
    return False


@dataclass
class Reader:
    """A polling thread: counts reads, violations by kind, distinct states, errors."""

    name: str
    asserted: bool
    pause_s: float = 0.0
    reads: int = 0
    bad_reads: int = 0
    violations: Counter[str] = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    states: set[int] = field(default_factory=set)
    orders_seen: set[int] = field(default_factory=set)
    seconds: float = 0.0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def read(self) -> list[Sequence[Any]]:
        raise NotImplementedError

    def start(self) -> Reader:
        self._thread = threading.Thread(target=self._run, name=f"reader-{self.name}", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 180.0) -> None:
        """Stops after the read under way (a Spark or HTTP call, bounded by its own timeout)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            assert not self._thread.is_alive(), f"reader {self.name} did not stop"

    def _run(self) -> None:
        t0 = time.monotonic()
        while not self._stop.is_set():
            try:
                rows = self.read()
            except Exception as exc:  # counted: a reader that mostly fails proves nothing
                self.errors.append(f"{type(exc).__name__}: {str(exc)[:300]}")
                self._stop.wait(0.5)
                continue
            self.record(check(rows))
            if self.pause_s:
                self._stop.wait(self.pause_s)
        self.seconds = time.monotonic() - t0

    def record(self, seen: Seen) -> None:
        self.reads += 1
        self.states.add(seen.state)
        self.orders_seen |= seen.orders
        if not seen.ok:
            self.bad_reads += 1
            self.violations.update(seen.violations)
            if len(self.examples) < 5:
                self.examples.append(seen.detail)

    def summary(self) -> str:
        rate = self.reads / self.seconds if self.seconds else 0.0
        return (
            f"{self.name}: {self.reads} reads ({rate:.1f}/s), {self.bad_reads} with violations "
            f"{dict(self.violations)}, {len(self.states)} states, {len(self.orders_seen)} orders seen, "
            f"{len(self.errors)} errors{' ' + self.errors[0] if self.errors else ''}"
            f"{'; e.g. ' + ' | '.join(self.examples[:2]) if self.examples else ''}"
        )


def merged(readers: Sequence[Reader]) -> Reader:
    """Several readers of one kind counted as one (their threads read side by side)."""
    out = Reader(readers[0].name, readers[0].asserted)
    for r in readers:
        out.reads, out.bad_reads = out.reads + r.reads, out.bad_reads + r.bad_reads
        out.violations.update(r.violations)
        out.examples += r.examples[: 5 - len(out.examples)]
        out.errors += r.errors
        out.states |= r.states
        out.orders_seen |= r.orders_seen
    out.seconds = max(r.seconds for r in readers)  # side by side: reads/seconds is their total rate
    return out


class ApiReader(Reader):
    def __init__(self, api: httpx.Client, consistent: bool, asserted: bool) -> None:
        super().__init__("api-consistent" if consistent else "api-plain", asserted)
        self.api, self.body = api, {"sql": read_sql({t: t for t in TABLES}), "maxRows": 10_000}
        if consistent:
            self.body["consistent"] = True

    def read(self) -> list[Sequence[Any]]:
        r = self.api.post("/v1/query", json=self.body)
        if r.status_code != 200:
            raise RuntimeError(f"{r.status_code} {r.text[:300]}")
        rows: list[Sequence[Any]] = r.json()["rows"]
        return rows


class PinnedReader(Reader):
    def __init__(self, spark: Any, settings: Settings) -> None:
        super().__init__("spark-pinned", True)
        self.spark, self.settings = spark, settings
        self.cut: dict[str, int | None] = {}
        self.current_snapshots = catalog_cut()
        self.ns = f"{settings.catalog_name}.{settings.namespace}"

    def record(self, seen: Seen) -> None:
        if not seen.ok and len(self.examples) < 5:  # which cut: the snapshots to look at
            seen = dataclasses.replace(seen, detail=f"{seen.detail} at {self.cut}")
        super().record(seen)

    def read(self) -> list[Sequence[Any]]:
        self.cut = cut = self.current_snapshots(self.settings, TABLES)
        # A table with no snapshot yet reads as empty: left out of the statement.
        sources = {t: f"{self.ns}.{t} VERSION AS OF {sid}" for t, sid in cut.items() if sid is not None}
        if not sources:
            return []
        return [tuple(r) for r in self.spark.sql(read_sql(sources)).collect()]


class UnpinnedReader(Reader):
    """Every table in a statement of its own, each at its current snapshot when read."""

    def __init__(self, spark: Any, settings: Settings) -> None:
        super().__init__("spark-unpinned", False)
        self.spark, self.ns = spark, f"{settings.catalog_name}.{settings.namespace}"

    def read(self) -> list[Sequence[Any]]:
        rows: list[Sequence[Any]] = []
        for t in TABLES:
            rows += [tuple(r) for r in self.spark.sql(select_one(t, f"{self.ns}.{t}")).collect()]
        return rows
