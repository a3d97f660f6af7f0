"""Issue 28, item 4: CDCLAKE_MAX_TABLES counts tables that exist (an Iceberg table, or staging
objects waiting to become one) and landings in flight, not names: source ids a client rotates
through, with batches refused after their claim, or folders whose objects are gone, use up no
slot. A batch past the cap is refused as capacity (503 buffer_full, retried), not as a bad format.

No tokens (loopback), as the audit ran it; limits set through the environment."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from starlette.testclient import TestClient

from receiver.app import create_app
from tests.support.receiver import batch, env_settings

REFRESH_WAIT_S = 30.0  # the receiver lists staging every 5 s; a deadline, not a sleep


def unreadable(batch_: dict[str, Any]) -> str:
    """The batch with a number Spark cannot read: refused at staging, after its tables' claim."""
    return json.dumps(batch_).replace('"id": 0', '"id": ' + "9" * 1000, 1)


def test_rotating_source_ids_whose_batches_never_land_use_up_no_table_slot(tmp_path: Path) -> None:
    # The catalog cannot be read (a receiver deployed before the catalog): the lake's tables are
    # what staging holds.
    s = env_settings(tmp_path, rate_limit_per_s=0, max_tables=3, catalog_url=f"sqlite:///{tmp_path}/no/catalog.db")
    with TestClient(create_app(s)) as c:
        for i in range(10):
            body = unreadable(batch(f"rot-{i}", 1, [f"ghost{i}"]))
            r = c.post("/v1/batches", content=body, headers={"Content-Type": "application/json"})
            assert r.status_code == 400 and r.json()["reason"] == "invalid_format", r.text
        real = [c.post("/v1/batches", json=batch(f"real-{i}", 1, [f"t{i}"])) for i in range(3)]
        assert [r.status_code for r in real] == [200] * 3, real[-1].text
        full = c.post("/v1/batches", json=batch("late", 1, ["t3"]))
    assert full.status_code == 503, full.text
    nack = full.json()
    assert (nack["reason"], nack["shouldRetry"], nack["field"]) == ("buffer_full", True, "$.events[0].table")
    assert "CDCLAKE_MAX_TABLES" in nack["errorMessage"] and "'t3'" in nack["errorMessage"]
    assert int(full.headers["Retry-After"]) >= 1
    staged = sorted(p.name for p in (tmp_path / "staging").iterdir() if not p.name.startswith("."))
    assert staged == ["t0", "t1", "t2"]


def test_a_staging_folder_without_objects_holds_no_table_slot(tmp_path: Path) -> None:
    """A local store keeps a table's folders after its objects go (an operator removed a table's
    bad data before any apply): nothing exists, nothing counts."""
    for name in ("gone1", "gone2"):
        (tmp_path / "staging" / name / "2026-03-01" / "12").mkdir(parents=True)
    s = env_settings(tmp_path, rate_limit_per_s=0, max_tables=2)
    deadline = time.monotonic() + REFRESH_WAIT_S
    with TestClient(create_app(s)) as c:
        for seq, table in enumerate(["orders", "customers"], start=1):
            while True:  # as a producer retries buffer_full, until the listing has been made
                r = c.post("/v1/batches", json=batch("app", seq, [table]))
                if r.status_code != 503:
                    break
                assert time.monotonic() < deadline, f"{table}: still refused: {r.text}"
                time.sleep(0.2)
            assert r.status_code == 200, r.text
        third = c.post("/v1/batches", json=batch("app", 3, ["third"]))
    assert third.status_code == 503 and "the lake has 2 tables" in third.json()["errorMessage"], third.text
