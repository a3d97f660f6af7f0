"""Per-table options (partition spec, merge mode) from a TOML file named by CDCLAKE_TABLE_CONFIG.

    [defaults]
    merge_mode = "merge-on-read"            # the default; or "copy-on-write"

    [tables.orders]
    partition_by = ["days(created_at)", "bucket(16, _cdc_row_id)"]
    merge_mode = "merge-on-read"

Transforms are Iceberg's Spark DDL ones: ``col`` (identity), ``years|months|days|hours(col)``
(``day(col)`` and ``hour(col)`` also accepted), ``bucket(N, col)``, ``truncate(N, col)``;
several make a composite spec. Errors name the file and the key.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cdclake.settings import Settings, SettingsError

MERGE_MODES = ("copy-on-write", "merge-on-read")
# Measured (tests/bench_apply.py, 1M events over 300k random keys into a 1M-row table): random keys
# touch every data file, so copy-on-write rewrites the whole table on every apply, while
# merge-on-read writes the changed rows plus position deletes. Compaction folds the deletes back.
DEFAULT_MERGE_MODE = "merge-on-read"
_COL = r"`?[A-Za-z_][A-Za-z0-9_]*`?"
_TRANSFORM = re.compile(
    rf"^(?:(?P<identity>{_COL})|(?P<time>years|months|days|hours|day|hour)\((?P<tcol>{_COL})\)"
    rf"|(?P<nfun>bucket|truncate)\((?P<n>[1-9][0-9]*),\s*(?P<ncol>{_COL})\))$"
)


@dataclass(frozen=True)
class TableOptions:
    partition_by: tuple[str, ...] = ()
    merge_mode: str = DEFAULT_MERGE_MODE

    @property
    def properties(self) -> dict[str, str]:
        return {f"write.{op}.mode": self.merge_mode for op in ("merge", "update", "delete")}


@dataclass(frozen=True)
class TableConfig:
    defaults: TableOptions = TableOptions()
    tables: dict[str, TableOptions] = field(default_factory=dict)

    def for_table(self, table: str) -> TableOptions:
        return self.tables.get(table.lower(), self.defaults)


def normalise_transform(text: str, where: str) -> str:
    """Canonical Spark DDL for one partition transform; SettingsError naming ``where``."""
    m = _TRANSFORM.match(text.strip())
    if not m:
        raise SettingsError(
            f"{where}: {text!r} is not a partition transform "
            "(col, years|months|days|hours(col), bucket(N, col), truncate(N, col))"
        )
    if m["identity"]:
        return m["identity"]
    if m["time"]:
        fn = {"day": "days", "hour": "hours"}.get(m["time"], m["time"])
        return f"{fn}({m['tcol']})"
    return f"{m['nfun']}({m['n']}, {m['ncol']})"


def transform_column(transform: str) -> str:
    """The source column a canonical transform reads."""
    inner = transform.split("(", 1)[1].rstrip(")") if "(" in transform else transform
    return inner.split(",")[-1].strip().strip("`")


def _options(raw: Any, where: str, base: TableOptions) -> TableOptions:
    if not isinstance(raw, dict):
        raise SettingsError(f"{where} must be a table of options")
    unknown = set(raw) - {"partition_by", "merge_mode"}
    if unknown:
        raise SettingsError(f"{where}: unknown option(s) {', '.join(sorted(unknown))}")
    mode = raw.get("merge_mode", base.merge_mode)
    if mode not in MERGE_MODES:
        raise SettingsError(f"{where}.merge_mode must be one of {', '.join(MERGE_MODES)}, got {mode!r}")
    parts = raw.get("partition_by", list(base.partition_by))
    if not isinstance(parts, list):
        raise SettingsError(f"{where}.partition_by must be a list of transforms")
    return TableOptions(tuple(normalise_transform(str(p), f"{where}.partition_by") for p in parts), mode)


def load_table_config(settings: Settings) -> TableConfig:
    path = settings.table_config
    if path is None:
        return TableConfig()
    where = f"CDCLAKE_TABLE_CONFIG={path}"
    try:
        data = tomllib.loads(Path(path).read_text())
    except FileNotFoundError:
        raise SettingsError(f"{where}: no such file") from None
    except tomllib.TOMLDecodeError as exc:
        raise SettingsError(f"{where}: {exc}") from None
    defaults = _options(data.get("defaults", {}), f"{where} [defaults]", TableOptions())
    tables = {
        name.lower(): _options(opts, f"{where} [tables.{name}]", defaults)
        for name, opts in (data.get("tables") or {}).items()
    }
    return TableConfig(defaults, tables)
