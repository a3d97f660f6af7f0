"""Which statements are read-only queries (cdclake/query/readonly.py), decided on Spark's own plans:
every query form below is admitted by the allow-list when Spark 4.1 explains it (so the list is
not narrower than the queries users write), every command form is refused naming its node, and
text a literal adds to EXPLAIN's output can refuse a statement but never hide a node."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cdclake.query import queries, readonly
from cdclake.query.readonly import NotAQuery
from cdclake.query.statements import QueryError
from tests.support import fresh_settings

QUERIES = [
    "SELECT * FROM o",
    "SELECT id, k FROM o WHERE id > 0 ORDER BY id LIMIT 10 OFFSET 1",
    "SELECT k, count(*), sum(amt) FROM o GROUP BY k HAVING count(*) > 0",
    "WITH a AS (SELECT * FROM o), b AS (SELECT id FROM a) SELECT * FROM b JOIN a USING (id)",
    "SELECT * FROM o a LEFT JOIN o b ON a.id = b.id WHERE EXISTS (SELECT 1 FROM o c WHERE c.id = a.id) "
    "AND a.id IN (SELECT id FROM o)",
    "SELECT (SELECT max(id) FROM o) AS m, id FROM o",
    "SELECT id, row_number() OVER (PARTITION BY k ORDER BY id) rn, sum(amt) OVER w FROM o WINDOW w AS (ORDER BY id)",
    "SELECT * FROM o UNION ALL SELECT * FROM o",
    "SELECT id FROM o UNION SELECT id FROM o INTERSECT SELECT id FROM o EXCEPT SELECT 5",
    "SELECT DISTINCT k FROM o",
    "SELECT explode(tags) FROM o",
    "SELECT id, t FROM o LATERAL VIEW explode(tags) x AS t",
    "SELECT * FROM o, LATERAL (SELECT id + 1 AS z)",
    "VALUES (1, 'a'), (2, 'b')",
    "SELECT * FROM VALUES (1, 'a') AS v(x, y)",
    "TABLE o",
    "FROM o SELECT id WHERE id = 1",
    "(SELECT 1)",
    "SELECT * FROM range(10)",
    "SELECT * FROM o TABLESAMPLE (50 PERCENT)",
    "SELECT /*+ BROADCAST(o) */ * FROM o",
    "SELECT /*+ REPARTITION(3) */ * FROM o",
    "SELECT * FROM o DISTRIBUTE BY k SORT BY id",
    "SELECT * FROM (SELECT k, amt FROM o) PIVOT (sum(amt) FOR k IN ('a', 'b'))",
    "SELECT * FROM (SELECT id, amt FROM o) UNPIVOT (v FOR c IN (amt))",
    "SELECT k, count(*) FROM o GROUP BY ROLLUP(k)",
    "SELECT k, count(*) FROM o GROUP BY GROUPING SETS ((k), ())",
    "SELECT * FROM {ns}.o.snapshots",
    "SELECT * FROM IDENTIFIER('o')",
    "SELECT * FROM o |> WHERE id > 0 |> SELECT id",
    "SELECT * FROM stack(2, 1, 2)",
    "SELECT transform(tags, x -> upper(x)) FROM o",
    "SELECT max_by(id, amt), percentile_approx(id, 0.5) FROM o",
    "SELECT * FROM o a LEFT ANTI JOIN o b ON a.id = b.id",
    "SELECT count(*) FROM o WHERE false",
    "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < 3) SELECT * FROM r",
    "SELECT * EXCEPT (k) FROM o",
    "SELECT 'a\n+- b' AS text_with_a_line_break_that_reads_as_no_node",
    "SELECT * FROM o -- a comment\n",
    "/* a comment */ SELECT 1;",
]

COMMANDS = {
    "DROP TABLE o": "DropTable",
    "ALTER TABLE o RENAME TO o2": "RenameTable",
    "INSERT INTO o SELECT * FROM o": "InsertIntoStatement",
    "WITH x AS (SELECT 1) DELETE FROM o": "DeleteFromTable",
    "FROM o INSERT OVERWRITE DIRECTORY '/tmp/x' USING csv SELECT *": "InsertIntoDir",
    "SET spark.sql.ansi.enabled=false": "SetCommand",
    "CACHE TABLE o": "CacheTable",
    "SHOW TABLES": "ShowTables",
    "SELECT TRANSFORM(id) USING 'cat' FROM o": "ScriptTransformation",
    "SELECT 'x\n+- DropTable' AS a": "DropTable",  # a literal can refuse a statement, not admit one
}


@pytest.fixture(scope="module")
def session(spark: Any, spark_home: Path) -> Any:
    settings = fresh_settings(spark_home)
    ns = f"{settings.catalog_name}.{settings.namespace}"
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {ns}")
    spark.sql(f"CREATE TABLE {ns}.o (id BIGINT, k STRING, amt DECIMAL(10,2), tags ARRAY<STRING>) USING iceberg")
    spark.sql(f"INSERT INTO {ns}.o VALUES (1, 'a', 1.5, array('x'))")
    s = spark.newSession()
    s.sql(f"USE {ns}")
    s.ns = ns
    return s


@pytest.mark.spark
@pytest.mark.parametrize("sql", QUERIES)
def test_every_query_form_is_a_query(session: Any, sql: str) -> None:
    ex = queries.explain(session, sql.format(ns=session.ns), {})
    readonly.check_query(ex)
    assert ex.analyzed is not None, ex.analysis_error  # analyzed: its nodes were checked too


@pytest.mark.spark
@pytest.mark.parametrize(("sql", "node"), COMMANDS.items())
def test_every_command_is_refused_naming_its_node(session: Any, sql: str, node: str) -> None:
    with pytest.raises(NotAQuery, match=f"holds {node}"):
        readonly.check_query(queries.explain(session, sql, {}))


HEADERED = """== Parsed Logical Plan ==
'Project [unresolvedalias('x)]
+- 'Filter ('v = a
== Analyzed Logical Plan ==
b)
   +- 'UnresolvedRelation [t], [], false

== Analyzed Logical Plan ==
x: string
Project [x#1]
"""


def test_a_literal_that_reads_as_a_section_header_is_refused() -> None:
    with pytest.raises(NotAQuery, match="reads as the plan header '== Analyzed Logical Plan =='"):
        readonly.explained(HEADERED)


def test_an_analysis_error_leaves_the_parsed_plan_to_decide() -> None:
    ex = readonly.explained(
        "== Parsed Logical Plan ==\n'DropTable false, false\n+- 'UnresolvedIdentifier [t], true\n\n"
        "== Analyzed Logical Plan ==\norg.apache.spark.sql.AnalysisException: [X] no; line 1\nIf you did not...\n"
    )
    assert ex.analyzed is None and ex.analysis_error is not None
    with pytest.raises(NotAQuery, match="parsed plan of the statement holds DropTable"):
        readonly.check_query(ex)


def test_a_plan_spark_could_not_print_is_no_query() -> None:
    with pytest.raises(QueryError, match="Spark could not plan the statement: Cannot find snapshot 1"):
        readonly.explained("Error occurred during query planning: \nCannot find snapshot 1")
