"""The project's import graph, read from the source (``ast``, nothing is imported).

Rules:

- no import cycle among project modules. Module-level imports (class bodies and module-level
  ``if``/``try`` included) are checked first; then the same graph with the imports made inside
  functions added, reported separately: a lazy import only postpones a cycle (the two modules
  still need each other), so it is refused too. Imports under ``if TYPE_CHECKING:`` never run,
  but a type names the module it comes from as surely as a call does: they count with the lazy
  ones, in the cycle check and in every rule below.
- the two services stay apart: ``receiver`` never imports ``restcatalog`` and ``restcatalog``
  never imports ``receiver``, lazily or not. What both need lives in ``cdclake``.
- inside ``cdclake``, dependencies point one way between its sub-packages (:data:`LAYERS`), lazily
  or not: contracts <- config <- staging <- lake <- query <- launch <- dev <- cli; ``debezium``
  (the Debezium adapter) on contracts and config; ``orchestration`` (the Airflow side) and
  ``lakehouse`` (the Lakehouse page) on lake and below; ``service`` on contracts and config only,
  the producer SDK (``client``) on contracts alone.
- what runs in production (the services, the jobs, the DAGs) never imports ``cdclake.dev`` (the
  local stack, the demo, the reference model) or ``cdclake.cli``.
- ``cdclake`` (the shared layer) imports none of ``receiver``, ``restcatalog``, ``spark_jobs``,
  ``dags`` at module level. Its lazy imports of them are entry points (the CLI starting a
  service) and are listed in :data:`LAZY_UPWARD`, so a new one is a decision, not an accident.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("cdclake", "receiver", "restcatalog", "spark_jobs", "dags", "plugins")
SERVICES = ("receiver", "restcatalog")
ABOVE_CDCLAKE = ("receiver", "restcatalog", "spark_jobs", "dags", "plugins")

LAZY_UPWARD = {
    # `cdclake rest`: the CLI serves the REST catalog in-process; importing it inside `rest()`
    # keeps uvicorn/Starlette/pyiceberg out of every other CLI command and out of the Airflow
    # workers that import cdclake.
    ("cdclake.cli.main", "restcatalog.__main__"),
}
"""Imports inside functions from cdclake up into a service or job: (importer, imported)."""

_BELOW_DEV = {
    "contracts",
    "config",
    "debezium",
    "staging",
    "lake",
    "query",
    "service",
    "orchestration",
    "lakehouse",
    "launch",
    "client",
}
LAYERS: dict[str, set[str]] = {
    "contracts": set(),
    "config": {"contracts"},
    "client": {"contracts"},
    "debezium": {"contracts", "config"},
    "staging": {"contracts", "config"},
    "lake": {"contracts", "config", "staging"},
    "query": {"contracts", "config", "lake"},
    "service": {"contracts", "config"},
    "orchestration": {"contracts", "config", "staging", "lake"},
    "lakehouse": {"contracts", "config", "staging", "lake"},
    "launch": {"contracts", "config", "lake", "query", "service"},
    "dev": _BELOW_DEV,
    "cli": _BELOW_DEV | {"dev"},
}
"""cdclake's sub-packages -> the others each may import (its own modules always)."""
PRODUCT_MAY_NOT_IMPORT = ("cdclake.dev", "cdclake.cli")


@dataclass(frozen=True)
class Import:
    source: str
    target: str
    line: int
    lazy: bool
    type_only: bool = False

    def __str__(self) -> str:
        kind = "type-only" if self.type_only else "lazy" if self.lazy else "module-level"
        return f"{self.source} -> {self.target} ({module_path(self.source)}:{self.line}, {kind})"


def module_files() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            if ".venv" in path.parts:
                continue
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


MODULES = module_files()


def module_path(name: str) -> str:
    return str(MODULES[name].relative_to(ROOT))


def is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def resolve(name: str) -> str | None:
    """The deepest project module ``name`` names (``a.b.C`` -> ``a.b``), or None."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in MODULES:
            return candidate
        parts.pop()
    return None


def imports_of(module: str) -> Iterator[Import]:
    tree = ast.parse(MODULES[module].read_text(), filename=str(MODULES[module]))
    package = module if is_package(module) else module.rpartition(".")[0]

    def targets(node: ast.Import | ast.ImportFrom) -> Iterator[str]:
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
            return
        base = node.module or ""
        if node.level:
            anchor = package.split(".")
            anchor = anchor[: len(anchor) - (node.level - 1)]
            base = ".".join([*anchor, base] if base else anchor)
        for alias in node.names:
            # `from a import b`: the module a.b if there is one, else a name in a.
            yield f"{base}.{alias.name}" if resolve(f"{base}.{alias.name}") != resolve(base) else base

    def walk(nodes: list[ast.stmt], lazy: bool, type_only: bool = False) -> Iterator[Import]:
        for node in nodes:
            if isinstance(node, ast.Import | ast.ImportFrom):
                for name in targets(node):
                    target = resolve(name)
                    if target is not None and target != module:
                        yield Import(module, target, node.lineno, lazy, type_only)
            elif isinstance(node, ast.If) and is_type_checking(node.test):
                yield from walk(node.body, True, True)
                yield from walk(node.orelse, lazy, type_only)
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                yield from walk(node.body, True, type_only)
            else:
                for field in ("body", "orelse", "finalbody", "handlers", "cases"):
                    for child in getattr(node, field, []) or []:
                        if isinstance(child, ast.ExceptHandler | ast.match_case):
                            yield from walk(child.body, lazy, type_only)
                        elif isinstance(child, ast.stmt):
                            yield from walk([child], lazy, type_only)

    yield from walk(tree.body, False)


ALL = [imp for module in MODULES for imp in imports_of(module)]


def cycles(edges: list[Import]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for e in edges:
        graph[e.source].add(e.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def describe(component: list[str], edges: list[Import]) -> str:
    inside = [str(e) for e in edges if e.source in component and e.target in component]
    return " <-> ".join(component) + ":\n    " + "\n    ".join(sorted(set(inside)))


def top(module: str) -> str:
    return module.partition(".")[0]


def test_the_graph_is_read() -> None:
    # A parser that found nothing would pass every rule below.
    assert {"cdclake.config.settings", "receiver.app", "restcatalog.app", "spark_jobs.apply", "dags.cdc_apply"} <= set(
        MODULES
    )
    assert any(e.source == "receiver.app" and e.target == "cdclake.config.settings" and not e.lazy for e in ALL)
    assert any(e.source == "dags.cdc_apply" and e.target == "cdclake.orchestration.apply_plan" and e.lazy for e in ALL)
    # Imports under TYPE_CHECKING are read too (a type-only back edge is a back edge).
    assert any(e.source == "cdclake.staging.clock" and e.target == "cdclake.staging.store" and e.type_only for e in ALL)


def test_no_module_level_import_cycle() -> None:
    eager = [e for e in ALL if not e.lazy]
    found = cycles(eager)
    assert not found, "import cycles (module level):\n" + "\n".join(describe(c, eager) for c in found)


def test_no_import_cycle_through_lazy_imports() -> None:
    eager_cycles = cycles([e for e in ALL if not e.lazy])
    found = [c for c in cycles(ALL) if c not in eager_cycles]
    assert not found, "import cycles closed by imports inside functions:\n" + "\n".join(describe(c, ALL) for c in found)


def test_services_do_not_import_each_other() -> None:
    sideways = [
        str(e)
        for e in ALL
        if top(e.source) in SERVICES and top(e.target) in SERVICES and top(e.source) != top(e.target)
    ]
    assert not sideways, "receiver and restcatalog import each other (move the shared part to cdclake):\n" + "\n".join(
        sideways
    )


def test_cdclake_does_not_import_upward() -> None:
    upward = [e for e in ALL if top(e.source) == "cdclake" and top(e.target) in ABOVE_CDCLAKE]
    eager = [str(e) for e in upward if not e.lazy]
    assert not eager, "cdclake imports a service, job or DAG at module level:\n" + "\n".join(eager)
    lazy = {(e.source, e.target) for e in upward if e.lazy}
    assert lazy == LAZY_UPWARD, f"cdclake's lazy imports upward changed: {sorted(lazy)} (listed: {sorted(LAZY_UPWARD)})"


def layer(module: str) -> str | None:
    """The cdclake sub-package ``module`` belongs to (``cdclake.client`` counts as one)."""
    parts = module.split(".")
    return parts[1] if parts[0] == "cdclake" and len(parts) > 1 and parts[1] != "__main__" else None


def test_every_cdclake_module_has_a_layer() -> None:
    unplaced = [
        m
        for m in MODULES
        if top(m) == "cdclake" and m not in ("cdclake", "cdclake.__main__") and layer(m) not in LAYERS
    ]
    assert not unplaced, f"modules outside cdclake's layers (add the sub-package to LAYERS): {unplaced}"


def test_cdclake_layers_point_one_way() -> None:
    wrong = [
        str(e)
        for e in ALL
        if (src := layer(e.source)) is not None
        and (dst := layer(e.target)) is not None
        and src != dst
        and dst not in LAYERS[src]
    ]
    assert not wrong, "imports against cdclake's layering (LAYERS):\n" + "\n".join(wrong)


def test_production_code_does_not_import_the_dev_stack_or_the_cli() -> None:
    wrong = [str(e) for e in ALL if top(e.source) in ABOVE_CDCLAKE and e.target.startswith(PRODUCT_MAY_NOT_IMPORT)]
    assert not wrong, "services, jobs or DAGs import cdclake.dev or cdclake.cli:\n" + "\n".join(wrong)


def test_the_layer_rules_can_fail() -> None:
    # The rules above pass vacuously if layer() placed nothing: check it sees real edges.
    assert layer("cdclake.contracts.events") == "contracts" and layer("cdclake.client") == "client"
    assert any(layer(e.source) == "cli" and layer(e.target) == "dev" for e in ALL)
    assert any(layer(e.source) == "lake" and layer(e.target) == "staging" for e in ALL)
