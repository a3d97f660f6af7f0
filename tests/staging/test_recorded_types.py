"""The JSON types a landing records in its receipt, and how the apply finds them per object
(cdclake.staging.recorded_types): through the receiver's landing, its spool, and a take-over
that renamed an object. Whether the types are Spark's is tests/jobs/test_recorded_types.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cdclake import staging
from cdclake.contracts import events, jsontypes
from receiver.landing import Lander
from receiver.prepared import Prepared
from receiver.spool import Spool

ORDERS = ("st", (("after", ("st", (("id", "l"), ("note", "n"), ("tags", ("arr", "s"))))),))
# A DELETE stages no after-image: its object records no field.
GONE: Any = ("st", ())


def prepared(seq: int) -> Prepared:
    evs = [
        {"sequence": seq, "timestamp": 1, "operation": "INSERT", "table": "Orders", "rowId": "1"}
        | {"after": {"tags": ["a"], "id": 1, "note": ""}},
        {"sequence": seq + 1, "timestamp": 1, "operation": "DELETE", "table": "gone", "rowId": "2"},
    ]
    return Prepared.from_batch(
        events.decode_batch(events.encode({"source": "app", "sequenceNumber": seq, "events": evs}))
    )


def found(store: staging.Store, keys: list[staging.ObjectKey]) -> list[Any] | None:
    got = staging.recorded_types(store, keys)
    return None if got is None else [jsontypes.from_record(t) for t in got]


def test_a_landing_records_each_objects_types_in_its_receipt(tmp_path: Path) -> None:
    store = staging.LocalStaging(tmp_path)
    Lander(store, None).land(prepared(1))
    keys = [next(iter(store.list(t))) for t in ("gone", "orders")]
    assert found(store, keys) == [GONE, ORDERS]


def test_an_object_without_a_receipt_has_no_record(tmp_path: Path) -> None:
    store = staging.LocalStaging(tmp_path)
    Lander(store, None).land(prepared(1))
    other = staging.make_key("orders", "elsewhere", 7)
    store.put(other, b'{"rowId":"9"}\n')
    assert found(store, [next(iter(store.list("orders"))), other]) is None


class Down(staging.LocalStaging):
    def put_if_absent(self, path: str, data: bytes) -> bool:
        raise OSError("store down")


def test_a_spooled_batch_keeps_its_types_when_drained(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool")
    assert Lander(Down(tmp_path / "staging"), spool).land(prepared(1)).status == "fallback"
    store = staging.LocalStaging(tmp_path / "staging")
    assert Lander(store, spool).drain() == 1
    assert found(store, [next(iter(store.list("orders")))]) == [ORDERS]


def test_an_object_a_take_over_renamed_is_found_in_the_newer_receipt(tmp_path: Path) -> None:
    store = staging.LocalStaging(tmp_path)
    p = prepared(1)
    dead = staging.make_key("orders", "app", 1, 1_767_225_600_000)
    fresh = staging.make_key("orders", "app", 1, 1_767_225_700_000)
    for gen, key in ((0, dead), (1, fresh)):
        receipt = staging.Receipt("app", 1, gen, key.landed_ms, p.digest, 2, [key.path], "", p.types)
        store.put_if_absent(staging.receipt_path("app", 1, gen), staging.encode_receipt(receipt))
    store.put(fresh, p.objects["orders"])
    assert found(store, [fresh]) == [ORDERS]


def test_an_object_kept_by_a_later_take_over_has_the_types_of_the_landing_that_wrote_it(tmp_path: Path) -> None:
    """Generation 1 wrote the object; generation 2, a resend with other content (Debezium's
    batches are the same by event identity, not by content), names it again: 1's types hold."""
    store = staging.LocalStaging(tmp_path)
    p = prepared(1)
    dead, kept = (staging.make_key("orders", "app", 1, 1_767_225_600_000 + i) for i in (0, 1))
    other: Any = ("st", (("after", ("st", (("id", "s"),))),))
    for gen, keys, types in ((0, [dead], p.types), (1, [kept], p.types), (2, [kept], {"orders": other})):
        receipt = staging.Receipt("app", 1, gen, 0, p.digest, 2, [k.path for k in keys], "", types)
        store.put_if_absent(staging.receipt_path("app", 1, gen), staging.encode_receipt(receipt))
    store.put(kept, p.objects["orders"])
    assert found(store, [kept]) == [ORDERS]
