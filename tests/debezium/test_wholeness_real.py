"""Posts a real Debezium Server 3.6 made (tests/support/debezium_transactions/: PostgreSQL and
MariaDB, with and without schemas), decoded by the adapter, landed by the receiver's lander in a
local store and judged by cdclake.lake.wholeness from the receipts and markers alone.

The capture is two posts: the snapshot's rows (no transaction), then one post with all four
transactions (an order with two lines and a stock update; an order; a stock update and an order;
a mark). The HTTP sink may cut its arrays anywhere, so the second post is also landed cut into
posts of three records: dropping one of those leaves a transaction without its END, or without
some of its events. The expectations are read off the capture (its ids, counts, positions)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cdclake import staging
from cdclake.debezium.envelope import to_batch
from cdclake.lake.wholeness import Verdict, landed
from receiver.landing import Lander
from receiver.prepared import Prepared

REAL = Path(__file__).resolve().parents[1] / "support" / "debezium_transactions"
KEYS = {"order_lines": ["order_id", "line_no"], "*": ["id"]}
CAPTURES = ["postgres_enveloped.json", "postgres_flattened.json", "mariadb_enveloped.json", "mariadb_flattened.json"]
# Per capture: the four transactions in commit order, each with its END position.
ENDS = {
    "postgres": [("738", "35043232"), ("739", "35043416"), ("740", "35043608"), ("741", "35043880")],
    "mariadb": [("0-1-9", "0-1-9"), ("0-1-10", "0-1-10"), ("0-1-11", "0-1-11"), ("0-1-12", "0-1-12")],
}


def land(root: Path, posts: list[list[Any]]) -> Verdict:
    """Each post as the receiver lands a Debezium post (batch number from its events' identities,
    no sequence check), then the verdict on what the store holds."""
    store = staging.LocalStaging(root)
    lander = Lander(store, None)
    for post in posts:
        p = Prepared.from_batch(to_batch(post, producer="txs", key_columns=KEYS), by_identity=True)
        assert lander.land(p, check_sequence=False).status == "persisted"
    found = landed(store, "txs")
    assert found.missing == []
    return found.verdict()


def cut(post: list[Any], size: int = 3) -> list[list[Any]]:
    return [post[i : i + size] for i in range(0, len(post), size)]


def every_object(root: Path) -> set[str]:
    store = staging.LocalStaging(root)
    return {k.path for t in store.tables() for k in store.list(t)}


@pytest.mark.parametrize("capture", CAPTURES)
@pytest.mark.parametrize("pieces", ["as posted", "cut"])
def test_every_captured_transaction_is_whole_and_everything_is_publishable(
    tmp_path: Path, capture: str, pieces: str
) -> None:
    snapshot, txs = json.loads((REAL / capture).read_text())
    v = land(tmp_path, [snapshot, *([txs] if pieces == "as posted" else cut(txs))])
    ends = ENDS[capture.split("_")[0]]
    assert v.whole == {tx for tx, _ in ends} and dict(v.held) == {}
    assert v.publishable == every_object(tmp_path) and len(v.publishable) > 4
    assert v.position == ends[-1][1]


@pytest.mark.parametrize("capture", CAPTURES)
def test_without_the_last_post_the_transaction_it_ends_is_held_with_its_objects(tmp_path: Path, capture: str) -> None:
    snapshot, txs = json.loads((REAL / capture).read_text())
    posts = cut(txs)
    assert [r.get("payload", r)["status"] for r in posts[-1]] == ["END"]  # the last mark's END alone
    v = land(tmp_path, [snapshot, *posts[:-1]])
    ends = ENDS[capture.split("_")[0]]
    last = ends[-1][0]
    assert v.whole == {tx for tx, _ in ends[:-1]}
    assert {tx: h.why for tx, h in v.held.items()} == {last: "open"}
    marks = {k.path for k in staging.LocalStaging(tmp_path).list("marks")}
    assert len(marks) == 1 and v.publishable == every_object(tmp_path) - marks
    assert v.position == ends[-2][1]


@pytest.mark.parametrize("capture", CAPTURES)
def test_without_the_first_cut_the_first_transaction_lacks_events_and_says_which(tmp_path: Path, capture: str) -> None:
    snapshot, txs = json.loads((REAL / capture).read_text())
    posts = cut(txs)  # the first: BEGIN, the order, its first line
    v = land(tmp_path, [snapshot, *posts[1:]])
    ends = ENDS[capture.split("_")[0]]
    first = ends[0][0]
    assert set(v.held) == {first} and v.held[first].why == "short"
    assert v.held[first].detail == "order_lines has 1 of 2 events; orders has 0 of 1 events"
    assert v.whole == {tx for tx, _ in ends[1:]}
    # Later transactions are published; the first, ended before them, is what the publish lacks.
    assert v.position == ends[-1][1] and v.behind == {first}
