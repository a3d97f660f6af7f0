"""Debezium JSON change events -> our batch contract (cdclake.debezium.envelope)."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdclake.contracts import events
from cdclake.contracts.events import UNAVAILABLE, InvalidBatch
from cdclake.debezium import envelope as debezium
from cdclake.debezium.envelope import looks_like_debezium, to_batch
from tests.support.debezium import ANNE, ENVELOPE_SCHEMA, Json, pg_payload, pg_source


def pg_create() -> Json:
    return {"schema": ENVELOPE_SCHEMA, "payload": pg_payload("c", None, dict(ANNE))}


def pg_update_toast() -> Json:
    """An update that did not touch the TOASTed ``bio``: Debezium cannot send its value."""
    after = {**ANNE, "email": "anne@example.com", "bio": UNAVAILABLE}
    return {"schema": ENVELOPE_SCHEMA, "payload": pg_payload("u", None, after, lsn=24023300, commit=24023200, tx=556)}


def pg_delete() -> Json:
    """REPLICA IDENTITY DEFAULT: ``before`` holds the key, other columns null; ``after`` null."""
    before = {"id": 1, "first_name": None, "last_name": None, "email": None, "bio": None}
    return {"schema": ENVELOPE_SCHEMA, "payload": pg_payload("d", before, None, lsn=24023400, commit=24023350, tx=557)}


def pg_snapshot(i: int) -> Json:
    row = {"id": 100 + i, "first_name": f"n{i}", "last_name": "x", "email": None, "bio": None}
    payload = pg_payload("r", None, row, lsn=22910168, commit=None, snapshot="true" if i else "first", tx=540)
    return {"schema": ENVELOPE_SCHEMA, "payload": payload}


def pg_flat(op: str = "c", row_id: int = 7, lsn: int = 24024000, commit: int = 24023999) -> Json:
    """value.converter.schemas.enable=false: the payload is the whole value."""
    after = None if op == "d" else {"id": row_id, "first_name": "Flat"}
    before = {"id": row_id} if op == "d" else None
    return pg_payload(op, before, after, lsn=lsn, commit=commit, tx=600)


def pk_change() -> list[Json | None]:
    """UPDATE customers SET id = 2 WHERE id = 1: a delete of key 1, a tombstone, a create of key 2,
    all at the same LSN."""
    before = {"id": 1, "first_name": None, "last_name": None, "email": None, "bio": None}
    after = {**ANNE, "id": 2}
    return [
        pg_payload("d", before, None, lsn=24025000, commit=24024900, tx=610),
        None,
        pg_payload("c", None, after, lsn=24025000, commit=24024900, tx=610),
    ]


def mysql_event(pos: int = 154, row: int = 0, file: str = "mysql-bin.000003") -> Json:
    return {
        "before": None,
        "after": {"id": 1004, "first_name": "Anne", "last_name": "Kretchmar", "email": "annek@noanswer.org"},
        "source": {
            "version": "2.7.3.Final",
            "connector": "mysql",
            "name": "mysql-server-1",
            "ts_ms": 1465491411000,
            "snapshot": "false",
            "db": "inventory",
            "sequence": None,
            "table": "customers",
            "server_id": 223344,
            "gtid": None,
            "file": file,
            "pos": pos,
            "row": row,
            "thread": 7,
            "query": None,
        },
        "op": "c",
        "ts_ms": 1465491411815,
    }


def sqlserver_event(total_order: int | None = None, email: str = "a@b") -> Json:
    ev: Json = {
        "before": None,
        "after": {"id": 1005, "email": email},
        "source": {
            "version": "2.7.3.Final",
            "connector": "sqlserver",
            "name": "server1",
            "ts_ms": 1559729468470,
            "snapshot": "false",
            "db": "testDB",
            "schema": "dbo",
            "table": "customers",
            "change_lsn": "00000027:00000758:0003",
            "commit_lsn": "00000027:00000758:0005",
        },
        "op": "c",
        "ts_ms": 1559729471739,
    }
    if total_order is not None:
        ev["transaction"] = {"id": "00000027:00000758:0005", "total_order": total_order, "data_collection_order": 1}
    return ev


def valid(batch: events.Batch) -> events.Batch:
    """The batch passes our own wire validator unchanged."""
    again = events.decode_batch(events.encode(batch))
    assert again == batch
    return again


def ident(batch: events.Batch) -> list[tuple[str, int]]:
    return [(ev.rowId, ev.sequence) for ev in batch.events]


# ------------------------------------------------------------------------------ detection


@pytest.mark.parametrize(
    "obj",
    [
        pg_create(),
        pg_flat(),
        mysql_event(),
        [pg_create(), pg_flat()],
        [None, pg_flat()],
        [None],
        {"schema": None, "payload": None},
        {"schema": ENVELOPE_SCHEMA, "payload": {"after": {"id": 1}}},  # malformed, still Debezium
        {"op": "c"},
    ],
)
def test_looks_like_debezium(obj: Any) -> None:
    assert looks_like_debezium(obj)


@pytest.mark.parametrize(
    "obj",
    [
        {"source": "app-1", "sequenceNumber": 1, "events": [{"sequence": 1}]},
        {"source": "app-1", "sequenceNumber": 1, "events": []},
        {"source": {"table": "x"}, "events": [], "op": "c"},
        [{"source": "app-1", "sequenceNumber": 1, "events": []}],
        [],
        [1, 2],
        [pg_flat(), "x"],
        None,
        "payload",
        42,
        {},
        {"payload": 1},
        {"payload": {"x": 1}},
    ],
)
def test_does_not_look_like_debezium(obj: Any) -> None:
    assert not looks_like_debezium(obj)


# ------------------------------------------------------------------------------ mapping


def test_postgres_create_in_envelope() -> None:
    batch = valid(to_batch(pg_create()))
    assert batch.source == "PostgreSQL_server"
    [ev] = batch.events
    assert ev.operation == "INSERT"
    assert ev.table == "customers"
    assert ev.rowId == "1"
    assert ev.order == [24023119, 24023128]
    assert ev.timestamp == 1559033904900
    assert ev.before is None and ev.after == ANNE
    assert ev.metadata == {
        "connector": "postgresql",
        "db": "postgres",
        "schema": "inventory",
        "txId": 555,
        "lsn": 24023128,
        "op": "c",
    }
    assert 0 <= ev.sequence <= 2**63 - 1 and 0 <= batch.sequenceNumber <= 2**63 - 1


def test_update_keeps_the_unavailable_placeholder() -> None:
    [ev] = valid(to_batch(pg_update_toast())).events
    assert ev.operation == "UPDATE"
    assert ev.after is not None and ev.after["bio"] == UNAVAILABLE
    assert ev.order == [24023200, 24023300]
    line = json.loads(events.stage_lines(events.Batch("s", 1, [ev]))["customers"])
    assert line["after"]["bio"] == "__debezium_unavailable_value"


def test_binary_placeholder_is_left_as_is() -> None:
    ev = pg_update_toast()
    ev["payload"]["after"]["photo"] = "X19kZWJleml1bV91bmF2YWlsYWJsZV92YWx1ZQ=="  # base64 of the placeholder
    [out] = valid(to_batch(ev)).events
    assert out.after is not None and out.after["photo"] == "X19kZWJleml1bV91bmF2YWlsYWJsZV92YWx1ZQ=="


def test_delete_takes_the_key_from_before() -> None:
    [ev] = valid(to_batch(pg_delete())).events
    assert ev.operation == "DELETE"
    assert ev.rowId == "1"
    assert ev.after is None and ev.before is not None and ev.before["id"] == 1
    assert ev.metadata is not None and ev.metadata["op"] == "d"


def test_snapshot_reads_are_inserts_with_distinct_identities() -> None:
    batch = valid(to_batch([pg_snapshot(i) for i in range(50)]))
    assert {ev.operation for ev in batch.events} == {"INSERT"}
    assert {tuple(ev.order or ()) for ev in batch.events} == {(0, 22910168)}  # null commit LSN -> 0
    assert len({ev.sequence for ev in batch.events}) == 50
    assert [ev.metadata["op"] for ev in batch.events if ev.metadata] == ["r"] * 50


def test_snapshot_sorts_before_streamed_changes() -> None:
    snap = to_batch(pg_snapshot(1)).events[0]
    later = to_batch(pg_flat(row_id=101, lsn=22910200, commit=22910190)).events[0]
    assert (snap.order or []) < (later.order or [])


def test_primary_key_change_is_two_distinct_events() -> None:
    batch = valid(to_batch(pk_change()))
    old, new = batch.events
    assert (old.operation, old.rowId) == ("DELETE", "1")
    assert (new.operation, new.rowId) == ("INSERT", "2")
    assert old.order == new.order == [24024900, 24025000]
    assert old.sequence != new.sequence


def test_flattened_event() -> None:
    [ev] = valid(to_batch(pg_flat())).events
    assert (ev.operation, ev.table, ev.rowId, ev.order) == ("INSERT", "customers", "7", [24023999, 24024000])


def test_array_mixing_forms_and_tombstones() -> None:
    post = [pg_create(), None, pg_flat("u"), {"schema": None, "payload": None}, pg_delete(), None]
    batch = valid(to_batch(post))
    assert [(ev.operation, ev.rowId) for ev in batch.events] == [("INSERT", "1"), ("UPDATE", "7"), ("DELETE", "1")]
    assert set(events.stage_lines(batch)) == {"customers"}


@pytest.mark.parametrize("post", [None, [None], [None, {"schema": None, "payload": None}], []])
def test_only_tombstones_is_refused_distinctly(post: Any) -> None:
    with pytest.raises(debezium.OnlyTombstones) as err:
        to_batch(post)
    assert isinstance(err.value, InvalidBatch)
    assert (err.value.field, err.value.message) == ("$", "no change events (only tombstones)")


def test_transaction_block_gives_the_transaction_id() -> None:
    ev = pg_create()
    ev["payload"]["transaction"] = {"id": "571:53195832", "total_order": 1, "data_collection_order": 1}
    [out] = valid(to_batch(ev)).events
    assert out.metadata is not None and out.metadata["txId"] == "571:53195832"
    assert out.order == [24023119, 24023128]  # Postgres order comes from the log, not the transaction block


def test_mysql_order_is_binlog_file_position_row() -> None:
    batch = valid(to_batch([mysql_event(pos=154, row=0), mysql_event(pos=154, row=1), mysql_event(pos=900)]))
    assert batch.source == "mysql-server-1"
    assert [ev.order for ev in batch.events] == [[3, 154, 0], [3, 154, 1], [3, 900, 0]]
    assert batch.events[0].rowId == "1004"
    assert batch.events[0].metadata == {"connector": "mysql", "db": "inventory", "op": "c"}
    rotated = to_batch(mysql_event(pos=4, file="mysql-bin.000004")).events[0]
    assert (batch.events[2].order or []) < (rotated.order or [])


def test_mysql_without_position_falls_back_to_the_commit_time() -> None:
    ev = mysql_event()
    del ev["source"]["file"], ev["source"]["pos"]
    assert to_batch(ev).events[0].order == [1465491411000]


def test_other_connectors_order_by_source_time_then_transaction_position() -> None:
    assert to_batch(sqlserver_event()).events[0].order == [1559729468470]
    assert to_batch(sqlserver_event(total_order=3)).events[0].order == [1559729468470, 3]
    no_source_ts = sqlserver_event()
    del no_source_ts["source"]["ts_ms"]
    assert to_batch(no_source_ts).events[0].order == [1559729471739]
    assert to_batch(no_source_ts).events[0].timestamp == 1559729471739
    string_lsn = sqlserver_event()
    string_lsn["source"]["lsn"] = "00000027:00000758:0003"  # not Postgres: not ours to interpret
    assert valid(to_batch(string_lsn)).events[0].metadata == {
        "connector": "sqlserver",
        "db": "testDB",
        "schema": "dbo",
        "op": "c",
    }


def test_same_millisecond_changes_without_log_position_stay_distinct() -> None:
    a, b = to_batch([sqlserver_event(email="x@y"), sqlserver_event(email="z@y")]).events
    assert a.order == b.order and a.sequence != b.sequence


def test_timestamp_falls_back_to_source_ts_ms() -> None:
    ev = pg_create()
    del ev["payload"]["ts_ms"]
    assert to_batch(ev).events[0].timestamp == 1559033904863


# ------------------------------------------------------------------------------ ordering


def test_later_commit_with_lower_lsn_sorts_later() -> None:
    """Transaction A wrote at LSN 1000 but committed (at 3000) after transaction B, which wrote at
    LSN 2000 and committed at 2500. Debezium streams B then A; A's events carry B's commit LSN."""
    b_event = pg_flat("u", row_id=5, lsn=2000, commit=1500)
    a_event = pg_flat("u", row_id=5, lsn=1000, commit=2500)
    a, b = to_batch([a_event, b_event]).events
    assert a.metadata is not None and b.metadata is not None
    assert a.metadata["lsn"] < b.metadata["lsn"]
    assert (b.order or []) < (a.order or [])
    newest = max(to_batch([a_event, b_event]).events, key=lambda e: e.order or [])
    assert newest.order == [2500, 1000]


def test_events_of_one_transaction_sort_by_lsn() -> None:
    first, second = to_batch([pg_flat("u", lsn=300, commit=100), pg_flat("u", lsn=200, commit=100)]).events
    assert (second.order or []) < (first.order or [])


# ------------------------------------------------------------------------------ identity


def test_redelivery_maps_to_the_same_sequences_and_batch_number() -> None:
    post = [pg_create(), pg_update_toast(), None, pg_delete(), *pk_change(), mysql_event(), sqlserver_event()]
    one, two = to_batch(post, producer="p"), to_batch(copy.deepcopy(post), producer="p")
    assert ident(one) == ident(two)
    assert one.sequenceNumber == two.sequenceNumber
    assert one == two


def test_regrouped_post_gets_a_new_batch_number_but_the_same_event_identities() -> None:
    whole = to_batch([pg_create(), pg_update_toast()])
    first, second = to_batch(pg_create()), to_batch(pg_update_toast())
    assert len({whole.sequenceNumber, first.sequenceNumber, second.sequenceNumber}) == 3
    assert ident(whole) == ident(first) + ident(second)


def test_different_events_differ() -> None:
    seqs = {
        to_batch(e).events[0].sequence
        for e in [pg_create(), pg_update_toast(), pg_delete(), pg_flat(), pg_flat("u"), mysql_event(), pg_snapshot(0)]
    }
    assert len(seqs) == 7


# ------------------------------------------------------------------------------ keys and producer


def test_composite_key_is_a_json_array() -> None:
    ev = pg_flat()
    assert ev["after"] is not None
    ev["after"]["region"] = "eu"
    [out] = valid(to_batch(ev, key_columns=("id", "region"))).events
    assert out.rowId == '[7,"eu"]'
    delete = pg_flat("d")
    delete["before"]["region"] = "eu"
    assert to_batch(delete, key_columns=["id", "region"]).events[0].rowId == '[7,"eu"]'


def test_key_columns_per_table_and_string_keys() -> None:
    orders = pg_flat()
    orders["source"]["table"] = "orders"
    orders["after"] = {"order_no": "A-17", "id": 9}
    batch = to_batch([orders, pg_flat()], key_columns={"orders": ["order_no"]})
    assert [ev.rowId for ev in batch.events] == ["A-17", "7"]
    assert to_batch(pg_flat(), key_columns="first_name").events[0].rowId == "Flat"


def test_non_string_single_key_is_json() -> None:
    ev = pg_flat()
    ev["after"]["id"] = 1.5
    assert to_batch(ev).events[0].rowId == "1.5"
    ev["after"]["id"] = True
    assert to_batch(ev).events[0].rowId == "true"


def test_empty_key_columns_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="no key columns"):
        to_batch(pg_flat(), key_columns=())


def test_producer_argument_and_sanitised_source_name() -> None:
    ev = pg_flat()
    ev["source"]["name"] = "..my server/1"
    assert to_batch(ev).source == "my-server-1"
    assert to_batch(ev, producer="dbz-http").source == "dbz-http"
    assert to_batch([pg_create(), mysql_event()], producer="mixed").source == "mixed"


def test_mixed_source_names_need_a_producer() -> None:
    with pytest.raises(InvalidBatch) as err:
        to_batch([pg_create(), mysql_event()])
    assert err.value.field == "$[1].source.name"
    assert "producer=" in err.value.message


# ------------------------------------------------------------------------------ errors

Mutate = Callable[[Json], Any]


def _set(path: str, value: Any) -> Mutate:
    def mutate(ev: Json) -> None:
        *parents, last = path.split(".")
        node = ev
        for p in parents:
            node = node[p]
        node[last] = value

    return mutate


def _del(path: str) -> Mutate:
    def mutate(ev: Json) -> None:
        *parents, last = path.split(".")
        node = ev
        for p in parents:
            node = node[p]
        del node[last]

    return mutate


@pytest.mark.parametrize(
    ("make", "mutate", "field", "words"),
    [
        (pg_create, _del("payload.op"), "$.payload.op", "required"),
        (pg_create, _set("payload.op", "x"), "$.payload.op", "unknown op"),
        (pg_create, _set("payload.op", 1), "$.payload.op", "expected a string"),
        (pg_create, _set("payload.op", "m"), "$.payload.op", "unsupported: message"),
        (pg_create, _set("payload", [1]), "$.payload", "expected an object"),
        (pg_create, _set("payload.after", None), "$.payload.after", "required for op 'c'"),
        (pg_update_toast, _del("payload.after"), "$.payload.after", "required for op 'u'"),
        (pg_create, _set("payload.after", [1, 2]), "$.payload.after", "expected an object or null"),
        (pg_create, _set("payload.before", "x"), "$.payload.before", "expected an object or null"),
        (pg_delete, _set("payload.before", None), "$.payload.before", "required for op 'd'"),
        (pg_create, _del("payload.after.id"), "$.payload.after.id", "missing"),
        (pg_create, _set("payload.after.id", None), "$.payload.after.id", "is null"),
        (pg_create, _set("payload.after.id", UNAVAILABLE), "$.payload.after.id", "unavailable"),
        (pg_create, _set("payload.after.id", ""), "$.payload.after.id", "1..1024 characters"),
        (pg_create, _set("payload.after.id", "x" * 1025), "$.payload.after.id", "1..1024 characters"),
        (pg_delete, _del("payload.before.id"), "$.payload.before.id", "missing"),
        (pg_create, _set("payload.after.bad", 1 + 2j), "$.payload.after", "not encodable"),
        (pg_create, _del("payload.source"), "$.payload.source", "required"),
        (pg_create, _set("payload.source", "pg"), "$.payload.source", "expected an object"),
        (pg_create, _del("payload.source.table"), "$.payload.source.table", "required"),
        (pg_create, _set("payload.source.table", 3), "$.payload.source.table", "expected a string"),
        (pg_create, _set("payload.source.table", "my-table"), "$.payload.source.table", "must match"),
        (pg_create, _set("payload.source.table", "t__changes"), "$.payload.source.table", "reserved"),
        (pg_create, _del("payload.source.name"), "$.payload.source.name", "required"),
        (pg_create, _set("payload.source.name", 5), "$.payload.source.name", "expected a string"),
        (pg_create, _set("payload.source.name", "//"), "$.payload.source.name", "no usable producer id"),
        (pg_create, _set("payload.source.connector", 5), "$.payload.source.connector", "expected a string"),
        (pg_create, _set("payload.source.db", ["x"]), "$.payload.source.db", "expected a string"),
        (pg_create, _set("payload.source.sequence", 5), "$.payload.source.sequence", "JSON string"),
        (pg_create, _set("payload.source.sequence", "[1"), "$.payload.source.sequence", "not a JSON array"),
        (pg_create, _set("payload.source.sequence", '["1"]'), "$.payload.source.sequence", "2-element"),
        (pg_create, _set("payload.source.sequence", '["-1","2"]'), "$.payload.source.sequence", "decimal strings"),
        (pg_create, _set("payload.source.sequence", '["1","x"]'), "$.payload.source.sequence", "decimal strings"),
        (
            pg_create,
            _set("payload.source.sequence", json.dumps(["1", str(2**63)])),
            "$.payload.source.sequence",
            "2**63-1",
        ),
        (pg_create, _set("payload.source.lsn", -5), "$.payload.source.lsn", "2**63-1"),
        (pg_create, _set("payload.source.lsn", "24023128"), "$.payload.source.lsn", "expected an LSN"),
        (pg_create, _set("payload.ts_ms", -1), "$.payload.ts_ms", "2**63-1"),
        (pg_create, _set("payload.ts_ms", 1.5), "$.payload.ts_ms", "expected milliseconds"),
        (pg_create, _set("payload.ts_ms", True), "$.payload.ts_ms", "expected milliseconds"),
        (pg_create, _set("payload.ts_ms", 2**63), "$.payload.ts_ms", "2**63-1"),
        (
            lambda: {
                "payload": {**pg_create()["payload"], "ts_ms": None, "source": {**pg_source(1, 1), "ts_ms": None}}
            },
            lambda ev: None,
            "$.payload.ts_ms",
            "required",
        ),
        (pg_create, _set("payload.transaction", "tx"), "$.payload.transaction", "expected an object"),
        (pg_create, _set("payload.transaction", {"id": 1.5}), "$.payload.transaction.id", "string or integer"),
        (pg_create, _set("payload.source.txId", False), "$.payload.source.txId", "string or integer"),
        (mysql_event, _set("source.file", "binlog"), "$.source.file", "end in its index"),
        (mysql_event, _set("source.file", 3), "$.source.file", "binlog file name"),
        (mysql_event, _set("source.pos", -1), "$.source.pos", "2**63-1"),
        (mysql_event, _set("source.row", "0"), "$.source.row", "row number"),
        (sqlserver_event, _set("transaction", {"total_order": -1}), "$.transaction.total_order", "2**63-1"),
        (sqlserver_event, _set("source.ts_ms", "now"), "$.source.ts_ms", "milliseconds"),
    ],
)
def test_malformed_events_name_the_path(make: Callable[[], Json], mutate: Mutate, field: str, words: str) -> None:
    ev = make()
    mutate(ev)
    with pytest.raises(InvalidBatch) as err:
        to_batch(ev)
    assert err.value.field == field, err.value
    assert words in err.value.message, err.value


@pytest.mark.parametrize(
    ("post", "field", "words"),
    [
        ([pg_create(), 5], "$[1]", "expected a change event object or null"),
        ([pg_create(), None, {"payload": {**pg_create()["payload"], "op": "z"}}], "$[2].payload.op", "unknown op"),
        ([pg_create(), {**pg_flat(), "after": {"name": "no id"}}], "$[1].after.id", "missing"),
        ([pg_create(), {**pg_flat(), "after": {"weird key": 1}}], "$[1].after.id", "missing"),
        ("events", "$", "expected a Debezium change event"),
        (17, "$", "expected a Debezium change event"),
    ],
)
def test_malformed_posts_name_the_path(post: Any, field: str, words: str) -> None:
    with pytest.raises(InvalidBatch) as err:
        to_batch(post)
    assert (err.value.field, words in err.value.message) == (field, True), err.value


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (_set("payload.after.name", "\ud800"), "$.payload.after"),
        (_set("payload.after.id", "\ud800"), "$.payload.after"),
        (_set("payload.source.db", "\udfff"), "$.payload.source.db"),
        (_set("payload.source.connector", "pg\udfff"), "$.payload.source.connector"),
        (_set("payload.transaction", {"id": "\ud800"}), "$.payload.transaction.id"),
    ],
)
def test_text_that_is_not_unicode_is_refused(mutate: Mutate, field: str) -> None:
    """json.loads accepts lone surrogate escapes; they cannot be written back as UTF-8."""
    ev = pg_create()
    mutate(ev)
    with pytest.raises(InvalidBatch, match="not encodable") as err:
        to_batch(ev)
    assert err.value.field == field


def test_lone_surrogate_in_the_connector_name_is_sanitised_away() -> None:
    ev = pg_create()
    ev["payload"]["source"]["name"] = "pg\ud800"
    assert valid(to_batch(ev)).source == "pg-"


def test_path_of_an_odd_key_column_name_is_quoted() -> None:
    ev = pg_flat()
    with pytest.raises(InvalidBatch) as err:
        to_batch(ev, key_columns=["order id"])
    assert err.value.field == '$.after["order id"]'


def test_bad_producer_argument() -> None:
    with pytest.raises(InvalidBatch) as err:
        to_batch(pg_create(), producer="///")
    assert err.value.field == "$"


def test_too_many_events(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(events, "MAX_EVENTS_PER_BATCH", 3)
    assert len(to_batch([pg_snapshot(i) for i in range(3)]).events) == 3
    with pytest.raises(InvalidBatch, match="more than 3"):
        to_batch([pg_snapshot(i) for i in range(4)])


# ------------------------------------------------------------------------------ properties

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=12,
)


def _mostly(plausible: st.SearchStrategy[Any], rare: st.SearchStrategy[Any] = json_values) -> st.SearchStrategy[Any]:
    """``plausible`` mostly, else ``rare`` (by default any JSON at all). Hypothesis
    favours small integers, so the rare branch is the largest one."""
    return st.integers(0, 29).flatmap(lambda n: rare if n == 29 else plausible)


_lsn = st.one_of(st.none(), st.integers(-5, 2**64).map(str), st.just("x"))
_source = st.fixed_dictionaries(
    {
        "connector": _mostly(st.sampled_from(["postgresql", "mysql", "sqlserver", "mongodb"])),
        "name": _mostly(st.sampled_from(["pg-1", "my server", "..", "a" * 200])),
        "table": _mostly(st.sampled_from(["customers", "Orders", "bad-name", "x__changes"])),
        "ts_ms": _mostly(st.integers(0, 2**45), st.integers(-(2**64), 2**64)),
    },
    optional={
        "sequence": _mostly(st.tuples(_lsn, _lsn).map(lambda t: json.dumps(list(t)))),
        "lsn": _mostly(st.integers(-1, 2**64)),
        "file": _mostly(st.sampled_from(["mysql-bin.000003", "bin", "0" * 30])),
        "pos": _mostly(st.integers(-1, 2**64)),
        "row": _mostly(st.integers(-1, 3)),
        "schema": _mostly(st.just("public")),
        "db": _mostly(st.just("postgres")),
        "txId": _mostly(st.integers(0, 10)),
    },
)
_key = st.fixed_dictionaries({"id": st.integers(-(2**70), 2**70) | st.text(max_size=3)})
_columns = st.dictionaries(st.sampled_from(["name", "region", "bio"]), json_values | st.just(UNAVAILABLE), max_size=3)
_row = _mostly(
    _mostly(st.builds(lambda key, rest: {**key, **rest}, _key, _columns), _columns),
    st.none(),
)
_payload = st.fixed_dictionaries(
    {
        "op": _mostly(st.sampled_from(["c", "r", "u", "d", "t", "m", "x"])),
        "source": _mostly(_source),
        "before": _row,
        "after": _row,
    },
    optional={
        "ts_ms": _mostly(st.integers(0, 2**45), st.integers(-(2**64), 2**64)),
        "transaction": _mostly(
            st.fixed_dictionaries({"id": _mostly(st.text(max_size=5)), "total_order": st.integers(-1, 9)})
        ),
    },
)
_event = st.integers(0, 9).flatmap(
    lambda n: [_payload, _payload.map(lambda p: {"schema": None, "payload": p}), st.none(), json_values][
        0 if n < 5 else 1 if n < 8 else 2 if n == 8 else 3
    ]
)
_posts = st.one_of(_event, st.lists(_event, max_size=4), json_values)


def _check(post: Any) -> None:
    try:
        batch = to_batch(post)
    except InvalidBatch:
        return
    valid(batch)
    for ev in batch.events:
        assert ev.metadata is not None and ev.metadata["op"] in "cdrut"
        # a TRUNCATE carries no row image and the key of every row
        assert ev.operation != "TRUNCATE" or (ev.metadata["op"] == "t" and ev.before is None and ev.after is None)
    assert to_batch(copy.deepcopy(post)) == batch


@settings(max_examples=300, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_posts)
def test_structured_random_input_is_a_valid_batch_or_invalid(post: Any) -> None:
    _check(post)


@settings(max_examples=200, derandomize=True, deadline=None)
@given(json_values)
def test_arbitrary_json_is_a_valid_batch_or_invalid(post: Any) -> None:
    _check(post)


def test_structured_strategy_reaches_valid_batches() -> None:
    """Guard against a property test that only ever sees refusals."""
    ok = 0

    @settings(max_examples=300, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
    @given(_posts)
    def count(post: Any) -> None:
        nonlocal ok
        try:
            to_batch(post)
            ok += 1
        except InvalidBatch:
            pass

    count()
    assert ok >= 10
