"""Reads at one cut: ``consistent`` and ``asOfPosition`` in the query API, ``cdclake sql
--consistent`` / ``--as-of-position``, the lake client's parameters, and the cut itself
(cdclake/lake/cut.py, cdclake/query/cuts.py).

The Spark tests write two tables with plain Spark appends and move BOTH between the moment a
query pins its tables and the moment it reads them (a hook in the query engine, in this process:
the API server runs in a thread here). The pinned query still answers the pinned state; the same
sequence without the pin answers the new one, so the pin is what holds the answer."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.testclient import TestClient

from cdclake.client import lake as lake_client
from cdclake.config.settings import Settings
from cdclake.lake import cut, publish
from cdclake.lake.catalog import load_table, open_catalog
from cdclake.query import cuts, queries
from cdclake.query.statements import AsOf, Cut, QueryError, with_as_of
from restcatalog.app import create_app
from tests.restcatalog.test_query_api import EXTENDED
from tests.support import fresh_settings, make_settings
from tests.support.query import query_api

KEY = "cdclake.source-position.pg"

# ---------------------------------------------------------------- pure parts (no Spark)


def _meta(main: int | None, *snaps: tuple[int, int | None, dict[str, str]]) -> dict[str, Any]:
    """Raw table metadata: snapshots (id, parent, summary properties), ``main`` on ``main``."""
    return {
        "refs": {} if main is None else {"main": {"snapshot-id": main, "type": "branch"}},
        "snapshots": [
            {"snapshot-id": i, "parent-snapshot-id": p, "summary": {"operation": "append", **s}} for i, p, s in snaps
        ],
    }


def test_at_position_is_the_newest_ancestor_at_or_before_and_passes_over_unstamped_snapshots() -> None:
    m = _meta(
        5,
        (1, None, {KEY: "0/A"}),
        (2, 1, {KEY: "20"}),  # decimal and hi/lo LSNs compare with each other
        (3, 2, {}),  # maintenance: no position
        (4, 3, {KEY: "0/1E", "cdclake.source-position.other": "1"}),
        (5, 4, {}),
        (9, 2, {KEY: "25"}),  # staged, never published: not an ancestor of main
    )
    assert cut.at_position(m, "t", "pg", "25") == 2
    assert cut.at_position(m, "t", "pg", "0/14") == 2  # equal counts
    assert cut.at_position(m, "t", "pg", "30") == 4  # not 5, the unstamped snapshot on top
    assert cut.at_position(m, "t", "pg", "10") == 1
    with pytest.raises(cut.NoSnapshotAtPosition, match=r"^t has no snapshot at or before position 9 of source pg"):
        cut.at_position(m, "t", "pg", "9")
    with pytest.raises(cut.NoSnapshotAtPosition, match="source mysql"):
        cut.at_position(m, "t", "mysql", "100")
    with pytest.raises(cut.NoSnapshotAtPosition, match=r"^empty "):
        cut.at_position(_meta(None), "empty", "pg", "100")


def test_gtid_set_positions_are_covered_only_when_every_domain_is() -> None:
    m = _meta(2, (1, None, {KEY: "0-1-5"}), (2, 1, {KEY: "0-1-9,1-2-3"}))
    assert cut.at_position(m, "t", "pg", "0-1-9,1-2-3") == 2
    assert cut.at_position(m, "t", "pg", "0-1-12,1-2-2") == 1  # domain 1 not reached yet
    assert cut.at_position(m, "t", "pg", "0-1-8") == 1
    assert cut.covered("0-1-9,1-2-3", "0-7-10,1-7-3") and not cut.covered("0-1-9,1-2-3", "0-1-10")


def test_a_pinned_as_of_has_one_clause_per_table_and_none_for_a_table_without_a_snapshot(tmp_path: Path) -> None:
    at = AsOf.pin({"Orders": 11, "lines": 22, "empty": None}, "consistent")
    assert at.snapshot_of("orders") == 11 and at.snapshot_of("LINES") == 22 and at.snapshot_of("x") is None
    assert at.clause("orders") == "VERSION AS OF 11" and at.clause("empty") is None
    assert at.describe() == "consistent" and at.heading() == "consistent"
    hash(at)  # a key of the engine's per-query cache
    sql, read = with_as_of(
        "SELECT * FROM lake.cdc.orders o JOIN lake.cdc.lines l USING (k), lake.cdc.empty e", ["lake"], "cdc", at
    )
    assert sql == (
        "SELECT * FROM lake.cdc.orders VERSION AS OF 11 o JOIN lake.cdc.lines VERSION AS OF 22 l USING (k), "
        "lake.cdc.empty e"
    )  # several tables, unlike one snapshot id; the unpinned one left for the plan check to refuse
    assert read == ["lake.cdc.orders", "lake.cdc.lines"]
    assert queries.snapshot_at(make_settings(tmp_path), "lines", at) == 22  # no catalog asked


def test_the_tables_pinned_are_those_of_the_analyzed_plan() -> None:
    # EXTENDED: lake.cdc.`a.b``c`, lake.cdc.secret.snapshots (a metadata table: its table), cdc.nope unresolved.
    assert cuts.read_tables(EXTENDED, "lake", "cdc") == ["a.b`c", "secret"]
    assert cuts.read_tables(EXTENDED, "lake", "other") == []
    history = EXTENDED.replace("'UnresolvedRelation [cdc, nope]", "'UnresolvedRelation [orders__history]")
    assert history != EXTENDED
    assert cuts.read_tables(history, "lake", "cdc") == ["a.b`c", "secret", "orders__changes"]
    with pytest.raises(QueryError, match=r"^consistent: no catalog"):
        cuts.pinned(None, Cut(), EXTENDED, "lake", "cdc")
    asked: list[tuple[Cut, list[str]]] = []

    def pin(c: Cut, t: list[str]) -> dict[str, int | None]:
        asked.append((c, t))
        return {"secret": 7}

    got = cuts.pinned(pin, Cut("pg", "5"), EXTENDED, "lake", "cdc")
    assert asked == [(Cut("pg", "5"), ["a.b`c", "secret"])]  # read once, for exactly those tables
    assert got == AsOf(pinned=(("secret", 7),), label="asOfPosition pg=5")
    asked.clear()
    cuts.pinned(pin, Cut(), EXTENDED, "lake", "cdc", lambda ns, t: t != "secret")
    assert asked == [(Cut(), ["a.b`c"])]  # a table outside the rights is not even looked up


def test_the_lake_client_sends_the_fields() -> None:
    b = lake_client.body("SELECT 1", None, None, 5, None, "json", True)
    assert b["consistent"] is True and "asOfPosition" not in b
    b = lake_client.plan_body("SELECT 1", None, None, None, as_of_position=("pg", "0/16B3748"))
    assert b == {"sql": "SELECT 1", "asOfPosition": {"source": "pg", "position": "0/16B3748"}}
    assert "consistent" not in lake_client.body("SELECT 1", None, None, 5, None, "json")


@pytest.mark.parametrize("path", ["/v1/query", "/v1/query/plan"])
@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ({"consistent": True, "asOf": 1}, "asOf and consistent cannot be combined"),
        ({"asOfPosition": {"source": "pg", "position": "1"}, "asOf": "2026-01-01"}, "asOf and asOfPosition cannot"),
        ({"asOfPosition": {"source": "pg", "position": "1"}, "consistent": True}, "asOfPosition and consistent"),
        ({"consistent": "yes"}, "consistent"),
        ({"asOfPosition": {"source": "pg"}}, "asOfPosition.position"),
        ({"asOfPosition": {"source": "p g", "position": "1"}}, "asOfPosition.source"),
        ({"asOfPosition": {"source": "pg", "position": "1", "x": 1}}, "asOfPosition.x"),
        ({"asOfPosition": "pg=1"}, "asOfPosition"),
        ({"asOfPosition": {"source": "pg", "position": "yesterday"}}, "asOfPosition.position 'yesterday' has no order"),
    ],
)
def test_bad_cut_requests_are_400_naming_the_field(
    tmp_path: Path, path: str, extra: dict[str, Any], needle: str
) -> None:
    with TestClient(create_app(make_settings(tmp_path, spark_connect_url=""))) as api:
        r = api.post(path, json={"sql": "SELECT 1", **extra})
    assert r.status_code == 400, r.text  # before any engine is asked for (there is none here)
    assert needle in r.json()["error"]["message"], r.text


# ---------------------------------------------------------------- on real tables


def make_table(spark: Any, settings: Settings, name: str) -> str:
    ident = f"{settings.catalog_name}.{settings.namespace}.{name}"
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {settings.catalog_name}.{settings.namespace}")
    spark.sql(f"CREATE TABLE {ident} (k INT, v STRING) USING iceberg")
    return ident


def append(spark: Any, settings: Settings, name: str, k: int, position: str | None = None) -> int:
    """One row appended to ``name`` as one snapshot (carrying a pg position when given); its id."""
    w = spark.createDataFrame([(k, f"v{k}")], "k INT, v STRING").writeTo(
        f"{settings.catalog_name}.{settings.namespace}.{name}"
    )
    if position is not None:
        w = w.option(f"snapshot-property.{KEY}", position)
    w.append()
    t = load_table(settings, name)
    assert t is not None and t.current_snapshot() is not None
    return t.current_snapshot().snapshot_id  # type: ignore[union-attr]


@pytest.fixture()
def pair(spark: Any, spark_home: Path) -> Settings:
    """Tables a and b, one row and one snapshot each."""
    settings = fresh_settings(spark_home)
    for i, name in enumerate(("a", "b")):
        make_table(spark, settings, name)
        append(spark, settings, name, i)
    return settings


@pytest.fixture()
def move_both(spark: Any, pair: Settings, monkeypatch: pytest.MonkeyPatch) -> Callable[[], int]:
    """From now on, every query appends a row to BOTH tables once, after its cut is pinned and
    its text rewritten, before its plan is checked and it runs (check_touched is the step
    between, on both paths); how many times that happened."""
    real = queries.check_touched
    done: list[int] = []

    def check_touched(*args: Any) -> None:
        append(spark, pair, "a", 100 + len(done))
        append(spark, pair, "b", 200 + len(done))
        done.append(1)
        real(*args)

    monkeypatch.setattr(queries, "check_touched", check_touched)
    return lambda: len(done)


def counts(pair: Settings) -> str:
    ns = f"{pair.catalog_name}.{pair.namespace}"
    # a by its one-part name (a view at the pin), b fully qualified (the clause): both paths.
    return f"SELECT 'a' AS t, count(*) AS n FROM a UNION ALL SELECT 'b', count(*) FROM {ns}.b ORDER BY t"


def mains(settings: Settings) -> dict[str, int]:
    got = {}
    for name in ("a", "b"):
        t = load_table(settings, name)
        assert t is not None and t.current_snapshot() is not None
        got[name] = t.current_snapshot().snapshot_id  # type: ignore[union-attr]
    return got


@pytest.mark.spark
def test_the_cut_is_one_read_of_the_rows_even_when_both_tables_move_before_their_files_are_read(
    spark: Any, pair: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pyiceberg.exceptions import NoSuchTableError
    from sqlalchemy import event

    before = mains(pair)
    real, moved = publish.read_metadata, list[tuple[int, int]]()

    def read_metadata(io: Any, location: str) -> dict[str, Any]:
        if not moved:  # between the rows' read and the first file's: both tables move
            hooked.append(True)  # the appends' own catalog reads are not the cut's
            moved.append((append(spark, pair, "a", 7), append(spark, pair, "b", 8)))
            hooked.clear()
        return real(io, location)

    statements: list[str] = []
    hooked: list[bool] = []
    engine = open_catalog(pair).engine

    def listen(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        if not hooked:
            statements.append(statement)

    event.listen(engine, "before_cursor_execute", listen)
    monkeypatch.setattr(publish, "read_metadata", read_metadata)
    try:
        got = cut.current_snapshots(pair, ["a", "b"])
    finally:
        event.remove(engine, "before_cursor_execute", listen)
    assert got == before  # the rows' state, not the files' newest
    assert len(statements) == 1 and statements[0].lstrip().upper().startswith("SELECT"), statements
    assert cut.current_snapshots(pair, ["b", "a"]) == dict(zip("ab", moved[0], strict=True)) == mains(pair)
    with pytest.raises(NoSuchTableError, match=r"Tables do not exist: .*nope"):
        cut.current_snapshots(pair, ["a", "nope"])


@pytest.mark.spark
def test_a_consistent_query_answers_the_pinned_state_when_both_tables_move_before_it_reads(
    connect_url: str, pair: Settings, move_both: Callable[[], int]
) -> None:
    pinned = mains(pair)
    ns = f"{pair.catalog_name}.{pair.namespace}"
    with query_api(pair, connect_url) as url, httpx.Client(base_url=url, timeout=120) as api:
        r = api.post("/v1/query", json={"sql": counts(pair), "consistent": True})
        assert r.status_code == 200, r.text
        assert r.json()["rows"] == [["a", 1], ["b", 1]] and move_both() == 1
        assert sorted((s["table"], s["snapshotId"]) for s in r.json()["snapshots"]) == [
            (f"{ns}.a", pinned["a"]),
            (f"{ns}.b", pinned["b"]),
        ]
        # The same sequence unpinned: both tables move at the same step and the answer is the new state.
        r = api.post("/v1/query", json={"sql": counts(pair)})
        assert r.status_code == 200 and r.json()["rows"] == [["a", 3], ["b", 3]] and move_both() == 2
        # The lake client, and the plan: each scan at the snapshot pinned when the query began.
        db = lake_client.connect(url)
        assert db.query(counts(pair), consistent=True).rows == [{"t": "a", "n": 3}, {"t": "b", "n": 3}]
        now = mains(pair)
        plan = db.plan(counts(pair), consistent=True)
        assert sorted(s["snapshotId"] for s in plan["scans"]) == sorted(now.values()) and move_both() == 4


@pytest.mark.spark
def test_as_of_position_picks_each_tables_newest_snapshot_at_or_before_it(
    spark: Any, spark_home: Path, connect_url: str
) -> None:
    s = fresh_settings(spark_home)
    for name in ("p", "q", "r"):
        make_table(spark, s, name)
    p10, p20, p30 = (append(spark, s, "p", i, pos) for i, pos in enumerate(("0/A", "0/14", "0/1E")))
    q10, q30 = append(spark, s, "q", 0, "10"), append(spark, s, "q", 1, "30")
    append(spark, s, "q", 2)  # a write outside a consistent publish: no position
    append(spark, s, "r", 0)
    both = "SELECT 'p' AS t, count(*) AS n FROM p UNION ALL SELECT 'q', count(*) FROM q ORDER BY t"
    with query_api(s, connect_url) as url, httpx.Client(base_url=url, timeout=120) as api:

        def ask(sql: str, position: str, status: int = 200) -> dict[str, Any]:
            r = api.post("/v1/query", json={"sql": sql, "asOfPosition": {"source": "pg", "position": position}})
            assert r.status_code == status, r.text
            got: dict[str, Any] = r.json()
            return got

        for position, rows, snaps in (
            ("25", [["p", 2], ["q", 1]], {p20, q10}),  # q's newest then is older than p's
            ("0/1E", [["p", 3], ["q", 2]], {p30, q30}),  # not q's newest, unstamped, snapshot
            ("10", [["p", 1], ["q", 1]], {p10, q10}),
        ):
            got = ask(both, position)
            assert got["rows"] == rows and {x["snapshotId"] for x in got["snapshots"]} == snaps, position
        err = ask(both, "9", 400)["error"]["message"]
        assert err.startswith("asOfPosition pg=9: p has no snapshot at or before position 9 of source pg"), err
        assert "r has no snapshot" in ask("SELECT * FROM r", "100", 400)["error"]["message"]
        db = lake_client.connect(url)
        assert db.query(both, as_of_position=("pg", "25")).rows == [{"t": "p", "n": 2}, {"t": "q", "n": 1}]


@pytest.fixture()
def cli(capsys: pytest.CaptureFixture[str], spark: Any) -> Iterator[Callable[..., tuple[int, str, str]]]:
    from cdclake.cli.main import main

    def run(settings: Settings, *argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        rc = main(["sql", "--format", "json", *argv], spark=spark, settings=settings)
        out, err = capsys.readouterr()
        return rc, out, err

    yield run


@pytest.mark.spark
def test_cdclake_sql_consistent_and_as_of_position(
    spark: Any, pair: Settings, cli: Callable[..., tuple[int, str, str]], move_both: Callable[[], int]
) -> None:
    pinned = mains(pair)
    rc, out, err = cli(pair, "--consistent", counts(pair))
    assert rc == 0, err
    assert out.splitlines() == ['{"t": "a", "n": 1}', '{"t": "b", "n": 1}'] and move_both() == 1
    assert f".a@{pinned['a']}" in err and f".b@{pinned['b']}" in err  # the note: what was read, at what
    rc, out, err = cli(pair, counts(pair))  # unpinned, the CLI plans nothing: the state now
    assert rc == 0 and out.splitlines() == ['{"t": "a", "n": 2}', '{"t": "b", "n": 2}'] and move_both() == 1
    rc, _, err = cli(pair, "--as-of-position", "pg=5", counts(pair))
    assert rc == 1 and "a has no snapshot at or before position 5 of source pg" in err
    for argv, needle in (
        (["--consistent", "--as-of", "1"], "--as-of and --consistent cannot be combined"),
        (["--consistent", "--as-of-position", "pg=1"], "--consistent and --as-of-position cannot"),
        (["--as-of-position", "pg"], "SOURCE=POSITION"),
        (["--as-of-position", "pg=soon"], "'soon' is not an LSN"),
    ):
        rc, _, err = cli(pair, *argv, "SELECT 1")
        assert rc == 1 and needle in err, (argv, err)
