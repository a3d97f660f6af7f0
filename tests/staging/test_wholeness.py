"""cdclake.lake.wholeness (which transactions are whole, which objects may be published) and
cdclake.lake.positions (END positions in the source's order), case by case. The expectations
are written out by hand from the rule in the module's docstring; test_wholeness_model.py checks
the same against a brute-force model over random landings."""

from __future__ import annotations

import json

import pytest

from cdclake.contracts.events import StagedMarker
from cdclake.lake import positions
from cdclake.lake.wholeness import Holding, whole
from cdclake.staging.receipts import Receipt, decode_receipt, encode_receipt


def end(tx: str, tables: dict[str, int] | None, position: str | None = None, count: int | None = None) -> StagedMarker:
    total = count if count is not None or tables is None else sum(tables.values())
    return StagedMarker("src", 1, tx, "END", eventCount=total, tables=tables, position=position)


def begin(tx: str) -> StagedMarker:
    return StagedMarker("src", 1, tx, "BEGIN")


def test_a_transaction_over_two_batches_and_tables_is_whole_once_every_event_and_its_end_landed() -> None:
    objs = [
        Holding("orders/a", "orders", {"t1": 1}),
        Holding("lines/a", "lines", {"t1": 1}),
        Holding("lines/b", "lines", {"t1": 1}),
    ]
    v = whole([begin("t1"), end("t1", {"orders": 1, "lines": 2}, "100")], objs)
    assert v.whole == {"t1"} and dict(v.held) == {}
    assert v.publishable == {"orders/a", "lines/a", "lines/b"}
    assert v.position == "100" and v.behind == set() and v.faults == []


def test_missing_end_or_events_hold_the_transaction_and_every_object_holding_it() -> None:
    objs = [
        Holding("orders/a", "orders", {"t1": 1, "t2": 1}),
        Holding("lines/a", "lines", {"t1": 1}),
        Holding("users/a", "users", {}),  # no transaction: always publishable
    ]
    v = whole([end("t1", {"orders": 1, "lines": 2}, "100"), begin("t2")], objs)
    assert v.whole == set()
    assert {tx: (h.why, h.detail) for tx, h in v.held.items()} == {
        "t1": ("short", "lines has 1 of 2 events"),
        "t2": ("open", "no END yet"),
    }
    assert v.publishable == {"users/a"} and v.position is None


def test_more_events_than_the_end_counts_is_a_fault_never_published() -> None:
    objs = [Holding("orders/a", "orders", {"t1": 2}), Holding("users/a", "users", {"t1": 1})]
    v = whole([end("t1", {"orders": 1})], objs)
    [fault] = v.faults
    assert fault.why == "over" and v.publishable == set()
    assert "orders has 2 of 1 events" in fault.detail and "users has 1 of 0 events" in fault.detail


def test_a_redelivered_end_is_one_end_and_two_ends_that_disagree_are_a_conflict() -> None:
    objs = [Holding("orders/a", "orders", {"t1": 1}), Holding("orders/b", "orders", {"t2": 1})]
    same = end("t1", {"orders": 1}, "7")
    v = whole([same, same, end("t2", {"orders": 1}, "8"), end("t2", {"orders": 2}, "8")], objs)
    assert v.whole == {"t1"} and v.publishable == {"orders/a"}
    assert [(f.id, f.why) for f in v.faults] == [("t2", "conflict")]
    assert v.position == "7"


def test_holding_spreads_through_shared_objects_until_nothing_changes() -> None:
    # t0 is held (no END); t1 shares an object with it, t2 one with t1, t3 shares nothing.
    objs = [
        Holding("a/1", "a", {"t0": 1, "t1": 1}),
        Holding("b/1", "b", {"t1": 1, "t2": 1}),
        Holding("c/1", "c", {"t2": 1}),
        Holding("c/2", "c", {"t3": 1}),
    ]
    ends = [end("t1", {"a": 1, "b": 1}, "20"), end("t2", {"b": 1, "c": 1}, "30"), end("t3", {"c": 1}, "40")]
    v = whole([begin("t0"), *ends], objs)
    assert v.whole == {"t3"} and v.publishable == {"c/2"}
    assert {tx: h.why for tx, h in v.held.items()} == {"t0": "open", "t1": "entangled", "t2": "entangled"}
    assert v.held["t2"].detail == "shares b/1 with held transaction t1"
    # The publish reaches t3's END, but not as a prefix of the source: t1 and t2 ended before it.
    assert v.position == "40" and v.behind == {"t1", "t2"}


def test_an_end_with_only_a_total_or_no_counts() -> None:
    objs = [Holding("a/1", "a", {"t1": 1}), Holding("b/1", "b", {"t1": 1}), Holding("a/2", "a", {"t2": 1})]
    v = whole([end("t1", None, count=2), end("t2", None)], objs)
    assert v.whole == {"t1"} and v.publishable == {"a/1", "b/1"}
    assert (v.held["t2"].why, v.faults) == ("uncounted", [])


def test_an_empty_transaction_is_whole_and_its_position_counts() -> None:
    v = whole([end("t1", {}, "0/10")], [])
    assert v.whole == {"t1"} and v.position == "0/10"


def test_mariadb_positions_are_greatest_per_domain_and_a_held_earlier_gtid_is_behind() -> None:
    ends = [end("0-1-9", {"a": 1}, "0-1-9"), end("0-2-12", {"a": 1}, "0-2-12"), end("1-3-5", {"a": 1}, "1-3-5")]
    objs = [Holding(f"a/{e.id}", "a", {e.id: 1}) for e in ends] + [Holding("a/x", "a", {"0-1-10": 1})]
    v = whole([*ends, end("0-1-10", {"a": 2}, "0-1-10")], objs)
    assert v.whole == {"0-1-9", "0-2-12", "1-3-5"}
    assert v.position == "0-2-12,1-3-5"  # domain 0 by sequence (server 2 took over), domain 1 apart
    assert v.behind == {"0-1-10"}


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (["35043232", "35042504", "100"], "35043232"),
        # 0x16B3748 = 23803720: one LSN in either spelling, ordered as one
        (["0/16B3748", "23803719"], "0/16B3748"),
        (["0/16B3748", "23803721"], "23803721"),
        (["1/0", "4294967295"], "1/0"),  # the high half: 1/0 = 2**32
        (["0-1-9", "0-2-12", "0-1-11"], "0-2-12"),
        (["1-1-3", "0-1-99", "1-1-2"], "0-1-99,1-1-3"),
        (["mysql-bin.000003:154", "mysql-bin.000002:9000"], "mysql-bin.000003:154"),
        (["5", "0-1-9"], None),  # no common order
        (["lsn=5"], None),
        ([], None),
    ],
)
def test_greatest_position_in_the_sources_order(given: list[str], expected: str | None) -> None:
    assert positions.greatest(given) == expected


def test_before_compares_within_a_kind_and_a_gtid_domain_only() -> None:
    assert positions.before("0-1-9", "0-2-12,1-3-5") and not positions.before("0-1-13", "0-2-12,1-3-5")
    assert not positions.before("2-1-1", "0-2-12,1-3-5")  # a domain the position does not name
    assert positions.before("0/10", "17") and not positions.before("18", "0/11")
    assert not positions.before("5", "mysql-bin.000001:4")


def test_holding_spreads_against_the_order_objects_are_visited_in() -> None:
    # The held transaction's object sorts last: one pass over the objects would miss t2.
    objs = [Holding("a/1", "a", {"t1": 1, "t2": 1}), Holding("z/1", "z", {"t0": 1, "t1": 1})]
    v = whole([begin("t0"), end("t1", {"a": 1, "z": 1}), end("t2", {"a": 1})], objs)
    assert v.whole == set() and v.publishable == set()
    assert v.held["t2"].detail == "shares a/1 with held transaction t1"


def test_a_receipt_without_counts_reads_as_before_and_none_are_written_when_there_are_none() -> None:
    old = b'{"source":"a","sequenceNumber":1,"generation":0,"landedMs":5,"digest":"d","events":1,"keys":["t/x"]}'
    r = decode_receipt(old)
    assert r.transactions is None and r.owner == "" and r.types is None
    assert b"transactions" not in encode_receipt(r)
    counted = Receipt("a", 1, 0, 5, "d", 1, ["t/x"], "h:1:1", None, {"t": {"tx": 1}})
    assert json.loads(encode_receipt(counted))["transactions"] == {"t": {"tx": 1}}
    assert decode_receipt(encode_receipt(counted)) == counted


def test_a_transaction_re_sent_in_posts_cut_differently_is_whole_once_by_its_table_orders() -> None:
    """A restarted Debezium re-sends events under new batch numbers, cut differently: by their
    ``tableOrder`` runs each event counts once across objects; by counts alone they would add up
    to more than the END says (a fault)."""
    first = [Holding("orders/a", "orders", {"t1": [[1, 2]]}), Holding("lines/a", "lines", {"t1": [[1, 1]]})]
    again = [Holding("orders/b", "orders", {"t1": [[2, 3]]}), Holding("lines/b", "lines", {"t1": [[1, 2]]})]
    v = whole([end("t1", {"orders": 3, "lines": 2}, "9")], first + again)
    assert v.whole == {"t1"} and v.publishable == {"orders/a", "lines/a", "orders/b", "lines/b"}
    counted = [Holding(o.path, o.table, {"t1": 2}) for o in first + again]
    assert whole([end("t1", {"orders": 3, "lines": 2}, "9")], counted).held["t1"].why == "over"


def test_the_receiver_records_table_order_runs_when_every_event_has_one() -> None:
    from cdclake.contracts.events import decode_batch, encode
    from receiver.prepared import transaction_counts

    def ev(seq: int, table: str, order: int | None) -> dict[str, object]:
        block = {"id": "t1"} | ({"tableOrder": order} if order is not None else {})
        e = {"sequence": seq, "timestamp": 1, "operation": "INSERT", "table": table, "rowId": str(seq)}
        return e | {"after": {"v": 1}, "transaction": block}

    events = [ev(1, "orders", 1), ev(2, "orders", 2), ev(3, "orders", 4), ev(3, "orders", 4), ev(4, "Lines", None)]
    batch = decode_batch(encode({"source": "s", "sequenceNumber": 1, "events": events}))
    assert transaction_counts(batch) == {"orders": {"t1": [[1, 2], [4, 4]]}, "lines": {"t1": 1}}
