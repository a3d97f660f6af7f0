"""Issue 31, part 1: a batch's transaction markers land as ONE object in the staging folder
``.transactions``, under the batch's receipt: durable before the ack, once however often the
batch comes (a resend, a restart, a take-over of a dead claim), alone for a batch without events."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import msgspec

from cdclake import staging
from cdclake.contracts.events import Batch, TransactionMarker, decode_batch
from cdclake.staging import Receipt
from receiver import decode
from receiver.claim import IN_FLIGHT_S
from receiver.prepared import Prepared
from tests.receiver.test_receiver_protocol import batch, client_for, ev, home, objects, staged_lines, tokens_file

__all__ = ["home"]  # the fixture, shared

TX = staging.TRANSACTIONS


def markers(root: Path) -> list[tuple[staging.ObjectKey, list[dict[str, Any]]]]:
    store = staging.LocalStaging(root)
    return [(k, [json.loads(x) for x in store.get(k).splitlines()]) for k in store.list(TX)]


def tx_batch(seq: int, *evs: dict[str, Any], tx: str = "tx-1") -> dict[str, Any]:
    return batch(seq, *evs) | {"transaction": tx}


def test_the_shorthand_lands_stamped_events_and_one_markers_object_listed_in_the_receipt(home: Path) -> None:
    root = home / "staging"
    with client_for(home) as c:
        r = c.post("/v1/batches", json=tx_batch(1, ev(1, "users"), ev(2, "Orders"), ev(3, "orders")))
    assert r.status_code == 200 and r.json()["status"] == "persisted"
    assert {(e["table"], e["transaction"]["id"]) for e in staged_lines(root)} == {("users", "tx-1"), ("orders", "tx-1")}
    [(key, lines)] = markers(root)
    end = {"status": "END", "eventCount": 3, "tables": {"users": 1, "orders": 2}}
    assert lines == [{"source": "app-1", "batchSequence": 1, "id": "tx-1"} | end]
    receipt = staging.newest_receipt(staging.LocalStaging(root), "app-1", 1)
    assert receipt is not None and key.path in receipt.keys and len(receipt.keys) == 3
    assert receipt.types is not None and TX not in receipt.types  # types are the tables' only
    details = r.json()["details"]
    assert f"staging/{key.path}" in details["persistedPaths"] and len(details["persistedPaths"]) == 3
    assert details["persistedPath"].startswith("staging/orders/")  # a table's object, not the markers'
    assert staging.LocalStaging(root).tables() == ["orders", "users"]


def test_a_resent_batch_leaves_exactly_one_markers_object_also_after_a_restart(home: Path) -> None:
    b = batch(1, ev(1)) | {"transactions": [{"id": "t", "status": "BEGIN"}, {"id": "t", "status": "END"}]}
    with client_for(home) as c:
        first = c.post("/v1/batches", json=b)
        again = c.post("/v1/batches", json=b)
    with client_for(home) as c:
        restarted = c.post("/v1/batches", json=b)
        changed = c.post("/v1/batches", json=b | {"transactions": [{"id": "u", "status": "BEGIN"}]})
    assert first.json()["status"] == "persisted"
    assert again.json()["status"] == restarted.json()["status"] == "duplicate"
    assert changed.status_code == 409  # other markers under the same number are other content
    assert [[m["status"] for m in lines] for _, lines in markers(home / "staging")] == [["BEGIN", "END"]]


def dead_claim(home: Path, b: dict[str, Any], write: str) -> tuple[int, Prepared]:
    """A receiver claimed ``b`` (batch 2 of app-1) long ago and died having written only the
    objects ``write`` says: "tables" (it died before the markers) or "markers"."""
    with client_for(home) as c:
        assert c.post("/v1/batches", json=batch(1)).json()["status"] == "persisted"
    store = staging.LocalStaging(home / "staging")
    p = Prepared.from_batch(decode_batch(json.dumps(b).encode()))
    old_ms = int((time.time() - IN_FLIGHT_S - 5) * 1000)
    keys = [staging.make_key(t, "app-1", 2, old_ms) for t in sorted(p.objects)]
    receipt = Receipt("app-1", 2, 0, old_ms, p.digest, p.events, [k.path for k in keys], "elsewhere:1:1", p.types)
    assert store.put_if_absent(staging.receipt_path("app-1", 2), msgspec.json.encode(receipt))
    for k in keys:
        if (k.table == TX) == (write == "markers"):
            store.put(k, p.objects[k.table])
    return old_ms, p


def test_a_claim_that_died_before_its_markers_is_taken_over_and_lands_them_once(home: Path) -> None:
    b2 = tx_batch(2, ev(10, "users"), ev(11, "orders"), tx="tx-9")
    old_ms, p = dead_claim(home, b2, write="tables")
    root = home / "staging"
    assert markers(root) == []
    with client_for(home) as c:
        r = c.post("/v1/batches", json=b2)
        again = c.post("/v1/batches", json=b2)
    assert r.json()["status"] == "persisted" and again.json()["status"] == "duplicate"
    [(key, lines)] = markers(root)
    assert key.landed_ms > old_ms  # written by the take-over, under a fresh name
    assert staging.LocalStaging(root).get(key) == p.objects[TX]
    assert [m["id"] for m in lines] == ["tx-9"]
    # The tables' objects the dead claim wrote are kept, not written again.
    assert sorted((e["table"], e["sequence"]) for e in staged_lines(root) if e["batchSequence"] == 2) == [
        ("orders", 11),
        ("users", 10),
    ]
    taken = staging.newest_receipt(staging.LocalStaging(root), "app-1", 2)
    assert taken is not None and taken.generation == 1 and key.path in taken.keys


def test_a_claim_that_died_after_its_markers_keeps_them_under_their_name(home: Path) -> None:
    b2 = tx_batch(2, ev(10, "users"), tx="tx-9")
    old_ms, _ = dead_claim(home, b2, write="markers")
    with client_for(home) as c:
        assert c.post("/v1/batches", json=b2).json()["status"] == "persisted"
    [(key, _)] = markers(home / "staging")
    assert key.landed_ms == old_ms
    assert [(k.table, k.batch_sequence) for k in objects(home / "staging")] == [("users", 1), ("users", 2)]


def submit(c: Any, b: Batch) -> dict[str, Any]:
    """Through the service layer, as the Debezium adapter's batches come (built in Python)."""
    svc = c.app.state.service
    answer = c.portal.call(svc.submit, lambda: decode.Decoded(b, False), None, "http", 0)
    return msgspec.to_builtins(answer.body)  # type: ignore[no-any-return]


def test_a_batch_of_markers_only_lands_just_its_markers_object_once(home: Path) -> None:
    marks = [TransactionMarker("t7", "BEGIN", timestamp=1), TransactionMarker("t7", "END", 2, 0, {}, "0/AB")]
    with client_for(home) as c:
        first = submit(c, Batch("dbz", 1, [], marks))
        again = submit(c, Batch("dbz", 1, [], marks))
        following = c.post("/v1/batches", json=batch(2, source="dbz"))
    assert first["status"] == "persisted" and again["status"] == "duplicate"
    assert first["details"]["eventsProcessed"] == 0
    [path] = first["details"]["persistedPaths"]
    assert path.startswith(f"staging/{TX}/") and first["details"]["persistedPath"] == path
    assert following.json()["status"] == "persisted"  # it counted in the numbering
    [(_, lines)] = markers(home / "staging")
    assert [(m["status"], m.get("position")) for m in lines] == [("BEGIN", None), ("END", "0/AB")]
    assert [k.batch_sequence for k in objects(home / "staging")] == [2]  # no table object for batch 1


def test_markers_naming_a_table_the_token_may_not_write_are_refused(home: Path) -> None:
    b = batch(1, ev(1, "users")) | {"transactions": [{"id": "t", "status": "END", "tables": {"orders": 1}}]}
    with client_for(home, tokens_file=tokens_file(home)) as c:
        r = c.post("/v1/batches", json=b, headers={"Authorization": "Bearer secret-a"})
    assert r.status_code == 403 and r.json()["field"] == "$.transactions[0].tables.orders"
    assert markers(home / "staging") == [] and objects(home / "staging") == []


def test_a_websocket_batch_carries_the_shorthand_and_markers_too(home: Path) -> None:
    with client_for(home) as c, c.websocket_connect("/v1/stream") as ws:
        ws.send_json({"type": "connect", "sourceDoId": "ws-1"})
        assert ws.receive_json()["type"] == "status"
        frame = {"type": "cdc_batch", "sourceDoId": "ws-1", "sequenceNumber": 1, "events": [ev(1, "users")]}
        ws.send_json(frame | {"transaction": "w1", "transactions": [{"id": "w0", "status": "END"}]})
        assert ws.receive_json()["status"] == "persisted"
        ws.send_json(frame | {"sequenceNumber": 2, "transactions": [{"id": "x", "status": "END", "eventCount": -1}]})
        bad = ws.receive_json()
    assert bad["type"] == "nack" and bad["field"] == "$.transactions[0].eventCount"
    [(_, lines)] = markers(home / "staging")
    assert [(m["id"], m.get("tables")) for m in lines] == [("w0", None), ("w1", {"users": 1})]
    assert [e["transaction"] for e in staged_lines(home / "staging")] == [{"id": "w1"}]


def test_the_openapi_document_shows_the_transaction_fields(home: Path) -> None:
    with client_for(home) as c:
        schemas = c.get("/openapi.json").json()["components"]["schemas"]
    batch_props = schemas["Batch"]["properties"]
    assert batch_props["transaction"]["anyOf"][0]["maxLength"] == 256
    assert batch_props["transactions"]["anyOf"][0]["maxItems"] == 100_000
    assert set(schemas["TransactionMarker"]["properties"]) == {
        "id",
        "status",
        "timestamp",
        "eventCount",
        "tables",
        "position",
    }
    assert schemas["CDCEvent"]["properties"]["transaction"]["anyOf"][0]["$ref"].endswith("/EventTransaction")


class Flaky(staging.LocalStaging):
    """A local store whose writes fail while ``down``."""

    down = True

    def put(self, key: staging.ObjectKey, data: bytes) -> None:
        if self.down:
            raise OSError("store down")
        super().put(key, data)

    def put_if_absent(self, path: str, data: bytes) -> bool:
        if self.down:
            raise OSError("store down")
        return super().put_if_absent(path, data)


def test_markers_acked_from_the_spool_land_once_when_it_drains(tmp_path: Path) -> None:
    from receiver.landing import Lander
    from receiver.spool import Spool

    store = Flaky(tmp_path / "staging")
    lander = Lander(store, Spool(tmp_path / "spool"))
    p = Prepared.from_batch(decode_batch(json.dumps(tx_batch(1, ev(1, "users"), tx="sp")).encode()))
    assert lander.land(p).status == "fallback"
    store.down = False
    assert lander.drain() == 1 and lander.drain() == 0
    [(_, lines)] = markers(tmp_path / "staging")
    assert [(m["id"], m["tables"]) for m in lines] == [("sp", {"users": 1})]
    assert [e["transaction"] for e in staged_lines(tmp_path / "staging")] == [{"id": "sp"}]
