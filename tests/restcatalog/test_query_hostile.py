"""A property of the query API: whatever a client holding a read-only token limited to ``<ns>.pub*``
sends to ``/v1/query`` or ``/v1/query/plan``, nothing changes and nothing outside its rights comes
back (issue 28).

Statements are drawn from Spark SQL's command grammar (DDL, DML, ``CALL``, ``SET``/``RESET``,
``ADD``/``LIST``, ``CACHE``/``UNCACHE``/``REFRESH``, ``INSERT ... DIRECTORY``, ``USE``, ``MSCK``,
``ANALYZE``, ``CREATE FUNCTION/VIEW``, ``EXECUTE IMMEDIATE``, variables, scripts, script
transformation, Java calls, files by path) and wrapped, one to three times, in every comment,
whitespace, hint, ``FROM``-first, ``WITH``-first, parenthesis and multi-statement form Spark's
lexer reads. After each: every table's metadata location is byte-identical, no file under the
warehouse or the attacker's target folders was created, changed or removed, no row of the table
outside the rights is in any answer or error, and every refusal is a one-line 4xx.

CI runs a derandomized few (``CDCLAKE_HOSTILE_QUERY_EXAMPLES`` sets how many, random, for the long
run: ``make test-hostile``)."""

from __future__ import annotations

import re
from collections.abc import Callable

import httpx
import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from tests.support.attack import READ, SECRET, Target, state
from tests.support.hostile_gen import examples


def commands(t: Target) -> list[str]:
    lake, ns, out, cat = t.lake, t.ns, t.outside, t.settings.catalog_name
    sec, pub = f"{lake}.secret", f"{lake}.pub"
    procedures = [
        f"{cat}.system.rollback_to_snapshot('{ns}.pub', 1)",
        f"{cat}.system.expire_snapshots(table => '{ns}.pub', retain_last => 1)",
        f"{cat}.system.remove_orphan_files(table => '{ns}.pub', location => 'file://{out}', dry_run => false)",
        f"{cat}.system.rewrite_data_files(table => '{ns}.pub')",
        f"{cat}.system.register_table(table => '{ns}.pub_reg', metadata_file => 'file://{out}/m.json')",
        f"{cat}.system.add_files(table => '{ns}.pub', source_table => '`parquet`.`{out}`')",
        f"{cat}.system.set_current_snapshot('{ns}.pub', 1)",
        f"{cat}.system.snapshot('{ns}.secret', '{ns}.pub_snap')",
    ]
    return [
        # DDL
        f"CREATE TABLE {lake}.pub_new (id INT) USING iceberg",
        f"CREATE TABLE {lake}.pub_ctas USING iceberg AS SELECT * FROM {sec}",
        f"CREATE OR REPLACE TABLE {pub} USING iceberg AS SELECT * FROM {sec}",
        f"DROP TABLE {sec}",
        f"DROP TABLE {pub} PURGE",
        f"ALTER TABLE {sec} RENAME TO {lake}.pub_stolen",
        f"ALTER TABLE {pub} ADD COLUMN z INT",
        f"ALTER TABLE {pub} DROP COLUMN v",
        f"ALTER TABLE {pub} SET TBLPROPERTIES ('write.data.path'='file://{out}')",
        f"ALTER TABLE {pub} SET LOCATION 'file://{out}'",
        f"ALTER TABLE {pub} CREATE BRANCH b",
        f"TRUNCATE TABLE {pub}",
        f"CREATE NAMESPACE {lake}_x",
        f"DROP NAMESPACE {lake} CASCADE",
        f"CREATE VIEW {lake}.pub_view AS SELECT * FROM {sec}",
        "CREATE TEMPORARY VIEW pub AS SELECT -1 AS id",
        "CREATE GLOBAL TEMPORARY VIEW g AS SELECT 1",
        "CREATE TEMPORARY FUNCTION f AS 'java.lang.String'",
        f"CREATE FUNCTION {lake}.f AS 'java.lang.String' USING JAR 'file://{out}/x.jar'",
        "DROP TEMPORARY FUNCTION IF EXISTS f",
        # DML
        f"INSERT INTO {pub} VALUES (9, 'x', NULL)",
        f"INSERT OVERWRITE {pub} SELECT * FROM {pub} WHERE false",
        f"DELETE FROM {pub}",
        f"UPDATE {pub} SET v = 'x'",
        f"MERGE INTO {pub} p USING (SELECT 1 AS id) s ON p.id = s.id WHEN MATCHED THEN DELETE",
        f"INSERT OVERWRITE DIRECTORY 'file://{out}' USING csv SELECT * FROM {sec}",
        f"INSERT OVERWRITE LOCAL DIRECTORY '{out}' STORED AS TEXTFILE SELECT 1",
        f"LOAD DATA LOCAL INPATH '{t.passwords}' INTO TABLE {pub}",
        *(f"CALL {p}" for p in procedures),
        # session and engine state
        "SET spark.sql.session.timeZone=America/Los_Angeles",
        f"SET spark.sql.catalog.{cat}.type=jdbc",
        "SET spark.sql.runSQLOnFiles=true",
        "SET -v",
        "RESET",
        "RESET spark.sql.runSQLOnFiles",
        "SET TIME ZONE 'America/New_York'",
        f"ADD JAR 'file://{out}/x.jar'",
        f"ADD FILE '{t.passwords}'",
        f"ADD ARCHIVE '{out}/a.zip'",
        "LIST JAR",
        "LIST FILE",
        f"CACHE TABLE {pub}",
        f"CACHE LAZY TABLE c AS SELECT * FROM {sec}",
        f"UNCACHE TABLE {pub}",
        "CLEAR CACHE",
        f"REFRESH TABLE {pub}",
        f"REFRESH 'file://{out}'",
        "REFRESH FUNCTION f",
        "USE spark_catalog.default",
        "USE NAMESPACE default",
        f"MSCK REPAIR TABLE {pub}",
        f"ANALYZE TABLE {pub} COMPUTE STATISTICS",
        f"EXECUTE IMMEDIATE 'DROP TABLE {sec}'",
        "DECLARE VARIABLE v INT DEFAULT 1",
        "SET VARIABLE v = 2",
        f"BEGIN DROP TABLE {sec}; END",
        # metadata outside the rights
        f"SHOW TABLES IN {lake}",
        f"SHOW CREATE TABLE {sec}",
        f"SHOW TBLPROPERTIES {sec}",
        f"SHOW COLUMNS IN {sec}",
        "SHOW CATALOGS",
        f"DESCRIBE TABLE EXTENDED {sec}",
        f"DESCRIBE QUERY SELECT * FROM {sec}",
        f"EXPLAIN SELECT * FROM {sec}",
        # queries that run something, or read what they may not
        f"SELECT TRANSFORM(id) USING 'touch {out}/pwned' FROM {pub}",
        "SELECT reflect('java.lang.System', 'getenv', 'HOME')",
        "SELECT java_method('java.lang.Runtime', 'getRuntime')",
        f"SELECT * FROM json.`{t.passwords}`",
        f"SELECT * FROM text.`{out}`",
        f"SELECT * FROM {sec}",
        "SELECT * FROM spark_catalog.default.x",
    ]


# Ways to write a statement that a reader of its text might take for another: comments (Spark
# nests bracketed ones, ends a line comment at \r or \n), hints, whitespace Spark skips,
# parentheses, FROM-first and WITH-first, a second statement, letter case.
# What a refusal names: our rule (not a query, a Java call, a table outside the rights) or
# Spark's (its parser's or analyzer's error condition).
RULES = r"only read-only queries run here|calls Java methods|may not read|\[[A-Z_.]+\]|Spark could not"

WRAPS: list[Callable[[str], str]] = [
    lambda s: f"/* c */ {s}",
    lambda s: f"/* /* */ SELECT 1 */ {s}",
    lambda s: f"/* /* /* */ */ SELECT 1 */\n{s}",
    lambda s: f"-- x\n{s}",
    lambda s: f"-- x\r{s} /*\n SELECT 1 */",
    lambda s: f"--\r\n{s}",
    lambda s: f"/*+ BROADCAST(x) */ {s}",
    lambda s: f"{s} -- tail",
    lambda s: f"{s} /* tail */",
    lambda s: f"\t\f\n {s}\n",
    lambda s: f"({s})",
    lambda s: f"FROM {s}",
    lambda s: f"WITH x AS (SELECT 1) {s}",
    lambda s: f"SELECT 1; {s}",
    lambda s: f"{s}; SELECT 1",
    lambda s: f"SELECT 1 /* ; */; {s}",
    lambda s: f"SELECT '/*' AS a; {s} --*/",
    lambda s: s.lower(),
    lambda s: s.swapcase(),
    lambda s: f"{s};;",
]


@pytest.mark.spark
def test_no_statement_a_reader_sends_changes_anything_or_reads_past_its_rights(
    attack_api: httpx.Client, target: Target
) -> None:
    before = state(target)
    statement = st.tuples(
        st.sampled_from(commands(target)),
        st.lists(st.sampled_from(range(len(WRAPS))), min_size=1, max_size=3),
        st.sampled_from(["/v1/query", "/v1/query/plan"]),
    )

    @hsettings(**examples(ci=60, env="CDCLAKE_HOSTILE_QUERY_EXAMPLES"))
    @given(statement)
    def check(drawn: tuple[str, list[int], str]) -> None:
        sql, wraps, path = drawn
        for w in wraps:
            sql = WRAPS[w](sql)
        r = attack_api.post(path, json={"sql": sql}, headers=READ)
        assert SECRET not in r.text, (sql, r.text)
        if r.status_code != 200:  # a refusal: the client's to fix, one line, naming why
            assert 400 <= r.status_code < 500, (sql, r.status_code, r.text)
            message = r.json()["error"]["message"]
            assert message and "\n" not in message, (sql, message)
            assert re.search(RULES, message), (sql, message)
        assert state(target) == before, sql

    check()
