"""Issue 29's type matrix through the real Debezium Server 3.6: every source value lands exactly.

One PostgreSQL 15 database and one MariaDB database, each with one Debezium Server configured as
``cdclake debezium --discover`` writes it (:func:`cdclake.cli.debezium_cmd.build` on the command
line a user types) and one receiver. Each source has a ``types`` table with one column per source
type (tests/support/type_matrix.py: every integer kind at its min/max, NaN/±Infinity, 50-digit
and high-scale numerics, money, text with emoji and control characters, binary, uuid, JSON,
year 1 / 9999 / BC and infinite dates and timestamps, ``24:00``, intervals of a month and of a
million years, arrays empty / NULL / with NULL elements, enums, MariaDB's unsigned kinds, BIT,
YEAR, DECIMAL(65,30)), MariaDB a ``ubig`` table keyed by BIGINT UNSIGNED, both a ``scratch``
table. Three applies, the lake compared after each with the source read through its own driver
by the independent reference model (tests/support/type_model.py):

1. snapshot rows and the same rows streamed;
2. every row updated to other edge values, deletes, an insert;
3. TRUNCATE scratch (and an insert after it), DROP COLUMN, more updates, a delete, an insert.

``.venv/bin/pytest tests/e2e/test_debezium_types.py``: 1.5-3.5 minutes on the shared 2-core machine
(two Debezium Servers starting, nine applies). The differences found print to stderr as they are
found (``[matrix] <source> apply <n> <table>: ...``).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from cdclake.cli import debezium_cmd
from cdclake.config.settings import Settings
from cdclake.debezium import config as dc
from cdclake.dev.stack import free_port
from tests.support import fresh_settings, make_settings
from tests.support import type_matrix as tm
from tests.support.cluster import PG_PASSWORD, PG_USER
from tests.support.debezium_server import (
    DBZ_PASSWORD,
    DebeziumServer,
    LogicalPostgres,
    MariaDB,
    Pipeline,
    missing,
    running,
)
from tests.support.type_compare import (
    Diff,
    LakeRead,
    compare,
    lake_read,
    maria_connect,
    pg_connect,
    quarantine_reasons,
    source_rows,
)

pytestmark = [
    pytest.mark.debezium,
    pytest.mark.e2e,
    pytest.mark.skipif(missing() is not None, reason=missing() or ""),
]
DB = "matrix"
MARIA_USER, MARIA_PASSWORD = "tm", "tm-pass"
APPLIES = 3


class CliPipeline(Pipeline):
    """A :class:`Pipeline` whose Debezium Server runs on what ``cdclake debezium`` wrote."""

    def __init__(self, root: Path, settings: Settings, server: DebeziumServer) -> None:
        from tests.bench.receiver import Receiver

        self.settings = settings
        self.receiver = Receiver(settings, root / f"receiver-{server.workdir.name}.log")
        self.debezium = server
        self.first_landed_s = None


def cli_pipeline(root: Path, spark_home: Path, name: str, argv: list[str]) -> CliPipeline:
    """``cdclake debezium <argv> --discover``: its properties and table config, as a user gets them."""
    workdir = root / f"debezium-{name}"
    (workdir / "config").mkdir(parents=True)
    port = free_port()
    parser = argparse.ArgumentParser()
    debezium_cmd.add_parser(parser.add_subparsers())
    argv = [*argv, "--discover", "--name", name, "--receiver-url", f"http://127.0.0.1:{port}"]
    argv += ["--state-dir", str(workdir / "state"), "--http-port", str(free_port())]
    argv += ["-o", str(workdir / "config" / "application.properties")]
    argv += ["--retries", "5", "--retry-interval-ms", "1000"]  # a refusal ends the run in seconds
    args = parser.parse_args(["debezium", *argv])
    props, toml = debezium_cmd.build(args, make_settings(root / "unused"), {"CDCLAKE_DB_PASSWORD": DBZ_PASSWORD})
    (workdir / "config" / "application.properties").write_text(dc.render(props), encoding="utf-8")
    config = root / f"tables-{name}.toml"
    config.write_text(toml, encoding="utf-8")
    settings = fresh_settings(spark_home, receiver_port=port, table_config=config)
    return CliPipeline(root, settings, DebeziumServer(workdir, props))


@dataclass
class Source:
    """One source database and what the lake held after each apply."""

    name: str
    cols: tuple[tm.Col, ...]
    conn: Any
    writer: tm.Writer
    pipeline: CliPipeline
    tables: tuple[str, ...]
    pg: bool
    lake: list[dict[str, LakeRead | Exception]] = field(default_factory=list)
    diffs: list[dict[str, Diff]] = field(default_factory=list)
    marks: int = 0

    def live(self) -> list[tm.Col]:
        return self.writer.live()

    def mark(self) -> bool:
        self.marks += 1
        self.writer.execute("INSERT INTO marks VALUES (%s)", [self.marks])
        return self.pipeline.caught_up(self.marks, timeout=120)


def ids(cols: tuple[tm.Col, ...], first: int) -> list[int]:
    return [i for i, _ in tm.rows(cols, first)]


def snapshot(s: Source) -> None:
    """Before Debezium starts: the rows its snapshot reads."""
    for row_id, values in tm.rows(s.cols, 1) + tm.isolated(s.cols, 1000):
        s.writer.insert(row_id, values)
    for i in (1, 2, 3):
        s.writer.execute("INSERT INTO scratch VALUES (%s, %s)", [i, f"row {i} 😀"])
    if not s.pg:
        for key in tm.UBIG_KEYS:
            s.writer.execute("INSERT INTO ubig VALUES (%s, %s)", [key, str(key)[:20]])


def phase(s: Source, n: int) -> None:
    """Phase ``n`` of the streamed writes (1: inserts; 2: updates, deletes; 3: TRUNCATE, DROP COLUMN)."""
    w = s.writer
    if n == 1:
        for row_id, values in tm.rows(s.cols, 101) + tm.isolated(s.cols, 2000):
            w.insert(row_id, values)
        w.execute("INSERT INTO scratch VALUES (%s, %s)", [4, "streamed"])
        if not s.pg:
            w.execute("INSERT INTO ubig VALUES (%s, %s)", [2**64 - 2, "streamed"])
    elif n == 2:
        for k, row_id in enumerate(ids(s.cols, 1) + ids(s.cols, 101)):
            w.update(row_id, tm.rotated(s.live(), k + 1))
        w.execute("DELETE FROM types WHERE id IN (2, 102)")
        w.insert(200, tm.rotated(s.live(), 3))
        w.execute("UPDATE scratch SET v = %s WHERE id = 1", ["updated"])
        if not s.pg:
            w.execute("UPDATE ubig SET v = %s WHERE id = %s", ["updated", 2**64 - 1])
            w.execute("DELETE FROM ubig WHERE id = %s", [0])
    else:
        w.execute("TRUNCATE TABLE scratch")
        w.execute("INSERT INTO scratch VALUES (%s, %s)", [9, "after the truncate"])
        w.drop_column()
        for row_id in (3, 103):
            w.update(row_id, tm.rotated(s.live(), 5))
        w.execute("DELETE FROM types WHERE id = 4")
        w.insert(201, tm.rotated(s.live(), 4))
        if not s.pg:
            w.execute("UPDATE ubig SET v = %s WHERE id = %s", ["again", 2**63])


def apply_and_compare(spark: Any, s: Source) -> None:
    """One apply of everything staged, then each table against the source."""
    from spark_jobs.apply import apply_table

    settings = s.pipeline.settings
    lake: dict[str, LakeRead | Exception] = {}
    diffs: dict[str, Diff] = {}
    for table in s.tables:
        cols = s.live() if table == "types" else [tm.Col("v", "", "string", ())]
        source = source_rows(s.conn, table, cols, s.pg)
        try:
            apply_table(spark, settings, table, 10_000)
            lake[table] = read = lake_read(spark, f"{settings.catalog_name}.{settings.namespace}.{table}")
        except Exception as exc:  # an apply never fails because of data: the test says so
            lake[table] = exc
            diffs[table] = Diff(cells=[f"apply or read failed: {exc!r}"[:500]])
            continue
        diffs[table] = d = compare(source, read, cols)
        if d.missing:
            d.quarantined = quarantine_reasons(spark, f"{settings.catalog_name}.{settings.namespace}.{table}")
    s.lake.append(lake)
    s.diffs.append(diffs)
    for table, d in diffs.items():
        for line in d.lines(f"[matrix] {s.name} apply {len(s.diffs)} {table}"):
            print(line, file=sys.stderr)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("debezium-types")


@pytest.fixture(scope="module")
def pg_source(root: Path, spark_home: Path) -> Iterator[Source]:
    with running(LogicalPostgres(), DB, tm.pg_schema()) as pg:
        pg.database(DB, ["types", "scratch", "marks"])  # the publication (the tables' owner creates it)
        argv = ["postgres", "--port", str(pg.port), "--user", "dbz", "--database", DB, "--slot", DB]
        argv += ["--publication", DB, "--table", "public.types,public.scratch,public.marks"]
        conn = pg_connect(pg.port, DB, PG_USER, PG_PASSWORD)
        try:
            p = cli_pipeline(root, spark_home, "pg_types", argv)
            yield Source("pg", tm.PG_COLS, conn, tm.Writer(conn, tm.PG_COLS, True), p, ("types", "scratch"), True)
        finally:
            conn.close()


@pytest.fixture(scope="module")
def maria_source(root: Path, spark_home: Path) -> Iterator[Source]:
    with running(MariaDB(), DB, tm.maria_schema()) as maria:
        maria.sql(
            f"CREATE USER '{MARIA_USER}'@'127.0.0.1' IDENTIFIED BY '{MARIA_PASSWORD}'; "
            f"GRANT ALL ON {DB}.* TO '{MARIA_USER}'@'127.0.0.1'",
            db=None,
        )
        argv = ["mariadb", "--port", str(maria.port), "--user", "dbz", "--database", DB, "--server-id", "5411"]
        argv += ["--table", f"{DB}.types,{DB}.ubig,{DB}.scratch,{DB}.marks"]
        conn = maria_connect(maria.port, DB, MARIA_USER, MARIA_PASSWORD)
        try:
            p = cli_pipeline(root, spark_home, "maria_types", argv)
            tables = ("types", "ubig", "scratch")
            yield Source("mariadb", tm.MARIA_COLS, conn, tm.Writer(conn, tm.MARIA_COLS, False), p, tables, False)
        finally:
            conn.close()


@pytest.fixture(scope="module")
def matrix(pg_source: Source, maria_source: Source, spark: Any) -> Iterator[dict[str, Source]]:
    """Both sources through three applies; Debezium Servers and receivers stopped after."""
    sources = {"pg": pg_source, "mariadb": maria_source}
    try:
        for s in sources.values():
            snapshot(s)
        with ThreadPoolExecutor(2) as pool:  # two JVMs starting: the slow part
            list(pool.map(lambda s: s.pipeline.start(), sources.values()))
        for n in range(1, APPLIES + 1):
            for s in sources.values():
                phase(s, n)
                assert s.mark(), f"{s.name} phase {n}: not caught up; {s.pipeline.failures()}"
            for s in sources.values():
                apply_and_compare(spark, s)
        yield sources
    finally:
        for s in sources.values():
            s.pipeline.stop()


# ----------------------------------------------------------------------------- tests

SOURCES = ["pg", "mariadb"]


def _all(s: Source, what: str) -> list[str]:
    out = []
    for n, diffs in enumerate(s.diffs, 1):
        for table, d in diffs.items():
            items = getattr(d, what)
            if what == "missing" and items:
                items = [f"{items} quarantined because: {d.quarantined}"]
            out += [f"apply {n} {table}: {x}" for x in items] if items else []
    return out


@pytest.mark.parametrize("source", SOURCES)
def test_no_row_is_missing_or_extra(source: str, matrix: dict[str, Source]) -> None:
    """After every apply the lake has exactly the source's rows (by key), the TRUNCATE included."""
    s = matrix[source]
    assert not (_all(s, "missing") + _all(s, "extra")), "\n".join(_all(s, "missing") + _all(s, "extra"))


# What Debezium 3.6 itself changes before the receiver sees it (README, "Source types"): each
# must still differ exactly so (when Debezium fixes one, this test says so and its line goes),
# and nothing else may. Snapshot rows are ids below 2000 except the streamed 101-999.
DEBEZIUM_LOSSES = {
    "pg": {
        # the initial snapshot reads a BC date as the same day AD
        "BC date in the snapshot": re.compile(
            r"types: id=(\d{1,2}|1\d{3}) c_date \(date\) source '0044-03-15 BC': "
            r"want -735161 \(typed or text\), got -703383$"
        ),
    },
    "mariadb": {
        # the initial snapshot rounds a FLOAT to 6 significant digits
        "FLOAT in the snapshot": re.compile(
            r"types: id=(\d{1,2}|1\d{3}) c_float \(FLOAT\) source \S+: want '\w+', got '\w+'$"
        ),
        # a streamed ENUM label outside the connection's character set
        "emoji ENUM label streamed": re.compile(
            r"types: id=\d+ c_enum \(ENUM\('a','😀'\)\) source '😀': want '😀', got '\?'$"
        ),
    },
}


@pytest.mark.parametrize("source", SOURCES)
def test_every_cell_lands_exactly(source: str, matrix: dict[str, Source]) -> None:
    """Typed where the Iceberg type holds the value exactly, else NULL plus the exact text in
    ``<column>__text``; never a silent NULL, a wrap, a clamp or a rounding — but for Debezium's own
    losses (:data:`DEBEZIUM_LOSSES`), which must still be what differs there."""
    losses = DEBEZIUM_LOSSES[source]
    cells = _all(matrix[source], "cells")
    seen = {name for line in cells for name, rule in losses.items() if rule.search(line)}
    others = [line for line in cells if not any(rule.search(line) for rule in losses.values())]
    assert not others, f"{len(others)} differing cells:\n" + "\n".join(_by_column(others))
    assert seen == set(losses), f"Debezium no longer loses {sorted(set(losses) - seen)}: drop it here and in the README"


def _by_column(cells: list[str]) -> list[str]:
    """One line per (apply, table, column): how many cells differ there, and the first of them."""
    first: dict[str, tuple[int, str]] = {}
    for line in cells:
        head, _, rest = line.partition(": id=")
        column = "stale rows" if "columns differ" in rest else rest.split(" ", 2)[1] if rest else ""
        n, example = first.get(f"{head} {column}", (0, line))
        first[f"{head} {column}"] = (n + 1, example)
    return [f"{n} x {example}" for n, example in first.values()]


@pytest.mark.parametrize("source", SOURCES)
def test_every_column_has_the_declared_iceberg_type(source: str, matrix: dict[str, Source]) -> None:
    types = _all(matrix[source], "types")
    assert not types, "\n".join(types)


@pytest.mark.parametrize("source", SOURCES)
def test_no_column_changes_type_between_applies(source: str, matrix: dict[str, Source]) -> None:
    """Widening only when the source widened, which it never does here: whatever the mix of
    inserts, updates, deletes, a TRUNCATE and a DROP COLUMN, a column keeps its first type."""
    s = matrix[source]
    changed = []
    for n in range(1, len(s.lake)):
        for table, now in s.lake[n].items():
            before = s.lake[n - 1].get(table)
            if isinstance(now, LakeRead) and isinstance(before, LakeRead):
                changed += [
                    f"apply {n + 1} {table}.{c}: {t} -> {now.types.get(c)}"
                    for c, t in before.types.items()
                    if now.types.get(c) != t
                ]
    assert len(s.lake) == APPLIES
    assert not changed, "\n".join(changed)


@pytest.mark.parametrize("source", SOURCES)
def test_truncate_empties_the_table(source: str, matrix: dict[str, Source]) -> None:
    """Rows 1-4 truncated, row 9 written after the TRUNCATE: the lake holds row 9 alone."""
    last = matrix[source].lake[-1].get("scratch")
    assert isinstance(last, LakeRead), last
    assert sorted(last.rows) == [9]


@pytest.mark.parametrize("source", SOURCES)
def test_a_dropped_column_is_null_in_rows_written_after_the_drop(source: str, matrix: dict[str, Source]) -> None:
    """Iceberg keeps a dropped source column (docs/debezium.md): rows untouched since keep their values, rows
    written after the drop hold NULL there, and every other column still matches (above)."""
    last = matrix[source].lake[-1].get("types")
    assert isinstance(last, LakeRead), last
    if tm.DROPPED in last.types:
        after = {k: last.rows.get(k, {tm.DROPPED: "row missing"})[tm.DROPPED] for k in (3, 103, 201)}
        assert after == {3: None, 103: None, 201: None}
