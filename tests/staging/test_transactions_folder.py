"""The ``.transactions`` folder in both stores: listed as its own folder, never as a table; the
clean-up keeps a markers object (and the receipt naming it) while an object of a transaction it
names is left, and deletes both once none is."""

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


def land(store: staging.Store, seq: int, now: int, tables: list[str], tx: str) -> list[staging.ObjectKey]:
    """Batch ``seq`` of ``app`` as the receiver lands it: receipt, table objects (one event of
    ``tx`` each), its END."""
    keys = [staging.make_key(t, "app", seq, now) for t in [*tables, TX]]
    counts: dict[str, dict[str, staging.receipts.TxEvents]] = {t: {tx: 1} for t in tables}
    r = Receipt("app", seq, 0, now, "d" * 64, len(tables), [k.path for k in keys], "host:1:1", transactions=counts)
    assert store.put_if_absent(staging.receipt_path("app", seq), msgspec.json.encode(r))
    for k in keys:
        store.put(k, b'{"source":"app","batchSequence":1,"id":"%s","status":"END"}\n' % tx.encode())
    return keys


def check_store(store: staging.Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    now = int(time.time() * 1000)
    first = land(store, 1, now, ["orders"], "t")
    second = land(store, 2, now + 1, [], "u")  # a batch of markers only
    third = land(store, 3, now + 2, ["lines"], "v")  # lines: not applied yet
    fourth = land(store, 4, now + 3, [], "v")  # more markers of v, elsewhere
    assert store.tables() == ["lines", "orders"]
    assert [k.path for k in store.list(TX)] == [first[1].path, second[0].path, third[1].path, fourth[0].path]

    # orders applied, lines not: orders' object goes, and so do the markers of t and u (nothing
    # of theirs left) with their receipts but the newest; v's markers stay while its line waits.
    monkeypatch.setattr(
        catalog, "table_watermark", lambda settings, table: Watermark("9999") if table == "orders" else None
    )
    result = clean_staging(env_settings(tmp_path), now + 24 * 3600_000, store=store, now_ms=now)
    assert result["objects_deleted"] == 1 and result["objects_not_yet_applied"] == 1
    assert result["markers_deleted"] == 2
    assert list(store.list("orders")) == []
    assert [k.path for k in store.list(TX)] == [third[1].path, fourth[0].path]
    names = store.list_names(staging.receipt_prefix("app"))
    assert names == [staging.receipt_path("app", s).rsplit("/", 1)[1] for s in (3, 4)]

    # Once lines is applied too, v's markers go (the newest receipt stays, for numbering).
    monkeypatch.setattr(catalog, "table_watermark", lambda settings, table: Watermark("9999"))
    clean_staging(env_settings(tmp_path), now + 24 * 3600_000, store=store, now_ms=now)
    assert list(store.list(TX)) == [] and list(store.list("lines")) == []
    assert store.list_names(staging.receipt_prefix("app")) == [staging.receipt_path("app", 4).rsplit("/", 1)[1]]


def test_local_store_lists_and_keeps_the_transactions_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    check_store(staging.LocalStaging(tmp_path / "staging"), tmp_path, monkeypatch)


@pytest.mark.server
def test_s3_store_lists_and_keeps_the_transactions_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, s3server: SeaweedS3
) -> None:
    check_store(s3server.store(), tmp_path, monkeypatch)
