"""Which statements the query API runs: read-only queries, decided on Spark's own parse.

The query engine never reads SQL text to learn what a statement does. It asks the Spark that
will run the statement for ``EXPLAIN EXTENDED`` of it (a command that plans and runs nothing)
and accepts the statement only when every node of the parsed plan, and of the analyzed plan
when analysis succeeds, is a node a read-only query is made of (:data:`QUERY_NODES`). Any
command, DML, DDL, ``CALL``, ``SET``, ``ADD``, ``CACHE``, ``INSERT ... DIRECTORY``, script
transformation or anything Spark adds later is refused, naming the node: an allow-list, so a
statement kind nobody thought of is refused too. Functions that call Java methods are refused
by name wherever the plans show them.

``EXPLAIN`` prints literals as they are, so a string holding a line break adds lines to the
text. Such lines can only add nodes, which makes a refusal, never hide one; a statement whose
text would add a line reading as a section header is refused outright, so that each section
is the plan Spark printed under it. The same text is then run with the same parameters, in the
same session: Spark parses it the same way twice.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from cdclake.query.statements import QueryError

PARSED, ANALYZED = "== Parsed Logical Plan ==", "== Analyzed Logical Plan =="
OPTIMIZED, PHYSICAL = "== Optimized Logical Plan ==", "== Physical Plan =="
HEADERS = (PARSED, ANALYZED, OPTIMIZED, PHYSICAL)
PLANNING_FAILED = "Error occurred during query planning"

# The logical plan nodes of read-only queries, parsed (unresolved, printed with a leading ')
# or analyzed. Taken from Spark 4.1's plans of every query form the tests run
# (tests/restcatalog/test_readonly.py); a node missing here refuses a query, never admits a write.
QUERY_NODES = frozenset(
    {
        # relations and leaves
        "UnresolvedRelation", "RelationV2", "SubqueryAlias", "View", "OneRowRelation", "LocalRelation",
        "UnresolvedInlineTable", "UnresolvedTableValuedFunction", "UnresolvedTVFAliases", "Range",
        "PlanWithUnresolvedIdentifier", "UnresolvedSubqueryColumnAliases", "RelationTimeTravel",
        # relational operators
        "Project", "Filter", "Aggregate", "Join", "LateralJoin", "Sort", "GlobalLimit", "LocalLimit", "Offset",
        "Union", "Intersect", "Except", "Distinct", "Deduplicate", "Window", "WithWindowDefinition",
        "UnresolvedHaving", "Generate", "Expand", "Pivot", "Unpivot", "Sample", "Tail", "PipeOperator",
        "Repartition", "RepartitionByExpression", "RebalancePartitions", "UnresolvedHint", "ResolvedHint",
        # common table expressions, recursive ones too
        "CTE", "WithCTE", "CTERelationDef", "CTERelationRef", "UnionLoop", "UnionLoopRef",
        # parameters bound by Spark
        "NameParameterizedQuery", "PosParameterizedQuery",
    }
)  # fmt: skip
JAVA_CALLS = ("reflect", "java_method", "try_reflect")

# A plan line: the tree's drawing (spaces, ':', '+- ', ':- '), an unresolved node's quote, the name
# (a Scala class's: capitalized). Any other line is a literal's text, where a line break took it.
_NODE = re.compile(r"^[ :]*(?:[+:]- )?'?([A-Z][\w$]*)")
_JAVA = re.compile(r"(?<![\w$])'?(" + "|".join(JAVA_CALLS) + r")\s*\(", re.I)
# EXPLAIN prints an analysis error where the analyzed plan would be: "org.apache...Exception: ..."
_ERROR = re.compile(r"^(?:[a-z_$][\w$]*\.)+[A-Z][\w$]*(?:Exception|Error)\b")


class NotAQuery(QueryError):
    """Spark's plan of the statement holds something other than a read-only query."""


@dataclass(frozen=True)
class Explained:
    """``EXPLAIN EXTENDED`` text in its sections."""

    text: str
    parsed: list[str]
    analyzed: list[str] | None
    """The analyzed plan's lines (its output schema line left out); None when analysis failed."""
    analysis_error: str | None
    physical: list[str]


def explained(text: str) -> Explained:
    """The sections of ``EXPLAIN EXTENDED`` output, or QueryError (Spark could not plan it at all:
    its message) or :class:`NotAQuery` (a section header appears twice: text in the statement
    would read as one)."""
    lines = text.splitlines()
    if not lines or lines[0] != PARSED:
        why = text.removeprefix(PLANNING_FAILED).lstrip(": \n").splitlines()
        raise QueryError(f"Spark could not plan the statement: {why[0] if why else 'no reason given'}")
    at: dict[str, int] = {}
    for i, line in enumerate(lines):
        if line in HEADERS:
            if line in at:
                raise NotAQuery(f"the statement holds text that reads as the plan header {line!r}")
            at[line] = i
    if ANALYZED not in at:
        raise QueryError("Spark printed no analyzed plan for the statement")
    ends = [*sorted(at.values()), len(lines)]

    def section(header: str) -> list[str]:
        if header not in at:
            return []
        start = at[header] + 1
        return lines[start : next(e for e in ends if e > at[header])]

    analyzed = section(ANALYZED)
    failed = bool(analyzed) and _ERROR.match(analyzed[0]) is not None
    # A plan with output columns is printed under its schema line, "name: type, ...".
    schema = bool(analyzed) and not failed and ": " in analyzed[0]
    return Explained(
        text,
        section(PARSED),
        None if failed else analyzed[1 if schema else 0 :],
        analyzed[0] if failed else None,
        section(PHYSICAL),
    )


def nodes(lines: list[str]) -> list[str]:
    """The node names of plan lines (a line that does not start like a node is a literal's)."""
    return [m.group(1) for m in map(_NODE.match, lines) if m is not None]


def check_query(ex: Explained) -> None:
    """NotAQuery unless the parsed plan, and the analyzed plan if analysis succeeded, are made of
    :data:`QUERY_NODES` and call no Java method."""
    for what, lines in (("parsed", ex.parsed), ("analyzed", ex.analyzed or [])):
        for name in nodes(lines):
            if name not in QUERY_NODES:
                raise NotAQuery(f"only read-only queries run here: Spark's {what} plan of the statement holds {name}")
        for line in lines:
            if m := _JAVA.search(line):
                raise NotAQuery(f"function {m.group(1).lower()} calls Java methods and is not allowed here")
