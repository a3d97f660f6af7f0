"""The query API against an attacker holding a read-only token limited to ``<ns>.pub*`` (issue 28's
findings, one test each): no statement it sends may write, read past its rights, leave state for
another client, starve others, or read host files. What is checked is the lake and the host as
they are afterwards (metadata locations byte for byte, files on disk, rows read back with the
test's own Spark session), never the server's description of itself.

The server is real (uvicorn on 127.0.0.1) and so is its engine: a Spark Connect server in the test
JVM whose query sessions read through the served REST catalog (tests/support/query.py)."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.attack import ADMIN, OTHER, READ, SECRET, Target, make_target, metadata_locations, state
from tests.support.query import served


@pytest.fixture(scope="module")
def api(attack_api: httpx.Client) -> httpx.Client:
    return attack_api


def rows_of(spark: Any, ident: str) -> list[tuple[Any, ...]]:
    """A table's rows through the test's own (classic) session: not through the server."""
    return sorted(tuple(r) for r in spark.sql(f"SELECT * FROM {ident}").collect())


def ask(
    api: httpx.Client, sql: str, who: dict[str, str] = READ, path: str = "/v1/query", **body: Any
) -> httpx.Response:
    return api.post(path, json={"sql": sql, **body}, headers=who)


def refused(r: httpx.Response) -> str:
    """A refusal: a 4xx with a one-line message, and nothing of the table outside the rights."""
    assert 400 <= r.status_code < 500, (r.status_code, r.text)
    assert SECRET not in r.text
    message: str = r.json()["error"]["message"]
    assert message and "\n" not in message, message
    return message


# ---------------------------------------------------------------- finding 1 and 2: commands


def hostile(t: Target) -> list[str]:
    """Commands, each hidden the ways that got past the old text check (Spark nests bracketed
    comments, and ends a line comment at a carriage return) and the ways that needed no trick."""
    out, lake, ns = t.outside, t.lake, t.ns
    commands = [
        f"DROP TABLE {lake}.secret",
        f"ALTER TABLE {lake}.secret RENAME TO {lake}.pub_stolen",
        f"ALTER TABLE {lake}.pub SET TBLPROPERTIES ('write.data.path'='file://{out}')",
        f"CALL {t.settings.catalog_name}.system.remove_orphan_files(table => '{ns}.pub', location => 'file://{out}', "
        "older_than => TIMESTAMP '2999-01-01 00:00:00', dry_run => false)",
        f"INSERT OVERWRITE DIRECTORY 'file://{out}' USING csv SELECT * FROM {lake}.secret",
        f"SHOW TABLES IN {lake}",
        f"SHOW CREATE TABLE {lake}.secret",
        f"SHOW TBLPROPERTIES {lake}.secret",
        f"DESCRIBE TABLE {lake}.secret",
        "SET -v",
        f"ADD JAR 'file://{out}/x.jar'",
        "CREATE TEMPORARY FUNCTION f AS 'java.lang.String'",
    ]
    tricks = ["/* /* */ SELECT 1 */ {c}", "-- x\r{c} /*\n SELECT 1 */", "{c}"]
    no_trick = [
        f"FROM {lake}.pub INSERT OVERWRITE DIRECTORY 'file://{out}' USING csv SELECT *",
        f"WITH x AS (SELECT 1) DELETE FROM {lake}.pub",
        f"WITH x AS (SELECT 1) UPDATE {lake}.pub SET v = 'x'",
        f"WITH x AS (SELECT 1) MERGE INTO {lake}.pub p USING (SELECT 1 AS id) s ON p.id = s.id "
        "WHEN MATCHED THEN DELETE",
    ]
    return [trick.format(c=c) for c in commands for trick in tricks] + no_trick


@pytest.mark.spark
@pytest.mark.parametrize("path", ["/v1/query", "/v1/query/plan"])
def test_no_command_runs_however_it_is_written(spark: Any, api: httpx.Client, target: Target, path: str) -> None:
    before = state(target)
    rows = {name: rows_of(spark, f"{target.lake}.{name}") for name in ("pub", "pub_two", "secret")}
    for sql in hostile(target):
        message = refused(ask(api, sql, path=path))
        # Refused by the rule, or by Spark's parser (its error condition named).
        assert "only read-only queries run here" in message or re.search(r"\[[A-Z_.]+\]", message), (sql, message)
        assert state(target) == before, sql
    assert {name: rows_of(spark, f"{target.lake}.{name}") for name in rows} == rows
    # The attacker reads what it may: the same token still answers its own tables.
    assert ask(api, "SELECT id FROM pub ORDER BY id").json()["rows"] == [[1], [2]]


# ---------------------------------------------------------------- finding 3: isolation


@pytest.mark.spark
def test_nothing_one_client_sets_or_makes_is_seen_by_another(api: httpx.Client, target: Target) -> None:
    """Two clients interleaved, each statement of one between two of the other, from two threads:
    whatever the first tries (a view named like a table, the session's time zone, the current
    namespace, a function), the second's answers are the table's rows, in UTC."""
    attempts = [
        "/* /* */ SELECT 1 */ CREATE OR REPLACE TEMPORARY VIEW pub AS SELECT -1 AS id, 'fake' AS v, "
        "TIMESTAMP '1999-01-01 00:00:00' AS at",
        "/* /* */ SELECT 1 */ SET spark.sql.session.timeZone=America/Los_Angeles",
        "/* /* */ SELECT 1 */ USE spark_catalog.default",
        "/* /* */ SELECT 1 */ CREATE TEMPORARY FUNCTION upper AS 'java.lang.String'",
        "SELECT 1",
    ]
    sql = "SELECT id, upper(v) AS v, at FROM pub ORDER BY id"
    want = ask(api, sql, OTHER).json()["rows"]
    assert [r[:2] for r in want] == [[1, "P1"], [2, "P2"]] and want[0][2].startswith("2026-01-01T00:00:00")
    seen: list[Any] = []

    def other() -> None:
        for _ in range(3):
            r = ask(api, sql, OTHER)
            seen.append(r.json().get("rows", r.text))

    for attempt in attempts:
        worker = threading.Thread(target=other)
        worker.start()
        for _ in range(3):
            r = ask(api, attempt)
            assert r.status_code in (200, 400), r.text
        worker.join(120)
    assert len(seen) == 3 * len(attempts) and all(rows == want for rows in seen), seen


@pytest.mark.spark
def test_each_statement_has_a_session_of_its_own(connect_url: str, target: Target) -> None:
    """Below the API: what one query session holds (a view, a setting, a namespace) is not in the
    next one the server makes, for the same client."""
    import dataclasses

    from restcatalog import auth
    from restcatalog.app import create_app
    from restcatalog.query import connect_sessions
    from tests.support.threaded import serve_app

    # The session's catalog is the REST catalog (a view's creation asks it for the current
    # catalog), so one must be served: without it the first statement fails on its config call.
    app = create_app(target.settings)
    with serve_app(app) as url:
        settings = dataclasses.replace(target.settings, spark_connect_url=connect_url, query_catalog_url=url)
        sessions = connect_sessions(settings, app.state.tokens)
        assert sessions is not None
        client = auth.Client("reader", auth.Access.READ, (f"{target.ns}.pub*",))
        with sessions(client) as first:
            first.sql("CREATE TEMPORARY VIEW leftover AS SELECT 1 AS x")
            first.conf.set("spark.sql.session.timeZone", "America/Los_Angeles")
            first.sql("USE spark_catalog.default")
        with sessions(client) as second:
            with pytest.raises(Exception, match="TABLE_OR_VIEW_NOT_FOUND"):
                second.sql("SELECT * FROM leftover").collect()
            assert second.conf.get("spark.sql.session.timeZone") == "UTC"
            assert second.catalog.currentCatalog() == target.settings.catalog_name


# ---------------------------------------------------------------- the engine cannot write


@pytest.mark.spark
def test_a_query_session_reads_through_the_client_s_rights_and_cannot_write(connect_url: str, target: Target) -> None:
    """Whatever a statement is, the session's catalog is the REST catalog with the client's
    read-only token: a table outside its patterns does not exist there, a write is refused by the
    REST server, and the apply's writing catalog is not reachable."""
    import dataclasses

    from restcatalog import auth
    from restcatalog.app import create_app
    from restcatalog.query import connect_sessions
    from tests.support.threaded import serve_app

    app = create_app(target.settings)
    with serve_app(app) as url:
        settings = dataclasses.replace(target.settings, spark_connect_url=connect_url, query_catalog_url=url)
        sessions = connect_sessions(settings, app.state.tokens)
        assert sessions is not None
        writer = auth.Client("admin", auth.Access.WRITE, ("*",))  # even a write client's session
        before = metadata_locations(target.settings)
        with sessions(auth.Client("reader", auth.Access.READ, (f"{target.ns}.pub*",))) as s:
            names = {r["tableName"] for r in s.sql(f"SHOW TABLES IN {target.lake}").collect()}
            assert names == {"pub", "pub_two"}
            with pytest.raises(Exception, match="TABLE_OR_VIEW_NOT_FOUND"):
                s.sql(f"SELECT * FROM {target.lake}.secret").collect()
        with sessions(writer) as s:
            for sql in (
                f"INSERT INTO {target.lake}.pub VALUES (9, 'w', NULL)",
                f"DROP TABLE {target.lake}.pub_two",
                f"CREATE TABLE {target.lake}.made (id BIGINT) USING iceberg",
            ):
                with pytest.raises(Exception, match=r"(?i)forbidden|read access only|not allowed"):
                    s.sql(sql).collect()
            conf = s.conf.getAll
            assert not any(".jdbc." in k or v.startswith("jdbc:") for k, v in conf.items()), conf
        assert metadata_locations(target.settings) == before


# ---------------------------------------------------------------- finding 7: host files


@pytest.mark.spark
def test_host_files_are_not_tables(api: httpx.Client, target: Target) -> None:
    """A file by path is no table in a query session: its keys are not answered, and whether a
    path exists is not told (the answer for a missing one is the same, but for the path)."""
    pw = str(target.passwords)
    for fmt in ("json", "text", "csv", "parquet"):
        sql = f"SELECT * FROM {fmt}.`{pw}` WHERE false"
        there = ask(api, sql)
        message = refused(there)
        assert "cdclake-receiver" not in there.text and "admin" not in message.replace(pw, "")
        missing = ask(api, sql.replace(pw, pw + ".nope"))
        assert (missing.status_code, refused(missing).replace(pw + ".nope", "P")) == (
            there.status_code,
            message.replace(pw, "P"),
        )


# ---------------------------------------------------------------- finding 6: one client, everyone's server


@pytest.fixture()
def slow_loads(monkeypatch: pytest.MonkeyPatch) -> dict[str, float]:
    """The served catalog answers loads of tables named here slowly: a statement that stays in
    Spark's analysis (the server serves the query sessions' catalog in this process)."""
    from restcatalog.catalog import Catalog

    delays: dict[str, float] = {}
    load = Catalog.load

    def slow(self: Catalog, ident: tuple[str, ...]) -> Any:
        if ident[-1] in delays:
            delays[f"started {ident[-1]}"] = delays.get(f"started {ident[-1]}", 0) + 1
            time.sleep(delays[ident[-1]])
        return load(self, ident)

    monkeypatch.setattr(Catalog, "load", slow)
    return delays


@pytest.mark.spark
def test_the_deadline_covers_analysis(api: httpx.Client, slow_loads: dict[str, float]) -> None:
    slow_loads["pub_two"] = 8.0
    t0 = time.monotonic()
    r = ask(api, "SELECT * FROM pub_two LIMIT 0", timeoutS=1)
    assert r.status_code == 408, r.text  # not answered once analysis ended, 8 s later
    assert "timeout of 1 s" in r.json()["error"]["message"]
    assert time.monotonic() - t0 < 30


@pytest.mark.spark
def test_statements_at_once_are_capped_per_client_and_in_all(
    spark: Any,
    connect_url: str,
    spark_home: Path,
    tmp_path: Path,
    slow_loads: dict[str, float],
) -> None:
    t = make_target(spark, spark_home, tmp_path, query_max_concurrent=3, query_max_concurrent_per_client=2)
    slow_loads.update(pub_two=3.0, pub=3.0)
    with served(t.settings, connect_url) as c:
        answers: list[httpx.Response] = []

        def slow(who: dict[str, str], table: str) -> None:
            answers.append(ask(c, f"SELECT count(*) FROM {table}", who))

        first = [threading.Thread(target=slow, args=(READ, "pub_two")) for _ in range(2)]
        deadline = time.monotonic() + 60
        for i, w in enumerate(first, 1):
            w.start()  # each in Spark's analysis (loading pub_two) before the next asks
            while slow_loads.get("started pub_two", 0) < i and time.monotonic() < deadline:
                time.sleep(0.05)
        while (busy := ask(c, "SELECT 1", READ)).status_code != 429 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert busy.status_code == 429 and busy.headers["retry-after"] == "1", busy.text
        assert "CDCLAKE_QUERY_MAX_CONCURRENT_PER_CLIENT" in busy.json()["error"]["message"]
        third = threading.Thread(target=slow, args=(OTHER, "pub"))
        third.start()
        while not slow_loads.get("started pub") and time.monotonic() < deadline:
            time.sleep(0.05)
        while (full := ask(c, "SELECT 1", ADMIN)).status_code != 429 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert full.status_code == 429 and "CDCLAKE_QUERY_MAX_CONCURRENT)" in full.json()["error"]["message"]
        for w in [*first, third]:
            w.join(120)
        assert [a.status_code for a in answers] == [200, 200, 200]
        assert ask(c, "SELECT 1", ADMIN).status_code == 200  # the slots came back


@pytest.mark.spark
def test_an_answer_past_the_byte_cap_is_refused_not_held(
    spark: Any, connect_url: str, spark_home: Path, tmp_path: Path
) -> None:
    t = make_target(spark, spark_home, tmp_path, query_max_bytes=256 * 1024)
    with served(t.settings, connect_url) as c:
        big = "SELECT id, repeat('x', 1000) AS pad FROM range(2000)"
        r = ask(c, big, maxRows=2000)
        assert r.status_code == 413 and "262144 bytes" in r.json()["error"]["message"], r.text
        assert ask(c, big, maxRows=100).status_code == 200  # under the cap: answered


@pytest.mark.spark
def test_query_jobs_run_in_their_own_pool_behind_the_applies(spark: Any, api: httpx.Client) -> None:
    """The query API's jobs go to the ``cdclake-queries`` pool, which the scheduler fills after the
    applies' (Spark's default pool, whose minimum share no server reaches). Here the test JVM runs
    with the Connect server's scheduler configuration (cdclake.lake.spark.session)."""
    from cdclake.lake.scheduler import QUERY_POOL

    sc = spark.sparkContext._jsc.sc()
    assert str(sc.getSchedulingMode()) == "FAIR"
    assert ask(api, "SELECT count(*) FROM pub").status_code == 200  # a job: it creates its pool
    pool = sc.getPoolForName(QUERY_POOL)
    default = sc.getPoolForName("default")
    assert pool.isDefined() and default.isDefined()
    assert pool.get().weight() == 1 and pool.get().minShare() == 0
    assert default.get().minShare() > 1000 and default.get().weight() > pool.get().weight()


@pytest.mark.spark
def test_statement_after_statement_leaves_no_thread_behind(spark: Any, api: httpx.Client) -> None:
    """A dashboard polls for days: each statement's session makes a catalog Spark never closes, so
    nothing of it may start a thread (Iceberg's metrics reporter and token refresh did, for good)."""

    def threads() -> dict[str, int]:
        names = [str(t.getName()) for t in spark.sparkContext._jvm.java.lang.Thread.getAllStackTraces().keySet()]
        counts: dict[str, int] = {}
        for n in names:
            kind = re.sub(r"\d+", "N", n)
            counts[kind] = counts.get(kind, 0) + 1
        return counts

    ask(api, "SELECT count(*) FROM pub")
    before = threads()
    for _ in range(10):
        assert ask(api, "SELECT count(*) FROM pub").status_code == 200
    grown = {k: v - before.get(k, 0) for k, v in threads().items() if v - before.get(k, 0) >= 10}
    # Spark's own pools grow to their bounds under load and shrink when idle: not theirs to judge.
    spark_pools = ("block-manager-", "shuffle-exchange-", "ResultQueryStageExecution-", "QueryStageCreator-")
    assert not {k: v for k, v in grown.items() if not k.startswith(spark_pools)}, grown
