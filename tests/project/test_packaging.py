"""Packaging: the producer SDK installs without the pipeline, and every import is declared.

``pip install "cdclake[client]"`` must give a producer ``cdclake.client`` without Airflow, Spark or
Iceberg: scripts/setup.sh builds ``.venv-client`` from the client extra alone (scripts/client-venv.sh,
versions of requirements.lock); when it is missing or older than the lock and pyproject.toml, the
test builds one ``--offline`` from the uv cache into a temporary directory (about 4 s), so nothing
is downloaded at test time.
"""

from __future__ import annotations

import ast
import importlib.metadata as md
import json
import re
import subprocess
import sys
import tomllib
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
UV = ROOT / ".venv" / "bin" / "uv"
PACKAGES = ("cdclake", "receiver", "restcatalog", "spark_jobs", "dags", "plugins")
LOCAL = {*PACKAGES, "tests"}
# What a producer must not get: the pipeline's heavy dependencies.
PIPELINE_ONLY = {
    "apache-airflow",
    "apache-airflow-core",
    "apache-airflow-task-sdk",
    "pyspark",
    "pyspark-client",
    "pyiceberg",
    "pyarrow",
    "boto3",
    "sqlalchemy",
    "starlette",
    "uvicorn",
    "psycopg2-binary",
}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _req_name(req: str) -> str:
    m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", req)
    assert m, req
    return _norm(m.group(1))


@cache
def _project() -> dict[str, list[str]]:
    """Requirement names by group: "core" and each extra (self-references like cdclake[a,b] expanded)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras: dict[str, list[str]] = project["optional-dependencies"]
    groups = {"core": [_req_name(r) for r in project["dependencies"]]}

    def names(extra: str) -> list[str]:
        out = []
        for req in extras[extra]:
            m = re.fullmatch(r"cdclake\[([\w,\s-]+)\]", req.strip())
            out += [n for e in m.group(1).split(",") for n in names(e.strip())] if m else [_req_name(req)]
        return out

    groups.update({extra: names(extra) for extra in extras})
    return groups


def _client_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    lock_sum = subprocess.run(
        "sha256sum requirements.lock pyproject.toml | sha256sum | cut -c1-16",
        shell=True,
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    venv = ROOT / ".venv-client"
    if (venv / f".cdclake-client-{lock_sum}").is_file():
        return venv
    venv = tmp_path_factory.mktemp("client") / "venv"
    r = subprocess.run(
        ["bash", str(ROOT / "scripts" / "client-venv.sh"), str(venv), "--offline"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, f"building the client venv offline failed (run `make setup`):\n{r.stderr}"
    return venv


@pytest.fixture(scope="module")
def client_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _client_venv(tmp_path_factory)


@pytest.mark.server  # builds or runs the client venv: subprocesses
def test_client_extra_alone_imports_the_sdk_without_the_pipeline(client_venv: Path, tmp_path: Path) -> None:
    python = str(client_venv / "bin" / "python")
    listed = subprocess.run(
        [str(UV), "pip", "list", "--format", "json", "--python", python], capture_output=True, text=True, check=True
    ).stdout
    installed = {_norm(p["name"]) for p in json.loads(listed)}
    assert "cdclake" in installed
    assert not installed & PIPELINE_ONLY, sorted(installed & PIPELINE_ONLY)
    assert not any(n.startswith(("apache-airflow", "pyspark")) for n in installed), sorted(installed)
    # The SDK and its optional paths (WebSocket transport, zstd bodies) import; nothing heavy comes along,
    # and it is this checkout's code (the project is installed editable).
    probe = (
        "import sys, cdclake.client, websockets.sync.client, zstandard\n"
        "heavy = sorted({m.split('.')[0] for m in sys.modules} & {'airflow', 'pyspark', 'pyiceberg', 'pyarrow',"
        " 'boto3', 'sqlalchemy', 'starlette', 'uvicorn'})\n"
        "assert not heavy, heavy\n"
        "print(cdclake.client.__file__)\n"
    )
    r = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert Path(r.stdout.strip()) == ROOT / "cdclake" / "client" / "__init__.py"
    # The `cdclake` command is there too; what needs the pipeline says which extra to install.
    cli = subprocess.run(
        [python, "-m", "cdclake", "tables"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "CDCLAKE_HOME": str(tmp_path)},
    )
    assert cli.returncode == 1 and 'pip install "cdclake[pipeline]"' in cli.stderr, cli.stderr


def _imports(paths: list[Path]) -> dict[str, set[str]]:
    """Top-level third-party modules imported anywhere in ``paths`` (lazy imports included) -> files."""
    found: dict[str, set[str]] = {}
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                mods = [node.module]
            else:
                continue
            for mod in mods:
                top = mod.split(".")[0]
                if top not in sys.stdlib_module_names and top not in LOCAL and top != "__future__":
                    found.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    return found


@cache
def _installed_modules() -> dict[str, list[str]]:
    return dict(md.packages_distributions())


def _providers(module: str) -> set[str]:
    """Distributions that may declare ``module``: those installing it, and meta-packages requiring one."""
    dists = {_norm(d) for d in _installed_modules().get(module, [])}
    assert dists, f"no installed distribution provides {module!r}"
    for meta in ("apache-airflow",):  # installs no module of its own: it stands for its parts
        if any(_req_name(r) in dists for r in md.requires(meta) or []):
            dists.add(meta)
    return dists


def _undeclared(paths: list[Path], declared: set[str]) -> dict[str, list[str]]:
    return {m: sorted(files) for m, files in _imports(paths).items() if not _providers(m) & declared}


def test_every_imported_package_is_declared() -> None:
    groups = _project()
    client = set(groups["core"]) | set(groups["client"])
    runtime = client | set(groups["pipeline"])
    # The lake client's query_arrow imports pyarrow when called: the `arrow` extra, optional.
    lake = ROOT / "cdclake" / "client" / "lake.py"
    sdk = sorted(p for p in (ROOT / "cdclake" / "client").glob("*.py") if p != lake)
    assert not _undeclared(sdk, client), "the SDK imports beyond the client extra"
    assert not _undeclared([lake], client | set(groups["arrow"])), "the lake client imports beyond client + arrow"
    code = [p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")]
    assert not _undeclared(code, runtime), "imported by the project, declared in no runtime group"
    every = {n for names in groups.values() for n in names}
    assert not _undeclared(sorted((ROOT / "tests").rglob("*.py")), every), "imported by the tests, undeclared"


def test_every_declared_package_is_locked() -> None:
    lock = (ROOT / "requirements.lock").read_text()
    locked = {_norm(m.group(1)) for m in re.finditer(r"^([A-Za-z0-9][\w.-]*)==", lock, re.M)}
    declared = {n for names in _project().values() for n in names} - {"cdclake"}
    assert not declared - locked, f"declared in pyproject.toml, not in requirements.lock: {sorted(declared - locked)}"
    assert set(_project()["client"]) == set(_project()["core"]), "the client extra is the core, by name"


@pytest.mark.server  # git ls-files
def test_lint_and_mypy_cover_every_python_directory() -> None:
    """`make lint`: ruff checks, mypy types, every top-level directory that holds Python code."""
    tracked = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True)
    with_code = {Path(f).parts[0] for f in tracked.stdout.split() if len(Path(f).parts) > 1}
    assert with_code >= {"cdclake", "receiver", "restcatalog", "spark_jobs", "dags", "tests"}
    ruff = re.search(r"ruff check ([^\n]+)", (ROOT / "Makefile").read_text())
    assert ruff
    assert with_code <= set(ruff.group(1).split()), with_code - set(ruff.group(1).split())
    mypy_files = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]["files"])
    assert with_code <= mypy_files, with_code - mypy_files
