"""Which tables a statement touches, from Spark's analyzed plan (``EXPLAIN EXTENDED``), for the
query engine's read rights (:mod:`cdclake.query.queries`).

The physical plan is not enough: the optimizer removes reads it can answer without them
(``WHERE false``, ``LIMIT 0``, an aggregate from manifests), and the answer still carries the
table's columns; and a statement that fails analysis would answer with Spark's message (a
column list, "did you mean"). The analyzed plan keeps every relation the statement resolved,
with its name quoted part by part, and, when analysis failed, the names it could not resolve.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

ANALYZED = "== Analyzed Logical Plan =="
# Iceberg's metadata tables: ``<table>.<name>`` reads ``<table>``'s metadata.
METADATA_TABLES = frozenset(
    [
        "history",
        "metadata_log_entries",
        "snapshots",
        "entries",
        "files",
        "data_files",
        "delete_files",
        "manifests",
        "partitions",
        "refs",
        "position_deletes",
        "all_data_files",
        "all_delete_files",
        "all_files",
        "all_manifests",
        "all_entries",
    ]
)
_PART = r"(?:`(?:[^`]|``)*`|[A-Za-z0-9_]+)"  # Spark quotes a part unless it is word characters
_NAME = re.compile(rf"\s({_PART}(?:\.{_PART})*)$")
_TRAVEL = re.compile(r"\s(?:VERSION|TIMESTAMP) AS OF .*$")
_UNRESOLVED = re.compile(r"'UnresolvedRelation \[(.*?)\], \[")
_CTE = re.compile(r"^CTE \[(.*)\]$", re.M)


@dataclass
class Touched:
    resolved: list[list[str]] = field(default_factory=list)  # multipart names, catalog first
    unresolved: list[list[str]] = field(default_factory=list)  # as written (one part: the current namespace)
    failed: bool = False  # analysis failed: Spark's error is the answer once the rights allow it


def touched(extended: str) -> Touched | None:
    """The relations of ``EXPLAIN EXTENDED`` text; None when EXPLAIN printed no analyzed plan
    (planning failed before analysis could be shown)."""
    if ANALYZED not in extended:
        return None
    parsed, _, rest = extended.partition(ANALYZED)
    analyzed = rest.split("\n== ", 1)[0].strip("\n")
    ctes = {n.strip() for m in _CTE.finditer(parsed) for n in m.group(1).split(",")}
    out = Touched(failed="Exception:" in analyzed.split("\n", 1)[0])
    for line in analyzed.splitlines():
        if "RelationV2[" in line:
            m = _NAME.search(_TRAVEL.sub("", line.rstrip()))
            if m is None:
                raise ValueError(f"a relation this module cannot read: {line.strip()[:200]!r}")
            out.resolved.append(parts(m.group(1)))
        for u in _UNRESOLVED.finditer(line):
            names = u.group(1).split(", ")
            if not (len(names) == 1 and names[0] in ctes):
                out.unresolved.append(names)
    return out


def parts(name: str) -> list[str]:
    """``lake.cdc.`a.b``` -> ``["lake", "cdc", "a.b"]``."""
    return [p[1:-1].replace("``", "`") if p.startswith("`") else p for p in re.findall(_PART, name)]


def table_of(name: list[str], catalog: str, namespace: str) -> tuple[str, str] | None:
    """(namespace, table) whose rights cover reading ``name`` (a metadata table: its table's);
    None for a name outside ``catalog``."""
    if len(name) == 1:
        return namespace, name[0]
    if len(name) == 2:
        return name[0], name[1]
    if name[0].lower() != catalog.lower():
        return None
    rest = name[1:]
    if len(rest) > 2 and rest[-1].lower() in METADATA_TABLES:
        rest = rest[:-1]
    return ".".join(rest[:-1]), rest[-1]
