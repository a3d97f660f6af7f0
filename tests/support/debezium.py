"""Debezium change events for the tests, shaped like the Postgres connector's."""

from __future__ import annotations

import json
from typing import Any

Json = dict[str, Any]

# ------------------------------------------------------------------------------ fixtures
# Shaped like the Postgres connector's events in Debezium's documentation (2.x): the value
# converter's envelope {"schema", "payload"}, source block with "sequence" = [last commit LSN, LSN].

ENVELOPE_SCHEMA: Json = {
    "type": "struct",
    "fields": [
        {"type": "struct", "fields": [{"type": "int32", "optional": False, "field": "id"}], "field": "before"},
        {"type": "struct", "fields": [{"type": "int32", "optional": False, "field": "id"}], "field": "after"},
        {"type": "struct", "fields": [], "optional": False, "name": "io.debezium.connector.postgresql.Source"},
        {"type": "string", "optional": False, "field": "op"},
        {"type": "int64", "optional": True, "field": "ts_ms"},
    ],
    "optional": False,
    "name": "PostgreSQL_server.inventory.customers.Envelope",
    "version": 1,
}


def pg_source(
    lsn: int,
    commit: int | None,
    table: str = "customers",
    tx: int = 555,
    snapshot: str = "false",
    ts: int = 1559033904863,
) -> Json:
    return {
        "version": "2.7.3.Final",
        "connector": "postgresql",
        "name": "PostgreSQL_server",
        "ts_ms": ts,
        "snapshot": snapshot,
        "db": "postgres",
        "sequence": json.dumps([None if commit is None else str(commit), str(lsn)]),
        "schema": "inventory",
        "table": table,
        "txId": tx,
        "lsn": lsn,
        "xmin": None,
    }


def pg_payload(
    op: str, before: Json | None, after: Json | None, lsn: int = 24023128, commit: int | None = 24023119, **src: Any
) -> Json:
    return {
        "before": before,
        "after": after,
        "source": pg_source(lsn, commit, **src),
        "transaction": None,
        "op": op,
        "ts_ms": 1559033904900,
    }


ANNE = {"id": 1, "first_name": "Anne", "last_name": "Kretchmar", "email": "annek@noanswer.org", "bio": "long text"}
