"""S3Staging against a real S3 server (SeaweedFS, see tests/support/s3server.py), and against
LocalStaging where both must agree."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

import pytest
from botocore.exceptions import BotoCoreError, ClientError

from cdclake import staging
from cdclake.config.settings import SettingsError
from cdclake.staging import stores
from cdclake.staging.s3 import S3Staging, parse_url
from tests.support import make_settings
from tests.support.s3server import SeaweedS3

HOUR_MS = 3_600_000
T0 = 1_760_000_000_000  # 2025-10-09T08:53:20Z


@pytest.fixture
def store(s3server: SeaweedS3) -> S3Staging:
    return s3server.store()  # a fresh prefix: tests share the bucket


def keys_for(table: str, n: int, seed: int) -> list[staging.ObjectKey]:
    """Keys across several days and hours, sources and sequences, in random order."""
    rng = random.Random(seed)
    keys = {
        staging.make_key(
            table, rng.choice(["a", "b-1", "src.x"]), rng.randrange(10**6), T0 + rng.randrange(60 * HOUR_MS)
        )
        for _ in range(n)
    }
    out = sorted(keys)
    rng.shuffle(out)
    return out


def test_parse_url() -> None:
    assert parse_url("s3://bkt") == ("bkt", "")
    assert parse_url("s3://bkt/") == ("bkt", "")
    assert parse_url("s3://bkt/a/b/") == ("bkt", "a/b")
    with pytest.raises(SettingsError):
        parse_url("file:///x")


@pytest.mark.server
def test_put_get_roundtrip(store: S3Staging) -> None:
    key = staging.make_key("orders", "src", 7, T0)
    data = b'{"a":1}\n' * 1000
    store.put(key, data)
    assert store.get(key) == data
    assert store.read(key.path) == data
    assert store.exists(key.path)
    # put overwrites: the receiver re-lands identical content under the same name.
    store.put(key, b"x\n")
    assert store.get(key) == b"x\n"

    missing = staging.make_key("orders", "src", 8, T0)
    assert store.read(missing.path) is None
    assert not store.exists(missing.path)
    with pytest.raises(FileNotFoundError):
        store.get(missing)


@pytest.mark.server
def test_uri(store: S3Staging, s3server: SeaweedS3) -> None:
    key = staging.make_key("orders", "src", 7, T0)
    assert store.uri(key) == f"s3://{s3server.bucket}/{store.prefix}/orders/{key.name}"
    root = S3Staging("bkt", "", endpoint_url=s3server.endpoint)
    assert root.uri(key) == f"s3://bkt/orders/{key.name}"


@pytest.mark.server
def test_list_order_after_and_parity_with_local(store: S3Staging, tmp_path: Path) -> None:
    local = staging.LocalStaging(tmp_path)
    keys = keys_for("orders", 60, seed=1) + keys_for("customers", 10, seed=2)
    for k in keys:
        store.put(k, k.name.encode())
        local.put(k, k.name.encode())
    # Not staging objects: must never be listed, by either store.
    for stray in ("orders/README.txt", "orders/2025-10-09/08/partial.ndjson.tmp", "orders/x.ndjson"):
        store.put_if_absent(stray, b"")
        local.put_if_absent(stray, b"")

    listed = list(store.list("orders"))
    assert listed == sorted(k for k in keys if k.table == "orders")
    assert listed == list(local.list("orders"))
    for after in ["", listed[0].name, listed[17].name, listed[-1].name, staging.horizon(T0 + 30 * HOUR_MS)]:
        got = list(store.list("orders", after))
        assert got == [k for k in listed if k.name > after]
        assert got == list(local.list("orders", after)), after
    assert list(store.list("nope")) == []


@pytest.mark.server
def test_list_pages(s3server: SeaweedS3) -> None:
    # More than one list_objects_v2 page (1000 keys), with StartAfter inside the second page.
    store = s3server.store()
    keys = sorted(staging.make_key("t", "s", i, T0 + i) for i in range(1100))
    client = s3server.client(max_pool_connections=16)
    ts = [
        threading.Thread(
            target=lambda ks: [
                client.put_object(Bucket=store.bucket, Key=f"{store.prefix}/{k.path}", Body=b"") for k in ks
            ],
            args=(keys[i::8],),
        )
        for i in range(8)
    ]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert list(store.list("t")) == keys
    assert list(store.list("t", keys[1049].name)) == keys[1050:]


@pytest.mark.server
def test_tables(store: S3Staging) -> None:
    assert store.tables() == []
    for table in ("orders", "customers", "a_b"):
        store.put(staging.make_key(table, "s", 1, T0), b"")
    store.put_if_absent(staging.receipt_path("s", 1), b"{}")
    assert store.tables() == ["a_b", "customers", "orders"]


@pytest.mark.server
def test_put_if_absent(store: S3Staging) -> None:
    path = staging.receipt_path("src", 42)
    assert store.put_if_absent(path, b"first")
    assert not store.put_if_absent(path, b"second")
    assert store.read(path) == b"first"


def race_put_if_absent(store: S3Staging, path: str, writers: int) -> dict[int, bool]:
    """``put_if_absent`` by ``writers`` threads released together; writer -> won."""
    barrier = threading.Barrier(writers)
    results: dict[int, bool] = {}

    def claim(i: int) -> None:
        body = f"writer-{i}".encode() * 1000
        barrier.wait()
        results[i] = store.put_if_absent(path, body)

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


@pytest.mark.server
def test_put_if_absent_is_exclusive_under_concurrency(store: S3Staging) -> None:
    """If-None-Match must be enforced by the server: a server that ignored it would let every
    racer win (each PUT overwriting the last)."""
    # Few rounds: SeaweedFS makes the losers of a race wait ~1 s each on its object lock.
    for round_ in range(3):
        path = staging.receipt_path("race", round_)
        results = race_put_if_absent(store, path, 8)
        winners = [i for i, won in results.items() if won]
        assert len(results) == 8
        assert len(winners) == 1, f"round {round_}: {len(winners)} writers won"
        assert store.read(path) == f"writer-{winners[0]}".encode() * 1000


@pytest.mark.server
def test_list_names(store: S3Staging) -> None:
    prefix = staging.receipt_prefix("src")
    assert store.list_names(prefix) == []
    for seq in (3, 1, 2):
        store.put_if_absent(staging.receipt_path("src", seq), b"{}")
    store.put_if_absent(staging.receipt_path("src", 1, generation=1), b"{}")
    store.put_if_absent(f"{prefix}sub/deeper.json", b"{}")  # in a sub-folder: not listed
    store.put_if_absent(staging.receipt_path("src-other", 9), b"{}")  # a sibling folder sharing the prefix
    assert store.list_names(prefix) == [
        "00000000000000000001.000.json",
        "00000000000000000001.001.json",
        "00000000000000000002.000.json",
        "00000000000000000003.000.json",
    ]


@pytest.mark.server
def test_open_store_from_settings(s3server: SeaweedS3, tmp_path: Path) -> None:
    settings = make_settings(tmp_path, **s3server.settings_overrides("from-settings/nested"))
    store = stores.open_store(settings)
    assert isinstance(store, S3Staging)
    assert (store.bucket, store.prefix) == (s3server.bucket, "from-settings/nested")
    store.check()
    key = staging.make_key("orders", "s", 1, T0)
    store.put(key, b"x")
    assert store.uri(key) == f"s3://{s3server.bucket}/from-settings/nested/orders/{key.name}"
    assert (
        s3server.client().get_object(Bucket=s3server.bucket, Key=f"from-settings/nested/{key.path}")["Body"].read()
        == b"x"
    )


@pytest.mark.server
def test_bad_credentials_fail(s3server: SeaweedS3) -> None:
    with pytest.raises(SettingsError):
        S3Staging(s3server.bucket, access_key="only-one")
    wrong = S3Staging(s3server.bucket, endpoint_url=s3server.endpoint, access_key="x", secret_key="y")
    with pytest.raises(ClientError):
        wrong.check()
    missing_bucket = s3server.store()
    missing_bucket.bucket = "no-such-bucket"
    with pytest.raises(ClientError):
        missing_bucket.check()


@pytest.mark.server
def test_outage_fails_fast_and_data_survives_restart(s3server: SeaweedS3) -> None:
    store = s3server.store()
    key = staging.make_key("orders", "s", 1, T0)
    store.put(key, b"before")
    assert store.put_if_absent(staging.receipt_path("s", 1), b"claim")
    store.check()
    s3server.stop()
    try:
        with pytest.raises((BotoCoreError, ClientError)):
            store.check()
        began = time.monotonic()
        with pytest.raises((BotoCoreError, ClientError)):
            store.put(staging.make_key("orders", "s", 2, T0), b"during")
        # A refused connection: 3 attempts with standard backoff, no connect timeout involved.
        assert time.monotonic() - began < 8
    finally:
        s3server.start()
    store.check()
    assert store.get(key) == b"before"
    assert not store.put_if_absent(staging.receipt_path("s", 1), b"again")
    assert list(store.list("orders")) == [key]
    store.put(staging.make_key("orders", "s", 2, T0), b"after")
    assert len(list(store.list("orders"))) == 2


@pytest.mark.server
def test_hung_server_fails_within_read_timeout(s3server: SeaweedS3) -> None:
    # The kernel still accepts connections of a frozen server: only the read timeout ends a call.
    store = s3server.store(read_timeout=0.5, max_attempts=2)
    store.check()
    s3server.pause()
    try:
        began = time.monotonic()
        with pytest.raises(BotoCoreError):
            store.put(staging.make_key("orders", "s", 1, T0), b"x")
        # Per attempt: ~1 s waiting for "100 Continue", then the read timeout.
        assert time.monotonic() - began < 5
    finally:
        s3server.resume()
    store.check()
