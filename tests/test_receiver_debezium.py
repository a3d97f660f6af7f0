"""What Debezium Server's HTTP sink gets from the receiver for what it really sends (issue 14):
a redelivery after a crash, and the only bearer header it can send. The real server runs in
tests/test_debezium_server.py; these pin each answer on its own, in milliseconds."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from starlette.testclient import TestClient

from cdclake import staging
from receiver.app import create_app
from tests.conftest import make_settings


def pg_change(row: int, lsn: int, ts_ms: int) -> dict[str, Any]:
    """A flattened Postgres change as Debezium 3.x writes it (``ts_ms`` is processing time)."""
    return {
        "before": None,
        "after": {"id": row, "v": f"row {row}"},
        "source": {
            "connector": "postgresql",
            "name": "shop",
            "ts_ms": 1_767_225_600_000,
            "table": "users",
            "lsn": lsn,
            "sequence": json.dumps([str(lsn - 8), str(lsn)]),
        },
        "op": "c",
        "ts_ms": ts_ms,
    }


def test_a_redelivery_with_new_processing_times_is_a_duplicate_not_a_wedge(tmp_path: Path) -> None:
    """F2: after a SIGKILL the restarted Debezium re-sends the same changes (same LSNs) stamped
    with a new ``ts_ms``. The receiver answered 409 "already landed with different events" on
    every retry, forever. Same changes -> same batch -> duplicate; nothing lands twice."""
    first = [pg_change(i, 1000 + 8 * i, 1_767_225_601_000 + i) for i in range(5)]
    again = [pg_change(i, 1000 + 8 * i, 1_767_225_999_000 + i) for i in range(5)]
    settings = make_settings(tmp_path)
    with TestClient(create_app(settings)) as c:
        r1 = c.post("/v1/debezium", json=first)
        r2 = c.post("/v1/debezium", json=again)
    assert r1.status_code == 200 and r1.json()["status"] == "persisted", r1.text
    assert r2.status_code == 200, r2.text
    assert r2.json()["status"] == "duplicate"
    store = staging.LocalStaging(settings.staging_dir)
    keys = [k for t in store.tables() for k in store.list(t)]
    assert len(keys) == 1 and len(store.get(keys[0]).splitlines()) == 5, keys


def test_our_own_batch_reusing_a_number_with_other_events_is_still_refused(tmp_path: Path) -> None:
    """The identity rule is Debezium's only: a producer numbering its own batches that reuses a
    number for other events still gets 409 (its numbering is broken; landing it would lose one)."""

    def batch(v: str) -> dict[str, Any]:
        ev = {"sequence": 1, "timestamp": 1, "operation": "INSERT", "table": "t", "rowId": "1", "after": {"v": v}}
        return {"source": "app", "sequenceNumber": 1, "events": [ev]}

    with TestClient(create_app(make_settings(tmp_path))) as c:
        assert c.post("/v1/batches", json=batch("a")).status_code == 200
        assert c.post("/v1/batches", json=batch("a")).json()["status"] == "duplicate"
        r = c.post("/v1/batches", json=batch("b"))
    assert r.status_code == 409 and "different events" in r.json()["errorMessage"]


def test_debezium_servers_json_quoted_bearer_header_is_accepted(tmp_path: Path) -> None:
    """F8: the sink sends a static header only through a record header, which arrives as a JSON
    string (``"Bearer t"``, quotes included); it was 401 and Debezium stopped."""
    tokens = tmp_path / "tokens.toml"
    tokens.write_text('[[producer]]\nid = "shop"\ntoken = "tok-shop"\n')
    body = [pg_change(1, 1000, 1)]
    with TestClient(create_app(make_settings(tmp_path, tokens_file=tokens))) as c:
        quoted = c.post("/v1/debezium", json=body, headers={"Authorization": '"Bearer tok-shop"'})
        plain = c.post("/v1/debezium", json=[pg_change(2, 1008, 1)], headers={"Authorization": "Bearer tok-shop"})
        wrong = c.post("/v1/debezium", json=[pg_change(3, 1016, 1)], headers={"Authorization": '"Bearer nope"'})
        broken = c.post("/v1/debezium", json=[pg_change(3, 1016, 1)], headers={"Authorization": '"Bearer tok-shop'})
        not_text = c.post("/v1/debezium", json=[pg_change(3, 1016, 1)], headers={"Authorization": '"1"'})
    assert quoted.status_code == 200, quoted.text
    assert plain.status_code == 200, plain.text
    assert (wrong.status_code, broken.status_code, not_text.status_code) == (401, 401, 401)
