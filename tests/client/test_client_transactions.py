"""Issue 31, part 1: the producer SDK sends a source transaction as ONE batch (the wire's
``transaction`` shorthand) over HTTP and WebSocket, never splits one, and tags single events."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cdclake import staging
from cdclake.client import Producer
from cdclake.contracts.events import MAX_EVENTS_PER_BATCH
from tests.client.test_client import FakeTime, FakeWs, Receiver, fake, producer, vars_of
from tests.receiver.test_receiver_protocol import client_for, staged_lines

__all__ = ["fake"]  # the fixture, shared


def test_a_transaction_block_is_one_batch_whatever_the_batch_size(fake: FakeTime) -> None:
    rx = Receiver()
    with producer(rx, fake, batch_size=2) as p:
        p.send("users", "INSERT", "before", after={"id": 0})
        with p.transaction("tx-1"):
            for i in range(5):  # more than batch_size: still one batch
                p.send("users", "INSERT", str(i), after={"id": i})
            assert p.pending_events == 5 and len(rx.posts) == 1  # the earlier event went first
        p.send("users", "INSERT", "after", after={"id": 9}, transaction="tx-2")
    bodies = rx.bodies()
    assert [len(b["events"]) for b in bodies] == [1, 5, 1]
    assert [b.get("transaction") for b in bodies] == [None, "tx-1", None]
    assert bodies[2]["events"][0]["transaction"] == {"id": "tx-2"}
    assert "transaction" not in bodies[1]["events"][0]  # the receiver stamps them from the shorthand


def test_a_failing_transaction_block_sends_none_of_it(fake: FakeTime) -> None:
    rx = Receiver()
    p = producer(rx, fake)
    with pytest.raises(KeyError), p.transaction("tx"):
        p.send("users", "INSERT", "1", after={"id": 1})
        raise KeyError("the caller failed half way")
    p.close()
    assert rx.posts == [] and p.pending_events == 0


def test_a_transaction_is_refused_rather_than_split_past_the_batch_limit(fake: FakeTime) -> None:
    rx = Receiver()
    p = producer(rx, fake)
    one = {"operation": "DELETE", "table": "t", "rowId": "a"}
    with pytest.raises(ValueError, match=f"MAX_EVENTS_PER_BATCH \\({MAX_EVENTS_PER_BATCH}\\)"):
        p.send_events([one] * (MAX_EVENTS_PER_BATCH + 1), transaction="big")
    with pytest.raises(ValueError, match="MAX_EVENTS_PER_BATCH"), p.transaction("big"):
        for i in range(MAX_EVENTS_PER_BATCH + 1):
            p.send("t", "DELETE", str(i))
    assert rx.posts == []


@pytest.mark.parametrize("bad", ["", "x" * 257])
def test_transaction_ids_are_checked_before_anything_is_sent(fake: FakeTime, bad: str) -> None:
    rx = Receiver()
    p = producer(rx, fake)
    for attempt in (
        lambda: p.send("t", "DELETE", "a", transaction=bad),
        lambda: p.send_events([{"operation": "DELETE", "table": "t", "rowId": "a"}], transaction=bad),
        lambda: p.transaction(bad).__enter__(),
    ):
        with pytest.raises(ValueError, match=r"1\.\.256"):
            attempt()
    with pytest.raises(RuntimeError, match="do not nest"), p.transaction("a"), p.transaction("b"):
        pass
    with pytest.raises(ValueError, match="inside transaction 'a'"), p.transaction("a"):
        p.send("t", "DELETE", "a", transaction="b")
    assert rx.posts == []


def test_a_transaction_over_websocket_carries_the_shorthand(fake: FakeTime) -> None:
    ws = FakeWs(last_ack=0)
    ws.drop_next_batch = False
    p = Producer("http://rx.test", "src", transport="ws", ws_connect=ws.connect, **vars_of(fake))
    with p.transaction("w-1"):
        p.send("users", "INSERT", "1", after={"id": 1}, sequence=1, timestamp_ms=1)
    p.close()
    [frame] = [m for m in ws.sent if m["type"] == "cdc_batch"]
    assert frame["transaction"] == "w-1" and len(frame["events"]) == 1


def test_a_transaction_lands_through_the_real_receiver(tmp_path: Path) -> None:
    with (
        client_for(tmp_path) as c,
        Producer("http://testserver", "sdk", http_client=c, batch_size=1) as p,
        p.transaction("tx-42"),
    ):
        p.send("users", "INSERT", "1", after={"id": 1})
        p.send("orders", "INSERT", "2", after={"id": 2})
    root = tmp_path / "staging"
    assert sorted((e["table"], e["transaction"]["id"]) for e in staged_lines(root)) == [
        ("orders", "tx-42"),
        ("users", "tx-42"),
    ]
    store = staging.LocalStaging(root)
    [key] = store.list(staging.TRANSACTIONS)
    line: dict[str, Any] = json.loads(store.get(key))
    assert (line["id"], line["eventCount"], line["tables"]) == ("tx-42", 2, {"users": 1, "orders": 1})


def test_changes_group_by_their_source_transaction_in_first_seen_order() -> None:
    from cdclake.client.lake import by_transaction

    feed: list[dict[str, Any]] = [
        {"table": "orders", "rowId": "1", "transaction": "t1"},
        {"table": "users", "rowId": "9", "transaction": None},
        {"table": "order_lines", "rowId": "1", "transaction": "t2"},
        {"table": "order_lines", "rowId": "2", "transaction": "t1"},
    ]
    assert [(tx, [c["rowId"] for c in cs]) for tx, cs in by_transaction(feed)] == [
        ("t1", ["1", "2"]),
        (None, ["9"]),
        ("t2", ["1"]),
    ]
