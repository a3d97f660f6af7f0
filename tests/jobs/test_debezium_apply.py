"""Debezium Postgres change events through the receiver into Iceberg: commit order (not LSN
order) decides, a primary-key change moves the row, TOASTed placeholders keep the stored
value, redelivery changes nothing. Compared with the reference model and with hand-written
expectations."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest
from starlette.testclient import TestClient

from cdclake.config.settings import Settings
from cdclake.contracts.events import UNAVAILABLE, encode
from cdclake.debezium import envelope as debezium
from cdclake.dev.reference import expected_tables
from receiver.app import create_app
from tests.support import apply_all, table_rows

pytestmark = pytest.mark.spark


def change(
    op: str, row: dict[str, Any] | None, before: dict[str, Any] | None, commit_lsn: int, lsn: int, tx: int
) -> dict[str, Any]:
    return {
        "schema": {"type": "struct", "optional": False, "name": "pg.public.accounts.Envelope"},
        "payload": {
            "before": before,
            "after": row,
            "source": {
                "version": "2.7.0.Final",
                "connector": "postgresql",
                "name": "pg",
                "ts_ms": 1_767_225_600_000 + lsn,
                "snapshot": "false",
                "db": "shop",
                "schema": "public",
                "table": "accounts",
                "txId": tx,
                "lsn": lsn,
                "sequence": json.dumps([str(commit_lsn), str(lsn)]),
            },
            "op": op,
            "ts_ms": 1_767_225_600_000 + lsn,
            "transaction": {"id": f"{tx}:{lsn}", "total_order": 1, "data_collection_order": 1},
        },
    }


def posts() -> list[Sequence[dict[str, Any] | None]]:
    """Two interleaved transactions: tx 501 writes at LSN 110 but commits AFTER tx 502 (LSN 120),
    so commit order says 501's value wins even though its LSN is lower."""
    snapshot = [
        {
            "schema": None,
            "payload": {
                "before": None,
                "after": {"id": i, "owner": f"o{i}", "notes": f"long text {i}"},
                "source": {
                    "connector": "postgresql",
                    "name": "pg",
                    "table": "accounts",
                    "ts_ms": 1,
                    "lsn": 100,
                    "sequence": json.dumps([None, "100"]),
                },
                "op": "r",
                "ts_ms": 1_767_225_600_000,
            },
        }
        for i in (1, 2, 3)
    ]
    tx502 = [change("u", {"id": 1, "owner": "from-502", "notes": UNAVAILABLE}, {"id": 1}, 125, 120, 502)]
    tx501 = [
        change("u", {"id": 1, "owner": "from-501", "notes": UNAVAILABLE}, {"id": 1}, 130, 110, 501),
        # primary-key change: delete id 2, create id 20, same LSN
        change("d", None, {"id": 2}, 130, 115, 501),
        change("c", {"id": 20, "owner": "o2", "notes": "moved"}, None, 130, 115, 501),
        None,  # Debezium's tombstone after the delete
    ]
    late = [change("d", None, {"id": 3}, 140, 135, 503)]
    return [snapshot, tx502, tx501, late, tx501]  # the last one is Debezium redelivering


def test_debezium_postgres_end_to_end(spark: Any, settings: Settings) -> None:
    landed = []
    with TestClient(create_app(settings)) as c:
        statuses = []
        for body in posts():
            r = c.post("/v1/debezium", content=json.dumps(body))
            assert r.status_code == 200, r.text
            statuses.append(r.json()["status"])
            landed.append(json.loads(encode(debezium.to_batch(body))))
    assert statuses == ["persisted"] * 4 + ["duplicate"]
    apply_all(spark, settings)
    got = table_rows(spark, f"{settings.catalog_name}.{settings.namespace}.accounts")
    want = {
        "1": {"id": 1, "owner": "from-501", "notes": "long text 1"},  # commit order; TOAST kept
        "20": {"id": 20, "owner": "o2", "notes": "moved"},
    }
    assert got == want
    ref = expected_tables(landed)["accounts"]
    assert ref == want  # the independent model agrees
    order = spark.sql(
        f"SELECT _cdc_order FROM {settings.catalog_name}.{settings.namespace}.accounts WHERE id = 1"
    ).collect()[0][0]
    assert list(order) == [130, 110]
