"""ARCHITECTURE.md stays true: every module of the project's packages is in its module map."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("cdclake", "receiver", "restcatalog", "spark_jobs", "dags")


def test_every_module_is_in_the_module_map() -> None:
    text = (ROOT / "ARCHITECTURE.md").read_text()
    section = text[text.index("## Module map") : text.index("## One event")]
    missing = []
    for pkg in PACKAGES:
        # A package's paragraph or table rows: its modules are named there as `name.py`.
        named = set(re.findall(r"`([\w/]+\.py)`", section))
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if path.name == "__init__.py" and len(path.relative_to(ROOT / pkg).parts) == 1:
                continue
            # A module is named by its path inside its package or sub-package (`catalog.py`,
            # `staging/__init__.py` -> `__init__.py` in the staging row), or in full.
            if path.name not in named and rel.removeprefix(f"{pkg}/") not in named and rel not in named:
                missing.append(rel)
    assert not missing, f"ARCHITECTURE.md's module map does not name {missing}"


def test_the_paths_it_names_exist() -> None:
    text = (ROOT / "ARCHITECTURE.md").read_text()
    named = set(re.findall(r"`((?:cdclake|receiver|restcatalog|spark_jobs|dags|tests)/[\w/]+\.py)`", text))
    assert named, "no paths found: the pattern is wrong"
    gone = sorted(p for p in named if not (ROOT / p).is_file())
    assert not gone, f"ARCHITECTURE.md names files that do not exist: {gone}"
