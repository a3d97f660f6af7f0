"""Issue 13, finding 5 (bounded state on disk): the receipts of a producer idle past
CDCLAKE_RECEIPT_RETENTION_S go once none of their objects is left, folder and all; a producer
within the retention keeps its newest receipt, so a retry is still a duplicate."""

from __future__ import annotations

import time
from pathlib import Path

import msgspec
import pytest
from starlette.testclient import TestClient

from cdclake import staging
from cdclake.lake.cleanup import clean_staging
from cdclake.staging import Receipt
from receiver.app import create_app
from tests.support.receiver import batch, env_settings
from tests.support.s3server import SeaweedS3

DAY_MS = 24 * 3600 * 1000


def put_receipt(store: staging.Store, source: str, seq: int, landed_ms: int, keys: list[str]) -> None:
    r = Receipt(source, seq, 0, landed_ms, "d" * 64, 1, keys, "host:1:1")
    assert store.put_if_absent(staging.receipt_path(source, seq), msgspec.json.encode(r))


def receipts(store: staging.Store, source: str) -> list[int]:
    names = store.list_names(staging.receipt_prefix(source))
    return [p[0] for p in map(staging.parse_receipt_name, names) if p]


def test_receipts_of_producers_idle_past_the_retention_are_cleaned(tmp_path: Path) -> None:
    settings = env_settings(tmp_path)  # default retention: 7 days
    store = staging.LocalStaging(settings.staging_dir)
    now = int(time.time() * 1000)
    # Objects of these batches were applied and cleaned up already (they do not exist).
    for seq in (1, 2, 3):
        put_receipt(store, "gone", seq, now - 30 * DAY_MS, [f"t/gone-{seq}.ndjson"])
    for seq in (1, 2):
        put_receipt(store, "recent", seq, now - 3600_000, [f"t/recent-{seq}.ndjson"])
    # Idle as long, but its object is still waiting to be applied: the receipt stays.
    key = staging.make_key("waiting", "slow", 1, now - 30 * DAY_MS)
    store.put(key, b"{}\n")
    put_receipt(store, "slow", 1, now - 30 * DAY_MS, [key.path])

    result = clean_staging(settings, now - DAY_MS, store=store)

    assert receipts(store, "gone") == []
    assert not (settings.staging_dir / staging.receipt_prefix("gone")).exists()
    assert receipts(store, "recent") == [2]  # the newest, within the retention
    assert receipts(store, "slow") == [1]
    assert result["receipts_deleted"] == 4


def test_a_retry_within_the_retention_is_still_a_duplicate_after_clean_up(tmp_path: Path) -> None:
    settings = env_settings(tmp_path, rate_limit_per_s=0)
    b = batch("app", 1, ["orders"])
    with TestClient(create_app(settings)) as c:
        assert c.post("/v1/batches", json=b).json()["status"] == "persisted"
    clean_staging(settings, int(time.time() * 1000) + DAY_MS, store=staging.LocalStaging(settings.staging_dir))
    with TestClient(create_app(settings)) as c:
        again = c.post("/v1/batches", json=b).json()
        gap = c.post("/v1/batches", json=batch("app", 3, ["orders"]))
    assert again["status"] == "duplicate"
    assert gap.status_code == 409 and gap.json()["expectedSequence"] == 2


@pytest.mark.server
def test_receipts_are_cleaned_on_s3_too(tmp_path: Path, s3server: SeaweedS3) -> None:
    """Source folders are prefixes on S3, not objects: clean-up must still find them."""
    store = s3server.store()
    now = int(time.time() * 1000)
    for seq in (1, 2):
        put_receipt(store, "gone", seq, now - 30 * DAY_MS, [f"t/gone-{seq}.ndjson"])
        put_receipt(store, "recent", seq, now - 3600_000, [f"t/recent-{seq}.ndjson"])
    assert store.folders(staging.RECEIPTS + "/") == ["gone", "recent"]
    result = clean_staging(env_settings(tmp_path), now - DAY_MS, store=store)
    assert receipts(store, "gone") == [] and receipts(store, "recent") == [2]
    assert store.folders(staging.RECEIPTS + "/") == ["recent"]
    assert result["receipts_deleted"] == 3
