from __future__ import annotations

from pathlib import Path

import pytest

from cdclake.config.settings import SettingsError, load
from cdclake.config.tables import TableOptions, load_table_config, normalise_transform, transform_column


def config(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "tables.toml"
    p.write_text(text)
    return p


def test_per_table_options_over_defaults(tmp_path: Path) -> None:
    p = config(
        tmp_path,
        """
        [defaults]
        merge_mode = "merge-on-read"
        [tables.Orders]
        partition_by = ["day(created_at)", "bucket(16, _cdc_row_id)", "region"]
        """,
    )
    cfg = load_table_config(load({"CDCLAKE_TABLE_CONFIG": str(p)}))
    assert cfg.for_table("orders") == TableOptions(
        ("days(created_at)", "bucket(16, _cdc_row_id)", "region"), "merge-on-read"
    )
    assert cfg.for_table("other") == TableOptions((), "merge-on-read")
    assert cfg.for_table("other").properties["write.update.mode"] == "merge-on-read"
    assert load_table_config(load({})).for_table("x") == TableOptions()


def test_format_version_is_opt_in(tmp_path: Path) -> None:
    p = config(tmp_path, "[defaults]\nformat_version = 3\n[tables.old]\nformat_version = 2\n")
    cfg = load_table_config(load({"CDCLAKE_TABLE_CONFIG": str(p)}))
    assert cfg.for_table("new").format_version == 3
    assert cfg.for_table("new").properties["format-version"] == "3"
    assert cfg.for_table("old").properties["format-version"] == "2"
    assert "format-version" not in TableOptions().properties  # unset: the project's default (v2)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ('[tables.t]\nmerge_mode = "fast"', "[tables.t].merge_mode must be one of"),
        ('[tables.t]\npartition_by = ["bucket(x, id)"]', "[tables.t].partition_by: 'bucket(x, id)' is not a partition"),
        ('[tables.t]\nsort = ["id"]', "unknown option(s) sort"),
        ("[tables.t]\nkey = []", "[tables.t].key must be a list of 1..16 distinct column names"),
        ('[tables.t]\nkey = "id"', "[tables.t].key must be a list"),
        ('[tables.t]\nkey = ["a", "a"]', "[tables.t].key must be a list of 1..16 distinct"),
        ('[defaults]\nkey = ["", "id"]', "[defaults].key must be a list"),
        ("[tables.t", "CDCLAKE_TABLE_CONFIG="),
        ('[tables.t]\ntypes = { a = "money" }', "[tables.t].types.a: 'money' is not a column type"),
        ('[tables.t]\ntypes = { a = "decimal(39,2)" }', "[tables.t].types.a: 'decimal(39,2)': decimal precision"),
        ('[tables.t]\ntypes = ["int"]', '[tables.t].types must be a table of column = "type"'),
        ('[defaults]\ntypes = { a = "int" }', "[defaults]: types are set per table"),
        ("[tables.t]\nformat_version = 4", "[tables.t].format_version must be one of 2, 3"),
        ('[tables.t]\nformat_version = "3"', "[tables.t].format_version must be one of 2, 3"),
        ("[tables.t]\nformat_version = 3.0", "[tables.t].format_version must be one of 2, 3"),
        ("[tables.t]\nformat_version = true", "[tables.t].format_version must be one of 2, 3"),
    ],
)
def test_config_errors_name_the_file_and_key(tmp_path: Path, text: str, words: str) -> None:
    p = config(tmp_path, text)
    with pytest.raises(SettingsError) as err:
        load_table_config(load({"CDCLAKE_TABLE_CONFIG": str(p)}))
    assert words in str(err.value) and str(p) in str(err.value)


def test_transforms() -> None:
    assert normalise_transform("hour(ts)", "x") == "hours(ts)"
    assert normalise_transform("truncate(4,  name)", "x") == "truncate(4, name)"
    assert transform_column("bucket(16, _cdc_row_id)") == "_cdc_row_id"
    assert transform_column("days(created_at)") == "created_at"
    assert transform_column("region") == "region"


def test_row_keys_per_table_over_the_default(tmp_path: Path) -> None:
    p = config(
        tmp_path,
        """
        [defaults]
        key = ["uuid"]
        [tables.Order_Lines]
        key = ["order_id", "line_no"]
        [tables.orders]
        merge_mode = "copy-on-write"
        """,
    )
    cfg = load_table_config(load({"CDCLAKE_TABLE_CONFIG": str(p)}))
    assert cfg.for_table("order_lines").key == ("order_id", "line_no")
    assert cfg.for_table("orders").key == ("uuid",)  # a table's options start from [defaults]
    assert cfg.key_columns() == {"*": ("uuid",), "order_lines": ("order_id", "line_no"), "orders": ("uuid",)}
    assert load_table_config(load({})).key_columns() == {"*": ("id",)}


def test_column_types_per_table_in_their_one_spelling(tmp_path: Path) -> None:
    p = config(
        tmp_path,
        """
        [defaults]
        key = ["uuid"]
        [tables.Accounts]
        types = { balance = "DECIMAL(38, 10)", seen = "timestamp_ntz", tags = "array<string>" }
        [tables.orders]
        merge_mode = "copy-on-write"
        """,
    )
    cfg = load_table_config(load({"CDCLAKE_TABLE_CONFIG": str(p)}))
    want = {"balance": "decimal(38,10)", "seen": "timestamp_ntz", "tags": "array<string>"}
    assert cfg.column_types() == {"accounts": want}
    assert cfg.for_table("accounts").key == ("uuid",)
    assert cfg.for_table("orders").types == {}


def test_freshness_objective_per_table_over_defaults_over_the_setting(tmp_path: Path) -> None:
    p = config(tmp_path, "[defaults]\nfreshness_objective_s = 600\n[tables.orders]\nfreshness_objective_s = 60\n")
    settings = load({"CDCLAKE_TABLE_CONFIG": str(p), "CDCLAKE_FRESHNESS_OBJECTIVE_S": "1200"})
    cfg = load_table_config(settings)
    assert (cfg.freshness_objective_s("orders", settings), cfg.freshness_objective_s("other", settings)) == (60, 600)
    assert load_table_config(load({})).freshness_objective_s("x", load({})) == 900  # the setting's default
    bad = config(tmp_path, "[tables.orders]\nfreshness_objective_s = 0\n")
    with pytest.raises(SettingsError, match=r"\[tables.orders\].freshness_objective_s must be"):
        load_table_config(load({"CDCLAKE_TABLE_CONFIG": str(bad)}))
    with pytest.raises(SettingsError, match="CDCLAKE_FRESHNESS_OBJECTIVE_S must be >= 1"):
        load({"CDCLAKE_FRESHNESS_OBJECTIVE_S": "0"})
