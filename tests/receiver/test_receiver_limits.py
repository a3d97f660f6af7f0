"""Issue 13, findings 3 and 5 (bounded state): one producer cannot fan out into unbounded tables,
fill the backlog for everyone, or grow the receiver's per-source state by rotating source ids.

Limits are set through the environment, as an operator sets them."""

from __future__ import annotations

import json
import os
from pathlib import Path

from starlette.testclient import TestClient

from cdclake import staging
from receiver.app import create_app
from tests.support.receiver import batch, env_settings


def staged_objects(home: Path) -> list[staging.ObjectKey]:
    store = staging.LocalStaging(home / "staging")
    return [k for t in store.tables() for k in store.list(t)]


def test_a_batch_naming_more_tables_than_the_limit_is_refused_at_the_first_table_past_it(tmp_path: Path) -> None:
    # 101 distinct tables (the default limit is 100), each named twice: the 101st distinct
    # table first appears at event 200.
    tables = [f"t{i:03d}" for i in range(101) for _ in range(2)]
    with TestClient(create_app(env_settings(tmp_path, rate_limit_per_s=0))) as c:
        r = c.post("/v1/batches", json=batch("app", 1, tables))
        ok = c.post("/v1/batches", json=batch("app", 1, tables[:200]))
    assert r.status_code == 400, r.text
    body = r.json()
    assert body["reason"] == "invalid_format" and body["field"] == "$.events[200].table"
    assert "CDCLAKE_MAX_TABLES_PER_BATCH" in body["errorMessage"] and "100" in body["errorMessage"]
    assert ok.status_code == 200 and ok.json()["status"] == "persisted"
    assert len(staged_objects(tmp_path)) == 100


def test_fan_out_into_new_tables_is_capped_per_producer_and_others_keep_landing(tmp_path: Path) -> None:
    # Finding 3 at a bounded scale: ten batches of 200 events for 200 new tables each.
    limits = dict(
        rate_limit_per_s=0,
        max_tables_per_batch=200,
        max_new_tables_per_source=300,
        backlog_soft=1000,
        backlog_hard=2000,
    )
    with TestClient(create_app(env_settings(tmp_path, **limits))) as c:
        fan = [c.post("/v1/batches", json=batch("fan", n, [f"f{n}_{j}" for j in range(200)])) for n in range(1, 11)]
        legit = [c.post("/v1/batches", json=batch("legit", n, ["orders"])) for n in range(1, 21)]
    assert [r.status_code for r in legit] == [200] * 20, legit[-1].text
    assert fan[0].status_code == 200
    refused = fan[1].json()
    assert fan[1].status_code == 429 and refused["reason"] == "rate_limited" and refused["shouldRetry"] is True
    assert "CDCLAKE_MAX_NEW_TABLES_PER_SOURCE" in refused["errorMessage"]
    assert int(fan[1].headers["Retry-After"]) >= 1 and refused["retryDelayMs"] > 0
    assert [r.status_code for r in fan[1:]] == [429] * 9
    assert len({k.table for k in staged_objects(tmp_path)}) == 201


def test_known_tables_survive_a_restart_and_are_not_new_again(tmp_path: Path) -> None:
    s = env_settings(tmp_path, rate_limit_per_s=0, max_new_tables_per_source=100)
    known = [f"k{j}" for j in range(100)]
    with TestClient(create_app(s)) as c:
        assert c.post("/v1/batches", json=batch("app", 1, known)).status_code == 200
    # A restarted receiver starts with a fresh hourly budget, but the tables that exist are not
    # new: they cost nothing from it.
    with TestClient(create_app(s)) as c:
        again = c.post("/v1/batches", json=batch("app", 2, known))
        fresh = c.post("/v1/batches", json=batch("app", 3, [f"n{j}" for j in range(100)]))
        more = c.post("/v1/batches", json=batch("app", 4, ["n_more"]))
    assert again.status_code == 200 and fresh.status_code == 200, (again.text, fresh.text)
    assert more.status_code == 429 and "CDCLAKE_MAX_NEW_TABLES_PER_SOURCE" in more.json()["errorMessage"]


def test_the_lake_wide_table_cap_names_the_first_table_past_it(tmp_path: Path) -> None:
    s = env_settings(tmp_path, rate_limit_per_s=0, max_tables=150)
    with TestClient(create_app(s)) as c:
        a = c.post("/v1/batches", json=batch("a", 1, [f"a{j}" for j in range(100)]))
        b = c.post("/v1/batches", json=batch("b", 1, ["a0"] + [f"b{j}" for j in range(99)]))
        old = c.post("/v1/batches", json=batch("b", 1, [f"a{j}" for j in range(100)]))
    assert a.status_code == 200
    # Capacity, not the batch's format: buffer_full, retried (issue 28).
    assert b.status_code == 503 and b.json()["reason"] == "buffer_full" and b.json()["shouldRetry"], b.text
    # a0 exists; b0..b49 fit (150 tables); b50, at event 51, is the first past the cap.
    assert b.json()["field"] == "$.events[51].table" and "CDCLAKE_MAX_TABLES" in b.json()["errorMessage"]
    assert old.status_code == 200
    assert len({k.table for k in staged_objects(tmp_path)}) == 100


def test_a_producer_over_its_backlog_quota_gets_buffer_full_while_another_keeps_landing(tmp_path: Path) -> None:
    s = env_settings(tmp_path, rate_limit_per_s=0, backlog_soft=1000, backlog_hard=2000, backlog_per_source=500)
    tables = [f"h{j}" for j in range(100)]
    with TestClient(create_app(s)) as c:
        hog = [c.post("/v1/batches", json=batch("hog", n, tables)) for n in range(1, 21)]
        other = [c.post("/v1/batches", json=batch("other", n, ["orders"])) for n in range(1, 21)]
    assert [r.status_code for r in other] == [200] * 20, other[-1].text
    assert [r.status_code for r in hog[:5]] == [200] * 5
    full = hog[5].json()
    assert hog[5].status_code == 503 and full["reason"] == "buffer_full" and full["shouldRetry"] is True
    assert full["retryDelayMs"] > 0 and int(hog[5].headers["Retry-After"]) >= 1
    assert "CDCLAKE_BACKLOG_PER_SOURCE" in full["errorMessage"] and "'hog'" in full["errorMessage"]
    assert {r.status_code for r in hog[5:]} == {503}
    per_source: dict[str, int] = {}
    for k in staged_objects(tmp_path):
        per_source[k.source] = per_source.get(k.source, 0) + 1
    assert per_source == {"hog": 500, "other": 20}


def test_rotating_source_ids_does_not_grow_per_source_state_past_the_bound(tmp_path: Path) -> None:
    cap = 20
    s = env_settings(tmp_path, max_sources=cap)  # the token bucket is on (seed defaults)
    app = create_app(s)
    with TestClient(app) as c:
        svc = app.state.service
        answers = [c.post("/v1/batches", json=batch(f"rot-{i}", 1, ["t"])) for i in range(cap)]
        locks = len(svc.lander._locks)
        answers += [c.post("/v1/batches", json=batch(f"rot-{i}", 1, ["t"])) for i in range(cap, 3 * cap)]
        with c.websocket_connect("/v1/stream") as ws:
            for i in range(3 * cap):
                ws.send_json({"type": "connect", "sourceDoId": f"ws-{i}"})
                ws.receive_json()
        sizes = {
            "rate buckets": len(svc.limiter._buckets),
            "in flight": len(svc._per_source),
            "websocket": len(svc.ws_connections),
            "sequence cache": len(svc.lander._last),
        }
        assert len(svc.lander._locks) == locks
    assert [a.status_code for a in answers[:cap]] == [200] * cap
    late = answers[cap].json()
    assert answers[cap].status_code == 429 and late["reason"] == "rate_limited"
    assert "CDCLAKE_MAX_SOURCES" in late["errorMessage"] and int(answers[cap].headers["Retry-After"]) >= 1
    assert all(size <= cap for size in sizes.values()), sizes
    assert len(os.listdir(tmp_path / "staging" / staging.RECEIPTS)) == cap


def test_idle_sources_are_forgotten_with_their_state_and_busy_ones_are_kept() -> None:
    from receiver.sources import Sources

    now = [0.0]
    busy = {"ws"}
    forgotten: list[str] = []
    reg = Sources(2, busy.__contains__, forgotten.append, idle_s=3600, clock=lambda: now[0])
    assert reg.touch("ws", enforce=True) == 0.0
    now[0] = 1000
    assert reg.touch("a", enforce=True) == 0.0
    assert reg.touch("b", enforce=True) == 2600  # full: "ws" (oldest) is idle in 2600 s
    assert reg.touch("a", enforce=True) == 0.0 and reg.touch("b", enforce=False) == 0.0  # with tokens: no cap
    now[0] = 3600
    reg.sweep()
    assert forgotten == [] and "ws" in reg  # a connection is open: still active
    now[0] = 4600
    assert reg.touch("c", enforce=True) == 0.0  # a and b idle for an hour: forgotten
    assert sorted(forgotten) == ["a", "b"] and "ws" in reg and len(reg) == 2


def test_forgetting_an_idle_source_drops_every_piece_of_its_state(tmp_path: Path) -> None:
    s = env_settings(tmp_path, rate_limit_burst=2, rate_limit_per_s=1, max_new_tables_per_source=1)
    app = create_app(s)
    with TestClient(app) as c:
        svc = app.state.service
        assert c.post("/v1/batches", json=batch("gone", 1, ["t1"])).status_code == 200
        assert "gone" in svc.lander._last and "gone" in svc.limiter._buckets
        assert "gone" in svc.new_tables.limiter._buckets
        svc.sources.idle_s = 0.0  # an hour passes
        svc.sources.sweep()
        assert "gone" not in svc.sources
        assert "gone" not in svc.lander._last and "gone" not in svc.limiter._buckets
        assert "gone" not in svc.new_tables.limiter._buckets and "gone" not in svc._per_source
        # It comes back: its numbering is read from its receipts again.
        assert c.post("/v1/batches", json=batch("gone", 3, ["t1"])).json()["expectedSequence"] == 2
        assert c.post("/v1/batches", json=batch("gone", 2, ["t1"])).status_code == 200


def test_a_number_spark_cannot_read_is_refused_naming_it_and_a_long_digit_string_is_not(tmp_path: Path) -> None:
    """Spark reads at most 1,000 characters per number: a staged line with a longer one could be
    neither typed nor read by the apply, so the door refuses the batch (nothing lands)."""
    long = batch("app", 1, ["t", "t"])
    long["events"][1]["after"] = {"id": 1, "deep": {"list": [1, -(10**999)]}}
    text = batch("app", 1, ["t"])
    text["events"][0]["after"] = {"id": 1, "digits": "7" * 2000, "n": 10**998}
    with TestClient(create_app(env_settings(tmp_path, rate_limit_per_s=0))) as c:
        r = c.post("/v1/batches", content=json.dumps(long), headers={"Content-Type": "application/json"})
        assert staged_objects(tmp_path) == []
        ok = c.post("/v1/batches", content=json.dumps(text), headers={"Content-Type": "application/json"})
    assert r.status_code == 400, r.text
    body = r.json()
    assert (body["reason"], body["field"]) == ("invalid_format", "$.events[1].after.deep.list[1]")
    assert "999 digits" in body["errorMessage"]
    assert ok.status_code == 200 and ok.json()["status"] == "persisted"
    assert len(staged_objects(tmp_path)) == 1
