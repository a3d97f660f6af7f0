"""Issue 31, part 1: source transactions at the door: the ``transaction`` shorthand expanded
(:func:`whole_transaction`), BEGIN/END markers validated with the field at fault named, and the
staged forms (an event's ``transaction``, the markers' NDJSON)."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from cdclake.contracts import events as E
from cdclake.contracts.events import Batch, CDCEvent, EventTransaction, InvalidBatch, TransactionMarker


def ev(seq: int, table: str = "orders", **extra: Any) -> dict[str, Any]:
    e = {"sequence": seq, "timestamp": 1_767_225_600_000 + seq, "operation": "INSERT", "table": table}
    return e | {"rowId": str(seq), "after": {"id": seq}} | extra


def body(*evs: dict[str, Any], **extra: Any) -> bytes:
    return json.dumps({"source": "app", "sequenceNumber": 7, "events": list(evs) or [ev(1)], **extra}).encode()


def refused(raw: bytes) -> InvalidBatch:
    with pytest.raises(InvalidBatch) as info:
        E.decode_batch(raw)
    return info.value


def end(tables: dict[str, int] | None = None, count: int | None = None, id: str = "t") -> dict[str, Any]:
    m: dict[str, Any] = {"id": id, "status": "END"}
    if tables is not None:
        m["tables"] = tables
    if count is not None:
        m["eventCount"] = count
    return m


# --------------------------------------------------------------------------- the shorthand


def test_the_shorthand_stamps_every_event_and_appends_its_end_with_lower_cased_counts() -> None:
    given = [TransactionMarker("earlier", "END", eventCount=2)]
    raw = body(ev(1, "Orders"), ev(2, "orders"), ev(3, "items"), ev(4, "ORDERS"), transaction="tx-1")
    raw = json.dumps(json.loads(raw) | {"transactions": msgspec.to_builtins(given)}).encode()
    b = E.decode_batch(raw)
    # Worked out by hand: 3 events of orders in three spellings, 1 of items.
    assert [e.transaction for e in b.events] == [EventTransaction("tx-1")] * 4
    assert b.transactions == [
        given[0],
        TransactionMarker("tx-1", "END", eventCount=4, tables={"orders": 3, "items": 1}),
    ]
    assert b.transaction is None  # expanded: consumers see markers only
    assert E.whole_transaction(b) is b  # so a second expansion changes nothing


def test_the_shorthand_keeps_an_events_own_order_within_the_same_transaction() -> None:
    b = E.decode_batch(body(ev(1, transaction={"id": "tx", "totalOrder": 1}), ev(2), transaction="tx"))
    assert b.events[0].transaction == EventTransaction("tx", totalOrder=1)
    assert b.events[1].transaction == EventTransaction("tx")


def test_the_shorthand_refuses_an_event_of_another_transaction_and_markers_of_its_own() -> None:
    exc = refused(body(ev(1), ev(2, transaction={"id": "other"}), transaction="tx"))
    assert exc.field == "$.events[1].transaction.id" and "'other'" in exc.message
    exc = refused(body(ev(1), transaction="tx", transactions=[{"id": "tx", "status": "BEGIN"}]))
    assert exc.field == "$.transactions[0].id"


def test_a_batch_without_the_shorthand_is_left_as_it_came() -> None:
    b = E.decode_batch(body(ev(1)))
    assert b.transactions is None and b.events[0].transaction is None


# --------------------------------------------------------------------------- markers


def test_end_event_count_must_be_the_sum_of_its_tables() -> None:
    ok = [{"id": "a", "status": "BEGIN"}, end({"orders": 2, "items": 1}, 3), end({"orders": 1})]
    assert len(E.decode_batch(body(transactions=ok)).transactions or []) == 3
    exc = refused(body(transactions=[*ok, end({"orders": 2, "items": 1}, 4)]))
    assert exc.field == "$.transactions[3].tables" and "add up to 3, not eventCount 4" in exc.message


@pytest.mark.parametrize(
    ("marker", "field"),
    [
        ({"id": "x" * 257, "status": "END"}, "$.transactions[0].id"),
        ({"id": "", "status": "END"}, "$.transactions[0].id"),
        ({"id": "t", "status": "COMMIT"}, "$.transactions[0].status"),
        (end(count=-1), "$.transactions[0].eventCount"),
        (end({"orders": -2}), "$.transactions[0].tables"),
        (end({"public.orders": 1}), "$.transactions[0].tables"),
        (end({"orders__changes": 1}), "$.transactions[0].tables.orders__changes"),
        (end({"Orders__Quarantine": 1}), "$.transactions[0].tables.Orders__Quarantine"),
        ({"id": "t", "status": "BEGIN", "tables": {"orders": 1}}, "$.transactions[0].tables"),
        ({"id": "t", "status": "BEGIN", "eventCount": 1}, "$.transactions[0].eventCount"),
        ({"id": "t", "status": "END", "position": "p" * 257}, "$.transactions[0].position"),
    ],
)
def test_hostile_markers_are_refused_naming_the_field(marker: dict[str, Any], field: str) -> None:
    assert refused(body(transactions=[marker])).field.startswith(field)


def test_ids_are_counted_in_characters_and_capped_everywhere() -> None:
    ok = "事" * 256  # 768 bytes of UTF-8, 256 characters: the limit is characters
    b = E.decode_batch(body(ev(1, transaction={"id": ok}), transactions=[end(id=ok)]))
    assert b.transactions is not None and b.transactions[0].id == ok
    assert refused(body(transaction="事" * 257)).field == "$.transaction"
    assert refused(body(ev(1, transaction={"id": "x" * 257}))).field == "$.events[0].transaction.id"


def test_a_hundred_thousand_markers_pass_and_one_more_is_refused() -> None:
    many = [{"id": f"t{i}", "status": "BEGIN"} for i in range(E.MAX_EVENTS_PER_BATCH)]
    assert len(E.decode_batch(body(transactions=many)).transactions or []) == E.MAX_EVENTS_PER_BATCH
    exc = refused(body(transactions=[*many, {"id": "one-more", "status": "BEGIN"}]))
    assert exc.field == "$.transactions" and str(E.MAX_EVENTS_PER_BATCH) in exc.message


def test_python_built_batches_are_held_to_the_same_limits() -> None:
    """A Debezium batch is built in Python, where msgspec's constraints never ran."""
    e = CDCEvent(1, 1, "INSERT", "orders", "1", after={"id": 1})
    cases = [
        (Batch("app", 1, [], [TransactionMarker("x" * 257, "END")]), "$.transactions[0].id"),
        (Batch("app", 1, [], [TransactionMarker("t", "END", eventCount=-1)]), "$.transactions[0].eventCount"),
        (Batch("app", 1, [], [TransactionMarker("t", "END", tables={"a": -1})]), "$.transactions[0].tables.a"),
        (Batch("app", 1, [], [TransactionMarker("t", "END", tables={"a b": 1})]), "$.transactions[0].tables"),
        (Batch("app", 1, [msgspec.structs.replace(e, transaction=EventTransaction(""))]), "$.events[0].transaction.id"),
        (Batch("app", 1, [e], transaction="y" * 257), "$.transaction"),
    ]
    for batch, field in cases:
        with pytest.raises(InvalidBatch) as info:
            E.check_batch(batch)
        assert info.value.field.startswith(field), (batch, info.value)


# --------------------------------------------------------------------------- staged forms


def test_staged_lines_carry_the_transaction_and_markers_stage_as_their_own_ndjson() -> None:
    b = E.decode_batch(
        body(
            ev(1, "Orders", transaction={"id": "a", "tableOrder": 1}),
            transactions=[
                {"id": "a", "status": "BEGIN", "timestamp": 5},
                end({"Orders": 1, "orders": 2, "Items": 3}, 6, id="a") | {"position": "0/16B3748"},
            ],
        )
    )
    line = json.loads(E.stage_lines(b)["orders"])
    assert line["transaction"] == {"id": "a", "tableOrder": 1}
    markers = E.stage_markers(b)
    assert markers is not None and markers.endswith(b"\n")
    assert [json.loads(x) for x in markers.splitlines()] == [
        {"source": "app", "batchSequence": 7, "id": "a", "status": "BEGIN", "timestamp": 5},
        {
            "source": "app",
            "batchSequence": 7,
            "id": "a",
            "status": "END",
            "eventCount": 6,
            "tables": {"orders": 3, "items": 3},  # spellings of one staged table add up
            "position": "0/16B3748",
        },
    ]
    # Each line decodes as the contract's StagedMarker.
    assert msgspec.json.decode(markers.splitlines()[1], type=E.StagedMarker).tables == {"orders": 3, "items": 3}
    assert E.stage_markers(E.decode_batch(body(ev(1)))) is None


def test_a_batch_of_markers_only_stages_no_table_object() -> None:
    b = E.check_batch(Batch("dbz", 3, [], [TransactionMarker("t", "BEGIN")]))
    assert E.stage_lines(b) == {} and E.stage_types(b) == {}
    assert E.stage_markers(b) == b'{"source":"dbz","batchSequence":3,"id":"t","status":"BEGIN"}\n'
