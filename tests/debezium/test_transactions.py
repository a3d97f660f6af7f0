"""Debezium's transaction metadata -> the batch's markers and each event's transaction
(cdclake.debezium.transactions through cdclake.debezium.envelope.to_batch).

The hand-made records are shaped like the PostgreSQL connector's (BEGIN with null counts, END
with ``data_collections``, ids ``<txId>:<LSN>``); :func:`test_real_posts_give_whole_transactions`
decodes posts a real Debezium Server 3.6 made (tests/support/debezium_transactions/, captured by
the e2e test's workload from PostgreSQL and MariaDB, with and without schemas)."""

from __future__ import annotations

import copy
import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from cdclake.contracts.events import InvalidBatch, TransactionMarker
from cdclake.debezium.envelope import OnlyTombstones, looks_like_debezium, to_batch
from tests.support.debezium import ENVELOPE_SCHEMA, Json, pg_payload

TX = "571:53195832"
XID = "571"  # the transaction a PostgreSQL id names: its txId
REAL = Path(__file__).resolve().parents[1] / "support" / "debezium_transactions"
MARKER_SCHEMA: Json = {"type": "struct", "name": "io.debezium.connector.common.TransactionMetadataValue"}


def begin(tx: str = TX, ts: int = 1486500577125) -> Json:
    return {"status": "BEGIN", "id": tx, "event_count": None, "data_collections": None, "ts_ms": ts}


def end(tx: str = TX, counts: dict[str, int] | None = None, ts: int = 1486500577691) -> Json:
    counts = {"public.orders": 1, "public.order_lines": 2} if counts is None else counts
    return {
        "status": "END",
        "id": tx,
        "event_count": sum(counts.values()),
        "data_collections": [{"data_collection": c, "event_count": n} for c, n in counts.items()],
        "ts_ms": ts,
    }


def row(table: str, key: int, total: int, in_table: int, tx: str = TX) -> Json:
    p = pg_payload("c", None, {"id": key}, lsn=53195830 + total, commit=53195000, table=table)
    p["transaction"] = {"id": tx, "total_order": total, "data_collection_order": in_table}
    return p


def enveloped(value: Json | None) -> Json:
    return {"schema": MARKER_SCHEMA if value and "status" in value else ENVELOPE_SCHEMA, "payload": value}


def whole_post() -> list[Json | None]:
    return [begin(), row("orders", 1, 1, 1), row("order_lines", 10, 2, 1), row("order_lines", 11, 3, 2), end()]


@pytest.mark.parametrize("wrap", [lambda v: v, enveloped], ids=["flattened", "enveloped"])
def test_a_transaction_in_one_post_gives_markers_and_each_events_transaction(wrap: Any) -> None:
    batch = to_batch([wrap(v) for v in whole_post()])
    assert batch.transactions == [
        TransactionMarker(XID, "BEGIN", timestamp=1486500577125, position="53195832"),
        TransactionMarker(
            XID, "END", 1486500577691, eventCount=3, tables={"orders": 1, "order_lines": 2}, position="53195832"
        ),
    ]
    assert [
        (e.table, e.transaction and (e.transaction.id, e.transaction.totalOrder, e.transaction.tableOrder))
        for e in batch.events
    ] == [
        ("orders", (XID, 1, 1)),
        ("order_lines", (XID, 2, 1)),
        ("order_lines", (XID, 3, 2)),
    ]
    # What an END promises per table is what the post's events carry.
    assert batch.transactions[1].tables == {"orders": 1, "order_lines": 2}


def test_markers_alone_are_a_batch_without_events_never_only_tombstones() -> None:
    batch = to_batch([enveloped(end()), None], producer="shop")
    assert batch.events == [] and [m.status for m in batch.transactions or []] == ["END"]
    with pytest.raises(OnlyTombstones):  # tombstones alone: as before
        to_batch([None, {"schema": None, "payload": None}], producer="shop")


def test_a_marker_alone_names_its_source_by_the_field_the_configuration_adds() -> None:
    assert to_batch([{**begin(), "cdclake_source": "shop"}]).source == "shop"
    with pytest.raises(InvalidBatch) as exc:
        to_batch([begin()])  # no token, no cdclake_source: whose markers?
    assert exc.value.field == "$" and "name no producer" in exc.value.message
    with pytest.raises(InvalidBatch) as exc:
        to_batch([row("orders", 1, 1, 1), {**end(), "cdclake_source": "other"}])
    assert exc.value.field == "$[1].cdclake_source"


def test_the_batch_number_covers_the_markers() -> None:
    post = [enveloped(begin()), enveloped(end())]
    again = to_batch(copy.deepcopy(post), producer="shop")
    assert to_batch(post, producer="shop").sequenceNumber == again.sequenceNumber  # a redelivery
    other = to_batch([enveloped(begin("571:9")), enveloped(end("571:9"))], producer="shop")
    assert other.sequenceNumber != again.sequenceNumber
    counted = to_batch([enveloped(begin()), enveloped(end(counts={"public.orders": 2}))], producer="shop")
    assert counted.sequenceNumber != again.sequenceNumber
    # Events alone keep the number they always had; markers beside them change it.
    events_only = to_batch(whole_post()[1:4])
    assert events_only.transactions is None
    assert to_batch(whole_post()).sequenceNumber != events_only.sequenceNumber


def test_two_schemas_tables_of_one_name_count_together_as_they_land() -> None:
    (m,) = (
        to_batch([end(counts={"public.users": 2, "audit.users": 3, "public.orders": 1})], producer="s").transactions
        or []
    )
    assert m.tables == {"users": 5, "orders": 1} and m.eventCount == 6


@pytest.mark.parametrize(
    ("tx", "position"),
    [("571:53195832", "53195832"), ("0-1-42", "0-1-42"), ("mysql-bin.000003:1234", "mysql-bin.000003:1234")],
)
def test_position_is_the_lsn_part_of_a_postgres_id_else_the_id(tx: str, position: str) -> None:
    (m,) = to_batch([begin(tx)], producer="s").transactions or []
    assert m.position == position


def test_detection_routes_a_flattened_marker_post_to_debezium() -> None:
    assert looks_like_debezium([begin(), row("orders", 1, 1, 1)])
    assert looks_like_debezium(end()) and looks_like_debezium(enveloped(end()))
    assert not looks_like_debezium({"status": "END", "id": "x"})  # not shaped like Debezium's


def _refused(post: Any) -> InvalidBatch:
    with pytest.raises(InvalidBatch) as exc:
        to_batch(post, producer="s")
    return exc.value


@pytest.mark.parametrize(
    ("change", "field", "says"),
    [
        ({"id": "x" * 257}, "$[0].payload.id", "1..256 characters, got 257"),
        ({"id": ""}, "$[0].payload.id", "1..256"),
        ({"id": 571}, "$[0].payload.id", "a string, got number"),
        ({"status": "COMMIT"}, "$[0].payload.status", "BEGIN or END"),
        ({"status": None}, "$[0].payload.status", "BEGIN or END"),
        ({"event_count": -1}, "$[0].payload.event_count", "[0, 2**63-1], got -1"),
        ({"event_count": 4}, "$[0].payload.event_count", "differs from the sum"),
        ({"ts_ms": "now"}, "$[0].payload.ts_ms", "milliseconds"),
        ({"data_collections": {"public.orders": 1}}, "$[0].payload.data_collections", "expected a list"),
        ({"data_collections": ["public.orders"]}, "$[0].payload.data_collections[0]", "an object"),
        (
            {"data_collections": [{"data_collection": "public.orders", "event_count": -3}]},
            "$[0].payload.data_collections[0].event_count",
            "got -3",
        ),
        (
            {"data_collections": [{"data_collection": "public.bad-name", "event_count": 3}]},
            "$[0].payload.data_collections[0].data_collection",
            "must match",
        ),
        (
            {"data_collections": [{"data_collection": "public.t__changes", "event_count": 3}]},
            "$[0].payload.data_collections[0].data_collection",
            "reserved",
        ),
        (
            {"data_collections": [{"data_collection": 7, "event_count": 3}]},
            "$[0].payload.data_collections[0].data_collection",
            "schema.table",
        ),
    ],
)
def test_a_malformed_marker_is_refused_at_its_path(change: Json, field: str, says: str) -> None:
    exc = _refused([enveloped({**end(), **change})])
    assert exc.field == field and says in exc.message, exc


def test_a_malformed_event_transaction_is_refused_at_its_path() -> None:
    bad = row("orders", 1, 1, 1)
    bad["transaction"] = {"id": "y" * 257, "total_order": 1}
    assert _refused([bad]).field == "$[0].transaction.id"
    bad["transaction"] = {"id": TX, "total_order": -1}
    assert _refused([bad]).field == "$[0].transaction.total_order"


def test_ten_thousand_data_collections_decode_in_linear_time() -> None:
    """A post's size is bounded by the receiver (CDCLAKE_MAX_EVENT_BYTES per record), not here:
    a wide transaction is legitimate, and refusing it would stall the connector."""
    counts = {f"s.t{i}": 1 for i in range(10_000)}
    t0 = time.monotonic()
    (m,) = to_batch([end(counts=counts)], producer="s").transactions or []
    assert time.monotonic() - t0 < 2.0
    assert m.eventCount == 10_000 and len(m.tables or {}) == 10_000


@pytest.mark.parametrize("capture", sorted(p.name for p in REAL.glob("*.json")))
def test_real_posts_give_whole_transactions(capture: str) -> None:
    """Each END's per-table counts are the events that carry its transaction, BEGIN and END pair
    up, and the order (an order, its two lines, a stock update) is one transaction. Debezium 3.6's
    PostgreSQL ids differ record by record (``<txId>:<own LSN>``): keyed by the full id, no END
    would match its events."""
    posts = json.loads((REAL / capture).read_text())
    keys = {"order_lines": ["order_id", "line_no"], "*": ["id"]}
    batches = [to_batch(p, producer="txs", key_columns=keys) for p in posts]
    events_of: dict[str, Counter[str]] = {}
    for b in batches:
        for ev in b.events:
            if ev.transaction is not None:
                events_of.setdefault(ev.transaction.id, Counter())[ev.table] += 1
    markers = [m for b in batches for m in b.transactions or []]
    ends = {m.id: m for m in markers if m.status == "END"}
    assert len(ends) == 4 and {m.id for m in markers if m.status == "BEGIN"} == set(ends)
    assert {tx: dict(c) for tx, c in events_of.items()} == {tx: m.tables for tx, m in ends.items()}
    assert {"orders": 1, "order_lines": 2, "stock": 1} in [m.tables for m in ends.values()]
    assert all(m.position for m in markers)
