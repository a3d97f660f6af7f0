"""What Debezium Server's HTTP sink gets from the receiver for what it really sends (issue 14):
a redelivery after a crash, and the only bearer header it can send. The real server runs in
tests/e2e/test_debezium_server.py; these pin each answer on its own, in milliseconds."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from starlette.testclient import TestClient

from cdclake import staging
from receiver.app import create_app
from tests.support import make_settings


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


def tenant_row(tenant: str, row: int, lsn: int) -> dict[str, Any]:
    change = pg_change(row, lsn, 1)
    change["source"]["table"] = "Tenant_Users"
    change["after"] = {"tenant": tenant, "id": row, "name": f"{tenant}-{row}"}
    return change


def test_composite_keys_from_the_table_config_keep_rows_apart(tmp_path: Path) -> None:
    """F3: ('acme', 1) and ('globex', 1) share ``id``: with the default key they were one row
    (the second dropped as a duplicate in one post); the table config's ``key`` keeps them two.
    A table keyed on other columns lands instead of 400 "key column 'id' missing"."""
    config = tmp_path / "tables.toml"
    config.write_text(
        '[tables.tenant_users]\nkey = ["tenant", "id"]\n[tables.order_lines]\nkey = ["order_id", "line_no"]\n'
    )
    line = pg_change(0, 2000, 1)
    line["source"]["table"] = "order_lines"
    line["after"] = {"order_id": 7, "line_no": 2, "qty": 3}
    post = [tenant_row("acme", 1, 1000), tenant_row("globex", 1, 1008), line]
    with TestClient(create_app(make_settings(tmp_path, table_config=config))) as c:
        r = c.post("/v1/debezium", json=post)
    with TestClient(create_app(make_settings(tmp_path / "default"))) as c:
        default = c.post("/v1/debezium", json=post)
    assert r.status_code == 200, r.text
    assert default.status_code == 400 and "key column 'id' missing" in default.json()["errorMessage"]
    store = staging.LocalStaging(make_settings(tmp_path).staging_dir)
    row_ids = {
        t: sorted(json.loads(ln)["rowId"] for k in store.list(t) for ln in store.get(k).splitlines())
        for t in store.tables()
    }
    assert row_ids == {"tenant_users": ['["acme",1]', '["globex",1]'], "order_lines": ["[7,2]"]}


def test_debezium_posts_have_their_own_body_limit(tmp_path: Path) -> None:
    """F7: the sink sends ``batch.max-size`` events per request whatever their size (200 rows of
    a 40 kB text: 8 MB) and gives up on a 413. /v1/debezium takes CDCLAKE_MAX_DEBEZIUM_BODY_BYTES
    (32 MiB by default) while our own batches keep CDCLAKE_MAX_BODY_BYTES (4 MiB)."""
    big = []
    for i in range(200):
        change = pg_change(i, 1000 + 8 * i, 1)
        change["after"]["body"] = f"{i:040d}" * 1000  # 40 kB
        big.append(change)
    body = json.dumps(big).encode()
    assert 8_000_000 < len(body) < 32 * 1024 * 1024
    with TestClient(create_app(make_settings(tmp_path))) as c:
        ok = c.post("/v1/debezium", content=body)
    with TestClient(create_app(make_settings(tmp_path / "small", max_debezium_body_bytes=len(body) - 1))) as c:
        refused = c.post("/v1/debezium", content=body)
    assert ok.status_code == 200 and ok.json()["details"]["eventsProcessed"] == 200, ok.text[:300]
    assert refused.status_code == 413
    assert "CDCLAKE_MAX_DEBEZIUM_BODY_BYTES" in refused.json()["errorMessage"]
