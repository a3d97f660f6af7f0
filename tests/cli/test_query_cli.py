"""``cdclake sql``, ``tables``, ``snapshots`` and time travel, on real tables made by the apply job
in two runs, checked against the reference model (current rows, rows as of the first run) and
against Iceberg metadata; errors are one line and exit 1."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import socket
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest

from cdclake.cli import output, query
from cdclake.cli.main import main
from cdclake.cli.output import Result, render
from cdclake.config.settings import Settings
from cdclake.dev.reference import diff, rows_by_key
from cdclake.dev.stack import LocalStack, free_port
from cdclake.query.statements import AsOf, QueryError, parse_as_of, split_statements, statements_of, with_as_of
from tests.support import make_settings
from tests.support.lake import Lake, two_run_lake
from tests.support.rest import serve

TABLE = "orders"


# ---------------------------------------------------------------- pure parts (no Spark)


def test_split_statements_respects_strings_comments_and_quoted_names() -> None:
    text = "SELECT 'a;b' AS x; -- c;\nSELECT `we;ird` FROM t /* ; */ WHERE y = \"q;\" ;\n-- only a comment\n"
    done, rest = split_statements(text)
    assert done == ["SELECT 'a;b' AS x", '-- c;\nSELECT `we;ird` FROM t /* ; */ WHERE y = "q;"']
    assert rest == ""
    done, rest = split_statements("SELECT 1;\nSELECT 'open\n")
    assert done == ["SELECT 1"] and rest.strip() == "SELECT 'open"
    assert statements_of("SELECT 1; SELECT 2") == ["SELECT 1", "SELECT 2"]
    assert statements_of("-- nothing\n") == []


def test_parse_as_of() -> None:
    assert parse_as_of("4348436197468765062") == AsOf(snapshot_id=4348436197468765062)
    utc = datetime(2026, 1, 1, 12, 0, 0, 250000, tzinfo=UTC)
    ms = int(utc.timestamp() * 1000)
    for text in ("2026-01-01 12:00:00.250", "2026-01-01T12:00:00.250Z", "2026-01-01T14:00:00.250+02:00"):
        assert parse_as_of(text) == AsOf(timestamp_ms=ms), text
    assert parse_as_of("2026-01-01").timestamp_ms == int(datetime(2026, 1, 1, tzinfo=UTC).timestamp() * 1000)
    with pytest.raises(QueryError, match="neither a snapshot id"):
        parse_as_of("yesterday")


def test_with_as_of_rewrites_fully_qualified_reads_only() -> None:
    v = AsOf(snapshot_id=5)
    sql, read = with_as_of("SELECT * FROM lake.cdc.orders o WHERE o.x = 'lake.cdc.orders'", ["lake"], "cdc", v)
    assert sql == "SELECT * FROM lake.cdc.orders VERSION AS OF 5 o WHERE o.x = 'lake.cdc.orders'"
    assert read == ["lake.cdc.orders"]
    t = AsOf(timestamp_ms=1000)
    sql, read = with_as_of(
        "WITH c AS (SELECT * FROM `lake`.cdc.orders__changes) "
        "SELECT * FROM LAKE.CDC.orders JOIN c USING (_cdc_row_id), lake.cdc.orders.snapshots s, "
        "lake.cdc.customers VERSION AS OF 1",
        ["rest", "lake"],
        "cdc",
        t,
    )
    assert sql.count("TIMESTAMP AS OF timestamp_millis(1000)") == 2
    assert "lake.cdc.orders.snapshots s" in sql and "customers VERSION AS OF 1" in sql
    assert read == ["lake.cdc.orders__changes", "lake.cdc.orders"]
    with pytest.raises(QueryError, match=r"reads no table written lake\.cdc"):
        with_as_of("SELECT * FROM orders", ["lake"], "cdc", v)
    with pytest.raises(QueryError, match="belongs to one table"):
        with_as_of("SELECT * FROM lake.cdc.a, lake.cdc.b", ["lake"], "cdc", v)
    with pytest.raises(QueryError, match="applies to queries"):
        with_as_of("INSERT INTO lake.cdc.a SELECT * FROM lake.cdc.a", ["lake"], "cdc", v)


def test_render_formats() -> None:
    when = datetime(2026, 1, 1, 12, 0, 0, 250000, tzinfo=UTC)
    r = Result(["id", "name", "at", "nested", "n"], [(1, "x" * 100, when, [{"a": 1}], None), (22, "y", when, [], 1.5)])
    out = io.StringIO()
    render(r, "table", out)
    lines = out.getvalue().splitlines()
    assert lines[0].split(" | ")[0] == "id" and lines[-1] == "(2 rows)"
    assert " 1 | " + "x" * (output.MAX_CELL - 1) + '… | 2026-01-01 12:00:00.250 | [{"a":1}]' in lines[2]
    assert lines[2].endswith("| NULL") and lines[3].startswith("22 | y")
    out = io.StringIO()
    render(r, "csv", out)
    rows = list(csv.reader(io.StringIO(out.getvalue())))
    assert rows[0] == r.columns and rows[1][2] == "2026-01-01T12:00:00.250000+00:00" and rows[1][3] == '[{"a":1}]'
    assert rows[1][4] == ""
    out = io.StringIO()
    render(r, "json", out)
    first = json.loads(out.getvalue().splitlines()[0])
    assert first == {
        "id": 1,
        "name": "x" * 100,
        "at": "2026-01-01T12:00:00.250000+00:00",
        "nested": [{"a": 1}],
        "n": None,
    }
    out = io.StringIO()
    exact = [Decimal("-99999999999998.999999"), Decimal("123456789012345678901234.50000000000000")]
    render(Result(["d"], [(d,) for d in exact]), "json", out)
    assert [json.loads(line)["d"] for line in out.getvalue().splitlines()] == [str(d) for d in exact]
    out = io.StringIO()
    render(Result(["a"], [(1,)], more=True), "table", out)
    assert out.getvalue().splitlines()[-1].startswith("(first 1 rows;")


def test_rest_command_serves_the_catalog(monkeypatch: pytest.MonkeyPatch) -> None:
    import restcatalog.__main__

    called = []
    monkeypatch.setattr(restcatalog.__main__, "main", lambda: called.append(True))
    assert main(["rest"]) == 0 and called


@pytest.mark.server
def test_local_stack_runs_the_rest_catalog(tmp_path: Path) -> None:
    settings = make_settings(
        tmp_path, receiver_port=free_port(), airflow_port=free_port(), rest_port=free_port(), spark_connect_url=""
    )
    stack = LocalStack(settings, log=io.StringIO())
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", settings.rest_port))
        busy.listen()
        with pytest.raises(RuntimeError, match="CDCLAKE_REST_PORT"):
            stack._check_ports()
    try:
        stack._spawn("rest-catalog", [sys.executable, "-m", "restcatalog"])
        stack.wait_rest(timeout=60)
        assert httpx.get(f"{stack.rest_url}/v1/config", timeout=5).status_code == 200
    finally:
        stack.stop()
    assert not stack.procs


# ---------------------------------------------------------------- on real tables


@pytest.fixture(scope="module")
def lake(spark: Any, spark_home: Path) -> Lake:
    return two_run_lake(spark, spark_home, TABLE)


@pytest.fixture()
def cli(capsys: pytest.CaptureFixture[str], spark: Any, lake: Lake) -> Any:
    def run(*argv: str, settings: Settings | None = None) -> tuple[int, str, str]:
        capsys.readouterr()
        rc = main(list(argv), spark=spark, settings=settings or lake.settings)
        out, err = capsys.readouterr()
        return rc, out, err

    return run


def json_rows(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines()]


def sql_time(ms: int) -> str:
    return (datetime(1970, 1, 1) + timedelta(milliseconds=ms)).isoformat(sep=" ", timespec="milliseconds")


@pytest.mark.spark
def test_sql_in_each_format_matches_the_reference(cli: Any, lake: Lake) -> None:
    want = lake.expected()
    assert want
    rc, out, err = cli("sql", "--format", "json", f"SELECT * FROM {TABLE} ORDER BY order_id")
    assert rc == 0, err
    assert not diff(want, rows_by_key(json_rows(out)))

    rc, out, err = cli("sql", "--format", "csv", f"SELECT _cdc_row_id, status, amount, items FROM {lake.ns}.{TABLE}")
    assert rc == 0, err
    got = {
        r["_cdc_row_id"]: (r["status"], float(r["amount"]), json.loads(r["items"]))
        for r in csv.DictReader(io.StringIO(out))
    }
    assert got == {k: (v["status"], v["amount"], v["items"]) for k, v in want.items()}

    rc, out, err = cli("sql", "--max-rows", "0", f"SELECT _cdc_row_id, status, amount FROM {TABLE} ORDER BY order_id")
    assert rc == 0, err
    lines = out.splitlines()
    assert [c.strip() for c in lines[0].split("|")] == ["_cdc_row_id", "status", "amount"]
    assert set(lines[1]) <= {"-", "+"}
    body = [[c.strip() for c in line.split("|")] for line in lines[2:-1]]
    assert {r[0]: (r[1], float(r[2])) for r in body} == {k: (v["status"], v["amount"]) for k, v in want.items()}
    assert lines[-1] == f"({len(want)} rows)"

    rc, out, _ = cli("sql", "--max-rows", "3", f"SELECT * FROM {TABLE}")
    assert rc == 0 and len(out.splitlines()) == 2 + 3 + 1 and out.splitlines()[-1].startswith("(first 3 rows;")


@pytest.mark.spark
def test_sql_file_and_shell(cli: Any, lake: Lake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "q.sql"
    f.write_text(f"-- how many\nSELECT count(*) AS n FROM {TABLE};\nSELECT 'a;b' AS s\n")
    rc, out, err = cli("sql", "-f", str(f), "--format", "json")
    assert rc == 0, err
    assert json_rows(out) == [{"n": len(lake.expected())}, {"s": "a;b"}]

    monkeypatch.setattr(
        sys, "stdin", io.StringIO(f"SELECT count(*) AS n\n  FROM {TABLE};\nSELECT 2 AS b;\nquit\nSELECT 3 AS c;\n")
    )
    rc, out, err = cli("sql", "--format", "json")
    assert rc == 0, err
    assert json_rows(out) == [{"n": len(lake.expected())}, {"b": 2}]

    monkeypatch.setattr(sys, "stdin", io.StringIO("SELECT * FROM no_such_table;\nSELECT 1 AS a"))
    rc, out, err = cli("sql", "--format", "json")
    assert rc == 1 and json_rows(out) == [{"a": 1}]  # the shell goes on after an error
    assert "no_such_table" in err and "Traceback" not in err


@pytest.mark.spark
def test_as_of_reads_the_older_snapshot(cli: Any, lake: Lake) -> None:
    old, new = lake.expected("first"), lake.expected()
    assert old != new
    between = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=lake.s1_ms + 1)
    cases = {
        str(lake.s1): old,
        str(lake.s2): new,
        between.astimezone(timezone(timedelta(hours=2))).isoformat(): old,
        sql_time(lake.s1_ms): old,
        sql_time(lake.s2_ms): new,
    }
    for as_of, want in cases.items():
        rc, out, err = cli("sql", "--format", "json", "--as-of", as_of, f"SELECT * FROM {lake.ns}.{TABLE} t")
        assert rc == 0, (as_of, err)
        assert not diff(want, rows_by_key(json_rows(out))), as_of
        assert f"{lake.ns}.{TABLE}" in err  # the note naming what was read as of when
    # A metadata table is read as is, next to a time-travelled table.
    rc, out, err = cli(
        "sql",
        "--format",
        "json",
        "--as-of",
        sql_time(lake.s1_ms),
        f"SELECT (SELECT count(*) FROM {lake.ns}.{TABLE}) AS rows, "
        f"(SELECT count(*) FROM {lake.ns}.{TABLE}.snapshots) AS snaps",
    )
    assert rc == 0, err
    assert json_rows(out) == [{"rows": len(old), "snaps": 2}]
    # One-part and qualified names in one query: both at the time asked (the case: the
    # one-part name was read now while the qualified one travelled).
    for as_of, want in ((sql_time(lake.s1_ms), old), (str(lake.s1), old), (sql_time(lake.s2_ms), new)):
        rc, out, err = cli(
            "sql",
            "--format",
            "json",
            "--as-of",
            as_of,
            f"SELECT q.* FROM {lake.ns}.{TABLE} o JOIN {TABLE} q USING (_cdc_row_id)",
        )
        assert rc == 0, err
        assert not diff(want, rows_by_key(json_rows(out))), as_of
        assert len(json_rows(out)) == len(want)


@pytest.mark.spark
def test_documented_time_travel_queries(cli: Any, lake: Lake) -> None:
    def events(batches: list[dict[str, Any]], key: str) -> dict[int, str]:
        return {e["sequence"]: e["operation"] for b in batches for e in b["events"] if e["rowId"] == key}

    old, now = lake.expected("first"), lake.expected()
    # Keys alive at T and now, changed in the second run: the changes since T lead from one to the other.
    keys = [k for k in old if k in now and events(lake.second, k) and old[k] != now[k]]
    assert keys, "the workload must change some key in both runs"
    at = sql_time(lake.s1_ms)
    cat, ns = lake.settings.catalog_name, lake.settings.namespace
    for key in keys[:2]:
        rc, out, err = cli(
            "sql", "--format", "json", query.ROW_AT.format(catalog=cat, namespace=ns, table=TABLE, at=at, key=key)
        )
        assert rc == 0, err
        assert not diff({key: old[key]}, rows_by_key(json_rows(out)))

        rc, out, err = cli(
            "sql",
            "--format",
            "json",
            query.CHANGES_SINCE.format(catalog=cat, namespace=ns, table=TABLE, at=at, key=key),
        )
        assert rc == 0, err
        rows = json_rows(out)
        assert {r["_cdc_seq"]: r["_cdc_operation"] for r in rows} == events(lake.second, key)
        assert {r["snapshot_id"] for r in rows} == {lake.s2}
        # The last applied change since T is the row now.
        applied = [r for r in rows if r["_cdc_outcome"] == "applied"]
        assert applied and applied[-1]["_cdc_operation"] != "DELETE"
        last = {k: v for k, v in applied[-1].items() if k not in ("snapshot_id", "applied_at")}
        assert not diff({key: now[key]}, rows_by_key([last]))
    # Nothing changed since the newest snapshot.
    rc, out, _ = cli(
        "sql",
        "--format",
        "json",
        query.CHANGES_SINCE.format(catalog=cat, namespace=ns, table=TABLE, at=sql_time(lake.s2_ms), key=keys[0]),
    )
    assert rc == 0 and out == ""


@pytest.mark.spark
@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["SELECT * FROM no_such_table"], "no_such_table"),
        (["SELEC 1"], "SELEC"),
        (["--as-of", "123", "SELECT * FROM {ns}.orders"], "123"),
        (["--as-of", "2000-01-01", "SELECT * FROM {ns}.orders"], "2000-01-01"),
        (["--as-of", "yesterday", "SELECT 1"], "yesterday"),
        (["--as-of", "123", "SELECT * FROM orders"], "has no snapshot at that time"),
        (["--as-of", "2000-01-01", "SELECT * FROM orders o JOIN {ns}.orders q USING (_cdc_row_id)"], "2000-01-01"),
        (["--as-of", "123", "SELECT * FROM {ns}.orders, {ns}.orders__changes"], "one table"),
        (["--as-of", "123", "DELETE FROM {ns}.orders"], "applies to queries"),
        (["--max-rows", "-1", "SELECT 1"], "max-rows"),
        (["-f", "/no/such/file.sql"], "/no/such/file.sql"),
    ],
)
def test_errors_are_one_line_and_exit_1(cli: Any, lake: Lake, args: list[str], needle: str) -> None:
    rc, out, err = cli("sql", *[a.format(ns=lake.ns) for a in args])
    assert rc == 1 and out == ""
    errors = [line for line in err.splitlines() if "error" in line]
    assert len(errors) == 1 and errors[0].startswith("[cdclake] error: ") and needle in errors[0], err
    assert "\tat " not in err and "Traceback" not in err and "JVM" not in err


@pytest.mark.spark
def test_tables_command(cli: Any, lake: Lake, spark: Any) -> None:
    rc, out, err = cli("tables", "--format", "json")
    assert rc == 0, err
    by_name = {r["table"]: r for r in json_rows(out)}
    assert {TABLE, f"{TABLE}__changes"} <= set(by_name)
    main_t, changes = by_name[TABLE], by_name[f"{TABLE}__changes"]
    assert main_t["rows"] == len(lake.expected())
    assert main_t["snapshots"] == 2
    assert datetime.fromisoformat(main_t["last_applied"]) == datetime(1970, 1, 1, tzinfo=UTC) + timedelta(
        milliseconds=lake.s2_ms
    )
    stats = spark.sql(f"SELECT count(*) AS n, unix_micros(max(_cdc_ts)) AS us FROM {lake.ns}.{TABLE}__changes").first()
    assert changes["rows"] == stats["n"]
    valid = datetime.fromisoformat(changes["valid_through"])
    assert valid == datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=stats["us"])
    assert abs(changes["freshness_by_event_time"] - (datetime.now(UTC) - valid).total_seconds()) < 120
    # By commit time: everything staged was applied, so nothing waits; a side table has no staging.
    assert (main_t["pending_objects"], main_t["freshness_by_commit_time"]) == (0, 0)
    assert (changes["pending_objects"], changes["freshness_by_commit_time"]) == (None, None)

    rc, out, _ = cli("tables", "--format", "csv")
    rows = {r["table"]: r for r in csv.DictReader(io.StringIO(out))}
    assert rc == 0 and int(rows[TABLE]["rows"]) == len(lake.expected())
    rc, out, _ = cli("tables")
    lines = out.splitlines()
    assert rc == 0 and lines[0].split(" | ")[0].strip() == "table" and lines[-1] == f"({len(by_name)} rows)"
    assert any(line.startswith(f"{TABLE} ") and f" {len(lake.expected())} " in line for line in lines)


@pytest.mark.spark
def test_snapshots_command(cli: Any, lake: Lake, spark: Any) -> None:
    rc, out, err = cli("snapshots", f"{lake.ns}.{TABLE}", "--format", "json")
    assert rc == 0, err
    rows = json_rows(out)
    assert [r["snapshot_id"] for r in rows] == [lake.s1, lake.s2]
    assert rows[0]["parent_id"] is None and rows[1]["parent_id"] == lake.s1
    assert all(r["watermark"] and r["current_ancestor"] for r in rows)
    sent = [
        sum(len([e for e in b["events"] if e["table"] == TABLE]) for b in part) for part in (lake.first, lake.second)
    ]
    assert [r["received"] for r in rows] == sent
    for r in rows:
        assert r["received"] == sum(r[k] for k in ("applied", "duplicate", "superseded", "late", "quarantined"))
    meta = {
        x["snapshot_id"]: x
        for x in spark.sql(f"SELECT snapshot_id, committed_at, operation FROM {lake.ns}.{TABLE}.snapshots").collect()
    }
    for r in rows:
        assert r["operation"] == meta[r["snapshot_id"]]["operation"]

    rc, out, _ = cli("snapshots", TABLE, "--format", "csv")
    assert rc == 0 and [int(r["snapshot_id"]) for r in csv.DictReader(io.StringIO(out))] == [lake.s1, lake.s2]
    rc, out, _ = cli("snapshots", TABLE)
    assert rc == 0 and out.splitlines()[-1] == "(2 rows)" and str(lake.s2) in out.splitlines()[3]

    rc, out, err = cli("snapshots", "no_such_table")
    assert rc == 1 and out == "" and len(err.splitlines()) == 1 and "no_such_table" in err


@pytest.fixture(scope="module")
def rest_server(lake: Lake) -> Iterator[Settings]:
    with serve(lake.settings) as (url, _app):
        yield dataclasses.replace(lake.settings, rest_port=int(url.rsplit(":", 1)[1]))


@pytest.mark.spark
def test_sql_through_the_rest_catalog(cli: Any, lake: Lake, rest_server: Settings, spark: Any) -> None:
    ns = lake.settings.namespace
    rc, out, err = cli("sql", "--catalog", "rest", "--format", "json", f"SELECT * FROM {TABLE}", settings=rest_server)
    assert rc == 0, err
    assert not diff(lake.expected(), rows_by_key(json_rows(out)))
    rc, out, err = cli(
        "sql",
        "--catalog",
        "rest",
        "--format",
        "json",
        "--as-of",
        str(lake.s1),
        f"SELECT * FROM rest.{ns}.{TABLE}",
        settings=rest_server,
    )
    assert rc == 0, err
    assert not diff(lake.expected("first"), rows_by_key(json_rows(out)))
    # The caller's session keeps its current namespace.
    assert spark.catalog.currentCatalog() != "rest"

    down = dataclasses.replace(lake.settings, rest_port=free_port())
    rc, out, err = cli("sql", "--catalog", "rest", "SELECT 1", settings=down)
    assert rc == 1 and out == "" and "no REST catalog answers" in err and len(err.splitlines()) == 1


class Borrowed:
    """The test session under another name, so code that stops "its" session does not stop it."""

    def __init__(self, spark: Any) -> None:
        self._spark = spark
        self.stopped = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._spark, name)

    def stop(self) -> None:
        self.stopped = True


@pytest.mark.spark
def test_prefers_spark_connect_and_falls_back_to_a_local_session(
    cli: Any, lake: Lake, spark: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import cdclake.lake.spark

    before = (spark.catalog.currentCatalog(), spark.catalog.currentDatabase())
    remote, local = Borrowed(spark), Borrowed(spark)
    monkeypatch.setattr(cdclake.lake.spark, "connect_session", lambda url, token="": remote)
    monkeypatch.setattr(cdclake.lake.spark, "session", lambda settings, name: local)
    try:

        def run(answers: bool) -> tuple[int, str, str]:
            monkeypatch.setattr(query, "connect_answers", lambda url: answers)
            capsys.readouterr()
            rc = main(["sql", "--format", "json", f"SELECT count(*) AS n FROM {TABLE}"], settings=lake.settings)
            return rc, *capsys.readouterr()

        rc, out, err = run(answers=True)
        assert rc == 0 and json_rows(out) == [{"n": len(lake.expected())}], err
        assert remote.stopped and not local.stopped and "starting Spark" not in err

        rc, out, err = run(answers=False)
        assert rc == 0 and json_rows(out) == [{"n": len(lake.expected())}], err
        assert local.stopped and "no Spark Connect server" in err
    finally:
        spark.catalog.setCurrentCatalog(before[0])
        if before[1]:
            spark.catalog.setCurrentDatabase(before[1])


@pytest.mark.spark
def test_row_history_in_cdclake_sql_as_in_the_query_api(cli: Any, lake: Lake) -> None:
    """``<table>__history`` in ``cdclake sql``: the current rows are the table, the rows at a time
    between the two runs are the table after the first (the reference model's, both)."""
    at = lake.s1_ms + 1
    between = (
        f"_cdc_valid_from <= timestamp_millis({at}) AND (_cdc_valid_to IS NULL OR "
        f"_cdc_valid_to > timestamp_millis({at})) AND _cdc_operation <> 'DELETE'"
    )
    for where, want in (("_cdc_is_current", lake.expected()), (between, lake.expected("first"))):
        rc, out, err = cli(
            "sql", "--format", "json", "--max-rows", "0", f"SELECT * FROM {TABLE}__history WHERE {where}"
        )
        assert rc == 0, err
        got = [{k: v for k, v in r.items() if k != "_commit_timestamp"} for r in json_rows(out)]
        assert want and not diff(want, rows_by_key(got)), where
