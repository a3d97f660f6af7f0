"""The docs site builds strictly (mkdocs.yml: every warning fails, a broken link or anchor, or a
page left out of the nav, included), offline, the way `make docs` builds it; and the README stays a front page."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.server  # a subprocess: mkdocs runs in its own interpreter, as `make docs` runs it
def test_the_docs_site_builds_strictly(tmp_path: Path) -> None:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    for page in ("index.html", "protocol/index.html", "settings/index.html", "architecture/index.html"):
        assert (tmp_path / "site" / page).is_file(), page
    # ARCHITECTURE.md is included, not copied: its module map is on the architecture page.
    assert "Module map" in (tmp_path / "site" / "architecture" / "index.html").read_text()


def test_the_readme_is_a_front_page() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200
