"""ARCHITECTURE.md stays true: every module of the project's packages is in its module map, in
the block of its own package or sub-package, and every path it names exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("cdclake", "receiver", "restcatalog", "spark_jobs", "dags")


def blocks(section: str) -> dict[str, str]:
    """The module map's blocks by their key: a table row by its first cell (`` `lake/` ``,
    `` `client/` ``), a paragraph by the package it opens with (`` `receiver/`: ``)."""
    out: dict[str, str] = {}
    for line in section.splitlines():
        row = re.match(r"\| `([\w/.]+)`[^|]*\|(.*)\|\s*$", line)
        if row:
            out["cdclake/" + row.group(1)] = row.group(2)
    for paragraph in re.split(r"\n\s*\n", section):
        head = re.match(r"`(\w+/)`:", paragraph.strip())
        if head:
            out[head.group(1)] = paragraph
    return out


def block_key(rel: str) -> str:
    """The block that must name ``rel``: its sub-package's row inside cdclake, else its package's."""
    parts = rel.split("/")
    if parts[0] == "cdclake" and len(parts) > 2:
        return f"cdclake/{parts[1]}/"
    if parts[0] == "cdclake":
        return f"cdclake/{parts[1]}"
    return f"{parts[0]}/"


def test_every_module_is_named_in_its_own_block() -> None:
    text = (ROOT / "ARCHITECTURE.md").read_text()
    section = text[text.index("## Module map") : text.index("## One event")]
    found = blocks(section)
    assert {"cdclake/contracts/", "cdclake/lake/", "receiver/", "spark_jobs/"} <= set(found), sorted(found)
    missing = []
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            inside = path.relative_to(ROOT / pkg).parts
            if path.name == "__init__.py" and len(inside) <= 2:
                continue  # a package's docstring
            if f"`{rel}`" in section:
                continue  # named in full, anywhere in the map
            block = found.get(block_key(rel), "")
            if f"`{path.name}`" not in block and block_key(rel) != f"cdclake/{path.name}":
                missing.append(f"{rel} (in the block of {block_key(rel)})")
    assert not missing, f"ARCHITECTURE.md's module map does not name {missing}"


def test_the_paths_it_names_exist() -> None:
    text = (ROOT / "ARCHITECTURE.md").read_text()
    named = set(re.findall(r"`((?:cdclake|receiver|restcatalog|spark_jobs|dags|tests)/[\w/]+\.py)`", text))
    assert named, "no paths found: the pattern is wrong"
    gone = sorted(p for p in named if not (ROOT / p).is_file())
    assert not gone, f"ARCHITECTURE.md names files that do not exist: {gone}"
