"""Each setting is declared once, on its field (cdclake.config.settings): what repeats it elsewhere
is generated from the field, or checked against it here."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from cdclake.config.fields import spec, variable
from cdclake.config.settings import GROUPS, Settings, load
from cdclake.dev import settingsdoc

ROOT = Path(__file__).resolve().parents[2]
FIELDS = {variable(f): f for f in dataclasses.fields(Settings)}


@pytest.mark.parametrize("rel", sorted(settingsdoc.generated()))
def test_generated_files_are_current(rel: str) -> None:
    """docs/settings.md and .env.example are what `make settings-doc` writes from the fields."""
    assert (ROOT / rel).read_text() == settingsdoc.generated()[rel], f"{rel} is stale: run `make settings-doc`"


def test_load_without_variables_gives_each_fields_default(tmp_path: Path) -> None:
    """``load({})`` and ``Settings(...)`` agree: no default is written a second time (the
    dataclass once said "" for CDCLAKE_SPARK_CONNECT_URL while load() said sc://127.0.0.1:15002)."""
    loaded = load({"CDCLAKE_HOME": str(tmp_path)})
    for name, f in FIELDS.items():
        if f.default is not dataclasses.MISSING:
            assert getattr(loaded, f.name) == f.default, name
    assert loaded.staging_dir == tmp_path.resolve() / "staging"
    assert loaded.warehouse == (tmp_path.resolve() / "warehouse").as_uri()
    assert loaded.airflow_db_url == f"sqlite:///{tmp_path.resolve()}/airflow/airflow.db"


def test_every_field_has_one_line_of_doc_and_a_section() -> None:
    for name, f in FIELDS.items():
        s = spec(f)
        assert s.doc and "\n" not in s.doc and s.doc.endswith("."), name
        assert s.group in GROUPS, name
        assert (f.default is dataclasses.MISSING) == bool(s.derived), f"{name}: a default, or a derived one"


def _readme_rows() -> list[tuple[str, str, str]]:
    """``(file:line, names cell, default cell)`` of every row of the docs' tables headed
    ``| variable | default | meaning |`` (docs/configuration.md, docs/querying.md; README.md too)."""
    rows, in_table = [], False
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if line.startswith("| variable | default |"):
                in_table = True
            elif not line.startswith("|"):
                in_table = False
            elif in_table and not line.startswith("|---"):
                cells = [c.strip() for c in line.strip("|").split(" | ")]
                rows.append((f"{path.relative_to(ROOT)}:{n}", cells[0], cells[1]))
    return rows


def _variables(cell: str) -> list[str]:
    """``CDCLAKE_REST_HOST` / `_PORT`` names CDCLAKE_REST_HOST and CDCLAKE_REST_PORT: a suffix
    replaces the fewest trailing words of the first name that make a setting."""
    first, *rest = re.findall(r"`([A-Z0-9_]+)`", cell)
    names, words = [first], first.split("_")
    for suffix in rest:
        found = [n for k in range(len(words)) if (n := "_".join(words[: len(words) - k]) + suffix) in FIELDS]
        assert found, f"{suffix} of {first} names no setting"
        names.append(found[0])
    return names


def test_readme_settings_tables_agree_with_the_fields() -> None:
    """The docs' settings tables (docs/configuration.md's) are read by people before docs/settings.md: every row names a
    setting and shows its default (a backquoted value), or says it is empty or unset."""
    rows = _readme_rows()
    assert len(rows) > 60
    for line, names_cell, default_cell in rows:
        names = _variables(names_cell)
        parts = default_cell.split(" / ")
        parts = parts if len(parts) == len(names) else parts[:1] * len(names)
        for name, part in zip(names, parts, strict=True):
            expected = settingsdoc.shown(FIELDS[name])
            m = re.match(r"`([^`]*)`", part)
            said = m[1] if m else ""
            assert said == expected, f"{line}: {name} default {part!r}, the field says {expected!r}"
