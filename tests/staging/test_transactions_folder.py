"""Issue 31, part 1: the ``.transactions`` folder in both stores: listed as its own folder,
never as a table, and kept by the clean-up (with the receipts that name its objects) after the
tables' objects of the same batches are applied and deleted."""

from __future__ import annotations

import time
from pathlib import Path

import msgspec
import pytest

from cdclake import staging
from cdclake.contracts.watermark import Watermark
from cdclake.lake import catalog
from cdclake.lake.cleanup import clean_staging
from cdclake.staging import Receipt
from tests.support.receiver import env_settings
from tests.support.s3server import SeaweedS3

TX = staging.TRANSACTIONS


def land(store: staging.Store, seq: int, now: int, tables: list[str]) -> list[staging.ObjectKey]:
    """Batch ``seq`` of ``app`` as the receiver lands it: receipt, table objects, markers."""
    keys = [staging.make_key(t, "app", seq, now) for t in [*tables, TX]]
    r = Receipt("app", seq, 0, now, "d" * 64, len(tables), [k.path for k in keys], "host:1:1")
    assert store.put_if_absent(staging.receipt_path("app", seq), msgspec.json.encode(r))
    for k in keys:
        store.put(k, b'{"source":"app","batchSequence":1,"id":"t","status":"END"}\n')
    return keys


def check_store(store: staging.Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    now = int(time.time() * 1000)
    first = land(store, 1, now, ["orders"])
    second = land(store, 2, now + 1, [])  # a batch of markers only
    assert store.tables() == ["orders"]
    assert [k.path for k in store.list(TX)] == [first[1].path, second[0].path]
    assert store.exists(first[1].path)

    # Everything of every table applied: the clean-up deletes the tables' objects only.
    monkeypatch.setattr(catalog, "table_watermark", lambda settings, table: Watermark("9999"))
    result = clean_staging(env_settings(tmp_path), now + 24 * 3600_000, store=store, now_ms=now)
    assert result["objects_deleted"] == 1 and result["objects_not_yet_applied"] == 0
    assert list(store.list("orders")) == []
    assert [k.path for k in store.list(TX)] == [first[1].path, second[0].path]
    names = store.list_names(staging.receipt_prefix("app"))
    assert names == [staging.receipt_path("app", s).rsplit("/", 1)[1] for s in (1, 2)]  # both kept


def test_local_store_lists_and_keeps_the_transactions_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    check_store(staging.LocalStaging(tmp_path / "staging"), tmp_path, monkeypatch)


@pytest.mark.server
def test_s3_store_lists_and_keeps_the_transactions_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, s3server: SeaweedS3
) -> None:
    check_store(s3server.store(), tmp_path, monkeypatch)
