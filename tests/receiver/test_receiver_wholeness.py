"""Issue 31, part C, through the real receiver: each receipt counts its objects' distinct events
per transaction as they landed, and cdclake.lake.wholeness reading the store (receipts and
markers only) judges the transactions the way the posted events say it should."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from cdclake import staging
from cdclake.contracts.events import decode_batch
from cdclake.lake.wholeness import landed, whole
from receiver.claim import object_key
from receiver.prepared import Prepared
from tests.receiver.test_receiver_protocol import batch, client_for, ev, objects
from tests.receiver.test_receiver_transactions import Flaky, home

__all__ = ["home"]  # the fixture, shared


def in_tx(tx: str, e: dict[str, Any]) -> dict[str, Any]:
    return e | {"transaction": {"id": tx}}


def counted_in_staging(root: Path) -> dict[str, dict[str, int]]:
    """Per staged object path, its distinct (by sequence) events per transaction, read back."""
    seqs: dict[str, dict[str, set[int]]] = defaultdict(lambda: defaultdict(set))
    store = staging.LocalStaging(root)
    for key in objects(root):
        for line in store.get(key).splitlines():
            e = json.loads(line)
            if "transaction" in e:
                seqs[key.path][e["transaction"]["id"]].add(e["sequence"])
    return {path: {tx: len(s) for tx, s in by_tx.items()} for path, by_tx in seqs.items()}


def test_receipts_count_what_landed_and_the_store_says_which_transactions_are_whole(home: Path) -> None:
    root = home / "staging"
    b1 = batch(
        1,
        in_tx("t1", ev(1, "users")),
        in_tx("t1", ev(2, "Orders")),
        in_tx("t1", ev(2, "Orders")),  # an exact duplicate: the apply keeps one, the END counts one
        in_tx("t2", ev(3, "orders")),
        ev(4, "users"),
    )
    b2 = batch(2, in_tx("t1", ev(5, "orders")), in_tx("t2", ev(6, "audit")), ev(7, "audit")) | {
        "transactions": [
            {"id": "t1", "status": "END", "tables": {"users": 1, "orders": 2}, "position": "500"},
            {"id": "t2", "status": "BEGIN"},
        ]
    }
    b3 = batch(3, in_tx("t3", ev(8, "audit"))) | {"transaction": "t3"}
    with client_for(home) as c:
        assert [c.post("/v1/batches", json=b).json()["status"] for b in (b1, b2, b3)] == ["persisted"] * 3
    store = staging.LocalStaging(root)
    recorded = {}
    for seq in (1, 2, 3):
        receipt = staging.newest_receipt(store, "app-1", seq)
        assert receipt is not None
        for path in receipt.keys:
            table = path.split("/", 1)[0]
            if receipt.transactions and table in receipt.transactions:
                recorded[path] = receipt.transactions[table]
    assert recorded == counted_in_staging(root)
    by_object = {(k.table, k.batch_sequence): n for p, n in recorded.items() if (k := object_key(p))}
    assert by_object == {
        ("users", 1): {"t1": 1},
        ("orders", 1): {"t1": 1, "t2": 1},  # the duplicate of event 2 counts once
        ("orders", 2): {"t1": 1},
        ("audit", 2): {"t2": 1},
        ("audit", 3): {"t3": 1},
    }

    found = landed(store, "app-1")
    assert found.missing == [] and len(found.objects) == len(objects(root))
    assert sorted((m.id, m.status) for m in found.markers) == [("t1", "END"), ("t2", "BEGIN"), ("t3", "END")]
    v = whole(found.markers, found.objects)
    # t1 has all its events, but one object holds them with t2's, which has no END yet.
    assert v.whole == {"t3"} and {tx: h.why for tx, h in v.held.items()} == {"t1": "entangled", "t2": "open"}
    assert v.publishable == {k.path for k in objects(root) if k.table == "audit" and k.batch_sequence == 3}
    assert v.position is None  # t3's END (the shorthand's) has no position

    end_t2 = {"id": "t2", "status": "END", "tables": {"orders": 1, "audit": 1}}
    with client_for(home) as c:
        assert c.post("/v1/batches", json=batch(4, ev(9, "users")) | {"transactions": [end_t2]}).status_code == 200
    v = landed(store, "app-1").verdict()
    assert v.whole == {"t1", "t2", "t3"} and v.publishable == {k.path for k in objects(root)}
    assert v.position == "500"


def test_counts_survive_the_fallback_spool_and_an_unwritten_object_is_missing_not_landed(tmp_path: Path) -> None:
    from receiver.landing import Lander
    from receiver.spool import Spool

    store = Flaky(tmp_path / "staging")
    lander = Lander(store, Spool(tmp_path / "spool"))
    b = batch(1, in_tx("s", ev(1, "users")), in_tx("s", ev(2, "users"))) | {"transaction": "s"}
    assert lander.land(Prepared.from_batch(decode_batch(json.dumps(b).encode()))).status == "fallback"
    store.down = False
    assert lander.drain() == 1
    v = landed(store, "app-1").verdict()
    assert v.whole == {"s"} and v.publishable == {k.path for k in objects(tmp_path / "staging")}
    [key] = [k for k in objects(tmp_path / "staging") if k.table == "users"]
    store.delete(key.path)  # as if still being written: the receipt names it, it is not there
    found = landed(store, "app-1")
    assert found.missing == [key.path]
    assert whole(found.markers, found.objects).held["s"].detail == "users has 0 of 2 events"
