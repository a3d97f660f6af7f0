"""Iceberg format versions: a new CDC table is v3 (its side tables v2) and keeps merge-on-read
deletes as deletion vectors, applying to the reference model's rows; a table made as v2
(``format_version = 2``) whose option turns to 3 is upgraded by its next apply, keeps its version
when the option is unset, and is never downgraded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cdclake.dev.reference import diff, expected_tables
from cdclake.dev.workload import generate
from cdclake.lake.catalog import load_table
from cdclake.lake.spark import table_ident
from spark_jobs.maintain import compact
from tests.support import apply_all, fresh_settings, stage, table_rows

pytestmark = pytest.mark.spark


def config(path: Path, version: int | None) -> Path:
    line = f"format_version = {version}\n" if version else ""
    path.write_text(f'[defaults]\nmerge_mode = "merge-on-read"\n{line}')
    return path


def delete_formats(settings: Any) -> list[str]:
    t = load_table(settings, "orders")
    assert t is not None
    return sorted({str(f["file_format"]) for f in t.inspect.files().to_pylist() if f["content"] != 0})


def test_a_new_table_is_v3_and_applies_to_the_reference_rows(spark: Any, spark_home: Path, tmp_path: Path) -> None:
    settings = fresh_settings(spark_home, table_config=config(tmp_path / "tables.toml", None))
    w = generate(events=400, seed=23, tables=("orders",), batch_size=100, duplicate_every=0, keys_per_table=150)
    for b in w.batches:
        stage(settings, [b])
        apply_all(spark, settings)
    t = load_table(settings, "orders")
    assert t is not None and t.metadata.format_version == 3
    side = load_table(settings, "orders__changes")
    assert side is not None and side.metadata.format_version == 2  # append-only: stays v2
    assert delete_formats(settings) == ["PUFFIN"]  # deletion vectors, no position-delete files
    got = table_rows(spark, table_ident(settings, "orders"))
    assert not diff(expected_tables(w.batches)["orders"], got)
    assert {r["_cdc_row_id"] for r in t.scan().to_arrow().to_pylist()} == set(got)  # pyiceberg reads the vectors
    compact(spark, settings, "orders", min_input_files=2)  # maintenance folds the vectors back
    spark.catalog.refreshTable(table_ident(settings, "orders"))
    assert delete_formats(settings) == []
    assert table_rows(spark, table_ident(settings, "orders")) == got


def test_v2_table_upgraded_by_the_option_never_downgraded(spark: Any, spark_home: Path, tmp_path: Path) -> None:
    cfg = config(tmp_path / "tables.toml", 2)  # a new table made as v2 (as every table before v3 was the default)
    settings = fresh_settings(spark_home, table_config=cfg)
    w = generate(events=600, seed=29, tables=("orders",), batch_size=100, duplicate_every=0, keys_per_table=200)
    third = len(w.batches) // 3
    ident = table_ident(settings, "orders")

    def apply(batches: list[dict[str, Any]]) -> int:
        for b in batches:
            stage(settings, [b])
            apply_all(spark, settings)
        t = load_table(settings, "orders")
        assert t is not None
        return t.metadata.format_version

    assert apply(w.batches[:third]) == 2
    assert delete_formats(settings) == ["PARQUET"]  # v2 position deletes
    config(cfg, 3)
    assert apply(w.batches[third : 2 * third]) == 3
    assert "PUFFIN" in delete_formats(settings)  # new deletes are deletion vectors
    assert not diff(expected_tables(w.batches[: 2 * third])["orders"], table_rows(spark, ident))
    config(cfg, None)
    assert apply(w.batches[2 * third : 2 * third + 1]) == 3  # unset: an existing table keeps its version
    config(cfg, 2)
    assert apply(w.batches[2 * third + 1 :]) == 3  # left as it is, the apply goes on
    assert not diff(expected_tables(w.batches)["orders"], table_rows(spark, ident))
