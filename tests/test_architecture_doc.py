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
        for path in sorted((ROOT / pkg).glob("*.py")):
            if path.name == "__init__.py":
                continue
            if path.name not in named and f"{pkg}/{path.name}" not in named:
                missing.append(f"{pkg}/{path.name}")
    assert not missing, f"ARCHITECTURE.md's module map does not name {missing}"


def test_the_paths_it_names_exist() -> None:
    text = (ROOT / "ARCHITECTURE.md").read_text()
    named = set(re.findall(r"`((?:cdclake|receiver|restcatalog|spark_jobs|dags|tests)/[\w/]+\.py)`", text))
    assert named, "no paths found: the pattern is wrong"
    gone = sorted(p for p in named if not (ROOT / p).is_file())
    assert not gone, f"ARCHITECTURE.md names files that do not exist: {gone}"
