"""Benchmark figures live on one page, docs/benchmarks.md, with their command and date; the code
says why it chose what it chose and points there (issue 30, item 4).

Read from the source (``tokenize`` and ``ast``, nothing is imported): every comment and every
docstring (any bare string statement) of the project's packages. A timing, a size or a core count
given as an approximate measurement (``~5 ms``, ``~1.6 cores``, ``~130 MB``), a throughput
(``1,810 events/s``), a before/after pair (``6.3 s -> 4.9 s``) or a speed ratio (``3x faster``)
fails the test. Design constants (a default, a cap, a timeout, a poll interval: ``every 0.5 s``,
``32 MiB``) are not measurements and pass; write a value derived from them as its derivation
(``MAX_ATTEMPTS x READ_TIMEOUT_S``) rather than as ``~15 s``.

Every ``docs/benchmarks.md, "<section>"`` a comment or docstring names must be a heading of that
page (the start of one), so a pointer does not outlive its section.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("cdclake", "receiver", "restcatalog", "spark_jobs", "dags", "plugins")
BENCHMARKS = ROOT / "docs" / "benchmarks.md"

_NUMBER = r"\d[\d,]*(?:\.\d+)?"
_UNIT = r"(?:ns|µs|us|ms|s|secs?|seconds|min|minutes|cores?|[kKMG]i?B|x|×|%)(?![\w/])"
FIGURE = re.compile(
    "|".join(
        (
            rf"~\s?{_NUMBER}\s?{_UNIT}",  # ~5 ms, ~1.6 cores, ~130 MB, ~10x
            rf"{_NUMBER}\s?(?:events|rows|requests|commits|batches|queries)/s\b",  # 1,810 events/s
            rf"{_NUMBER}\s?(?:ns|µs|us|ms|s)\s?(?:->|→)\s?{_NUMBER}",  # 6.3 s -> 4.9 s
            rf"{_NUMBER}\s?(?:x|×)\s+(?:faster|slower|cheaper|costlier|the cost)\b",  # 3x faster
        )
    )
)
"""What a measurement looks like in a comment or docstring."""

BENCHMARK_REF = re.compile(r'docs/benchmarks\.md[,:;]?\s*"([^"]+)"')


def texts(path: Path) -> Iterator[tuple[int, str]]:
    """(line, text) of every comment and every bare string statement (docstrings) of ``path``."""
    source = path.read_text(encoding="utf-8")
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            yield tok.start[0], tok.string
    for node in ast.walk(ast.parse(source, filename=str(path))):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            for offset, line in enumerate(node.value.value.splitlines()):
                yield node.lineno + offset, line


def sources() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


def figures(path: Path) -> list[str]:
    rel = path.relative_to(ROOT)
    return [f"{rel}:{line}: {text.strip()}" for line, text in texts(path) if FIGURE.search(text)]


@pytest.mark.parametrize(
    "text",
    [
        "# the run stepped through every digit of every number, ~5 ms per 250 kB batch).",
        "one small apply alone keeps ~1.6 cores busy (driver",
        "# body): ~18 s for a put, ~15 s for other calls (measured against SeaweedFS, SIGSTOPped).",
        "no executor copies ~130 MB per application.",
        "# Decoded batches are ~10x their body in memory",
        "at 200 a large transaction landed 1,810 events/s",
        "# than it saved (1.1M events: fit 6.3 s -> 4.9 s uncompressed, same peak RSS).",
        "h11 is 3x slower than httptools",
    ],
)
def test_the_pattern_finds_measurements(text: str) -> None:
    assert FIGURE.search(text), text


@pytest.mark.parametrize(
    "text",
    [
        "# One wait for both: the deadline, and the caller's cancel (checked every 0.1 s).",
        "0 below the soft limit, then rising linearly to 5 s at the hard limit.",
        "# a request must stay under CDCLAKE_MAX_DEBEZIUM_BODY_BYTES (32 MiB),",
        "So events/s are capped at about 10 x batch.max-size",
        "msgspec decodes nesting by recursion: past the interpreter's limit (~1,000 levels, far",
        "`FRESHNESS MISSED orders: acked data has waited 912 s to become visible (...), objective 900 s`.",
        "Modules: :mod:`~cdclake.client.producer` (the :class:`Producer`)",
    ],
)
def test_the_pattern_passes_design_constants(text: str) -> None:
    assert not FIGURE.search(text), text


def test_no_measurements_in_comments_or_docstrings() -> None:
    found = [hit for path in sources() for hit in figures(path)]
    assert not found, (
        "measurements in code: put the figure in docs/benchmarks.md with its command and date (or drop it) "
        "and keep the reason here, pointing there:\n" + "\n".join(found)
    )


def test_benchmark_pointers_name_a_section() -> None:
    headings = [
        line.lstrip("#").strip() for line in BENCHMARKS.read_text(encoding="utf-8").splitlines() if line.startswith("#")
    ]
    dangling = []
    for path in sources():
        joined = " ".join(" ".join(text.lstrip("#").split()) for _, text in sorted(texts(path)))
        for title in BENCHMARK_REF.findall(joined):
            if not any(h.startswith(title) for h in headings):
                dangling.append(f"{path.relative_to(ROOT)}: {title!r}")
    assert not dangling, "docs/benchmarks.md has no section so named:\n" + "\n".join(dangling)
