"""Per-table options (partition spec, merge mode, row key) from a TOML file named by
CDCLAKE_TABLE_CONFIG.

    [defaults]
    merge_mode = "merge-on-read"            # the default; or "copy-on-write"
    key = ["id"]                            # the default

    [tables.orders]
    partition_by = ["days(created_at)", "bucket(16, _cdc_row_id)"]
    merge_mode = "merge-on-read"

    [tables.order_lines]
    key = ["order_id", "line_no"]           # a composite primary key

    [tables.accounts]                       # Debezium without schemas: the source's types
    types = { balance = "decimal(38,10)", opened = "date", seen = "timestamp_ntz" }

    [tables.events]
    format_version = 3                      # upgrade an existing v2 table (new tables are v3)
    freshness_objective_s = 300             # cdc_freshness alerts past it (default CDCLAKE_FRESHNESS_OBJECTIVE_S)

    [tables.orders.expectations]            # checked before each publish: cdclake.config.expectations
    key_unique = true

``key`` names the primary-key columns of a table whose changes come from Debezium (whose HTTP
sink posts the row images but never the record key): the receiver reads them from each event's
row image to make the row's ``rowId`` (:mod:`cdclake.debezium.envelope`). Producers of the project's own
batches give ``rowId`` themselves.

``types`` declares column types (:mod:`cdclake.contracts.coltypes`) for a table whose Debezium events come
without the Connect schema (``value.converter.schemas.enable=false``); an event with a schema
is typed by it instead. Set per table only. The source modes it needs and the type of each
source column are in :mod:`cdclake.debezium.connect_types`; ``cdclake debezium --discover`` writes it.

Transforms are Iceberg's Spark DDL ones: ``col`` (identity), ``years|months|days|hours(col)``
(``day(col)`` and ``hour(col)`` also accepted), ``bucket(N, col)``, ``truncate(N, col)``;
several make a composite spec. Errors name the file and the key.

``format_version`` (2 or 3; unset: 3 for a table created now,
:data:`spark_jobs.table.CDC_TABLE_PROPERTIES`, and an existing table's own) is the Iceberg format
of the table. A v3 table keeps its merge-on-read deletes as deletion vectors;
setting 3 for an existing v2 table upgrades it at its next apply (new deletes are deletion
vectors, which take in the old position deletes of the data files they cover). A table is never
downgraded: 2 for a v3 table is left as it is. Measured against v2 by ``tests/bench/deletes.py``
(docs/benchmarks.md, "Deletion vectors").
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cdclake.config.expectations import Expectations, parse_expectations
from cdclake.config.settings import Settings, SettingsError
from cdclake.contracts import coltypes

MERGE_MODES = ("copy-on-write", "merge-on-read")
# Measured by tests/bench/apply.py (docs/benchmarks.md, "Copy-on-write vs merge-on-read"): random keys
# touch every data file, so copy-on-write rewrites the whole table on every apply, while
# merge-on-read writes the changed rows plus position deletes. Compaction folds the deletes back.
DEFAULT_MERGE_MODE = "merge-on-read"
_COL = r"`?[A-Za-z_][A-Za-z0-9_]*`?"
_TRANSFORM = re.compile(
    rf"^(?:(?P<identity>{_COL})|(?P<time>years|months|days|hours|day|hour)\((?P<tcol>{_COL})\)"
    rf"|(?P<nfun>bucket|truncate)\((?P<n>[1-9][0-9]*),\s*(?P<ncol>{_COL})\))$"
)


DEFAULT_KEY = ("id",)
MAX_KEY_COLUMNS = 16
FORMAT_VERSIONS = (2, 3)


@dataclass(frozen=True)
class TableOptions:
    partition_by: tuple[str, ...] = ()
    merge_mode: str = DEFAULT_MERGE_MODE
    key: tuple[str, ...] = DEFAULT_KEY
    types: dict[str, str] = field(default_factory=dict)
    """Declared column types for events without a schema (canonical :mod:`cdclake.contracts.coltypes`)."""
    format_version: int | None = None
    """The Iceberg format version asked for; None: 3 for a new table, an existing one's own."""
    freshness_objective_s: int | None = None
    """Longest acked data may wait unapplied (:mod:`cdclake.lake.freshness`); None: the setting."""
    expectations: Expectations = field(default_factory=Expectations)
    """Checked on the staged snapshots before a publish (:mod:`cdclake.config.expectations`)."""

    @property
    def properties(self) -> dict[str, str]:
        modes = {f"write.{op}.mode": self.merge_mode for op in ("merge", "update", "delete")}
        return modes | ({"format-version": str(self.format_version)} if self.format_version else {})


@dataclass(frozen=True)
class TableConfig:
    defaults: TableOptions = TableOptions()
    tables: dict[str, TableOptions] = field(default_factory=dict)

    def for_table(self, table: str) -> TableOptions:
        return self.tables.get(table.lower(), self.defaults)

    def freshness_objective_s(self, table: str, settings: Settings) -> int:
        """The table's objective, else ``[defaults]``'s, else CDCLAKE_FRESHNESS_OBJECTIVE_S."""
        return self.for_table(table).freshness_objective_s or settings.freshness_objective_s

    def key_columns(self) -> dict[str, tuple[str, ...]]:
        """Row-key columns by lower-case table name, ``"*"`` for every other table (the form
        :func:`cdclake.debezium.envelope.to_batch` takes)."""
        return {"*": self.defaults.key} | {name: opts.key for name, opts in self.tables.items()}

    def column_types(self) -> dict[str, dict[str, str]]:
        """Configured column types by lower-case table name (tables with none left out)."""
        return {name: dict(opts.types) for name, opts in self.tables.items() if opts.types}


_NO_BASE = TableOptions()  # the base of [defaults] itself


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


def _types(raw: Any, where: str) -> dict[str, str]:
    if not isinstance(raw, dict) or not all(isinstance(c, str) and c for c in raw):
        raise SettingsError(f'{where}.types must be a table of column = "type", e.g. {{ balance = "decimal(38,10)" }}')
    out: dict[str, str] = {}
    for column, kind in raw.items():
        try:
            out[column] = coltypes.canonical(kind if isinstance(kind, str) else repr(kind))
        except ValueError as exc:
            raise SettingsError(f"{where}.types.{column}: {exc}") from None
    return out


def _options(raw: Any, where: str, base: TableOptions) -> TableOptions:
    if not isinstance(raw, dict):
        raise SettingsError(f"{where} must be a table of options")
    if base is _NO_BASE and "types" in raw:
        raise SettingsError(f"{where}: types are set per table, in [tables.<name>]")
    unknown = set(raw) - {
        "partition_by",
        "merge_mode",
        "key",
        "types",
        "format_version",
        "freshness_objective_s",
        "expectations",
    }
    if unknown:
        raise SettingsError(f"{where}: unknown option(s) {', '.join(sorted(unknown))}")
    mode = raw.get("merge_mode", base.merge_mode)
    if mode not in MERGE_MODES:
        raise SettingsError(f"{where}.merge_mode must be one of {', '.join(MERGE_MODES)}, got {mode!r}")
    parts = raw.get("partition_by", list(base.partition_by))
    if not isinstance(parts, list):
        raise SettingsError(f"{where}.partition_by must be a list of transforms")
    key = raw.get("key", list(base.key))
    if (
        not isinstance(key, list)
        or not 1 <= len(key) <= MAX_KEY_COLUMNS
        or not all(isinstance(c, str) and c for c in key)
        or len(set(key)) < len(key)
    ):
        raise SettingsError(f"{where}.key must be a list of 1..{MAX_KEY_COLUMNS} distinct column names, got {key!r}")
    version = raw.get("format_version", base.format_version)
    if version is not None and (type(version) is not int or version not in FORMAT_VERSIONS):
        raise SettingsError(
            f"{where}.format_version must be one of {', '.join(map(str, FORMAT_VERSIONS))}, got {version!r}"
        )
    objective = raw.get("freshness_objective_s", base.freshness_objective_s)
    if objective is not None and (type(objective) is not int or objective < 1):
        raise SettingsError(f"{where}.freshness_objective_s must be a whole number of seconds >= 1, got {objective!r}")
    partition_by = tuple(normalise_transform(str(p), f"{where}.partition_by") for p in parts)
    types = _types(raw.get("types", {}), where)
    expect = (
        parse_expectations(raw["expectations"], f"{where}.expectations") if "expectations" in raw else base.expectations
    )
    return TableOptions(partition_by, mode, tuple(key), types, version, objective, expect)


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
    defaults = _options(data.get("defaults", {}), f"{where} [defaults]", _NO_BASE)
    tables = {
        name.lower(): _options(opts, f"{where} [tables.{name}]", defaults)
        for name, opts in (data.get("tables") or {}).items()
    }
    return TableConfig(defaults, tables)
