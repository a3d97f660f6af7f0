"""A TRUNCATE in the batch contract (issue 29, item 5): the native API takes ``"operation":
"TRUNCATE"`` without row images, and Debezium's op ``t`` becomes one. The Debezium payloads are
the ones Debezium Server 3.6.0.Final posted for ``TRUNCATE t`` (captured from PostgreSQL 15
pgoutput and MariaDB 10.11 with ``skipped.operations=none``; the Connect schema left out)."""

from __future__ import annotations

from typing import Any

import pytest

from cdclake.contracts import events
from cdclake.debezium import envelope as debezium

PG_T = {
    "before": None,
    "after": None,
    "source": {
        "version": "3.6.0.Final",
        "connector": "postgresql",
        "name": "probe_pg",
        "ts_ms": 1795843502113,
        "snapshot": "false",
        "db": "probe",
        "sequence": '["35015520","35018416"]',
        "schema": "public",
        "table": "t",
        "txId": 736,
        "lsn": 35018416,
        "xmin": None,
    },
    "transaction": None,
    "op": "t",
    "ts_ms": 1795843502441,
}
MARIA_T = {
    "before": None,
    "after": None,
    "source": {
        "version": "3.6.0.Final",
        "connector": "mariadb",
        "name": "probe_maria",
        "ts_ms": 1795843600000,
        "snapshot": "false",
        "db": "probe",
        "table": "t",
        "server_id": 1,
        "file": "binlog.000001",
        "pos": 1513,
        "row": 0,
    },
    "op": "t",
    "ts_ms": 1795843600100,
}


def native(**extra: Any) -> bytes:
    ev = {"sequence": 7, "timestamp": 1, "operation": "TRUNCATE", "table": "t", "rowId": "*", **extra}
    return events.encode({"source": "s", "sequenceNumber": 1, "events": [ev]})


def test_the_native_api_takes_a_truncate_without_rows() -> None:
    (ev,) = events.decode_batch(native()).events
    assert (ev.operation, ev.after, ev.before) == ("TRUNCATE", None, None)
    for field, value in (("after", {"id": 1}), ("before", {"id": 1}), ("columnTypes", {"id": "int"})):
        with pytest.raises(events.InvalidBatch) as exc:
            events.decode_batch(native(**{field: value}))
        assert exc.value.field == f"$.events[0].{field}" and "TRUNCATE has no row" in exc.value.message


@pytest.mark.parametrize(("payload", "order"), [(PG_T, [35015520, 35018416]), (MARIA_T, [1, 1513, 0])])
def test_debezium_op_t_is_a_truncate_at_its_position(payload: dict[str, Any], order: list[int]) -> None:
    batch = debezium.to_batch([payload, {**payload, "source": {**payload["source"]}}])  # redelivered: one event
    ev = batch.events[0]
    assert (ev.operation, ev.table, ev.rowId, ev.before, ev.after, ev.order) == (
        "TRUNCATE",
        "t",
        "*",
        None,
        None,
        order,
    )
    assert batch.events[1].sequence == ev.sequence
    assert ev.metadata is not None and ev.metadata["op"] == "t"
    staged = events.stage_lines(events.decode_batch(events.encode(batch)))
    assert list(staged) == ["t"]


def test_a_mariadb_truncate_is_in_no_transaction_a_postgresql_one_is_in_its_own() -> None:
    """MySQL/MariaDB commit a TRUNCATE by itself (DDL): no END counts it, so a transaction block
    on it would hold the transaction it names forever (tests/e2e/test_debezium_types.py found
    it: the TRUNCATE and the insert after it never became visible). PostgreSQL's is transactional."""
    block = {"id": "0-1-42", "total_order": 1, "data_collection_order": 1}
    maria = debezium.to_batch([{**MARIA_T, "transaction": block}]).events[0]
    pg = debezium.to_batch([{**PG_T, "transaction": {**block, "id": "771:35015520"}}]).events[0]
    assert maria.transaction is None
    assert pg.transaction is not None and pg.transaction.id == "771"
